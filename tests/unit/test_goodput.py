"""Goodput ledger on a real local-cluster log (no Slurm needed: the accounting text is given)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from cookbook.analysis.goodput import (
    ALLOCATED_PARTS,
    Attempt,
    goodput_ledger,
    log_segments,
    parse_accounting,
    price_per_gpu_hour,
    resolve_run,
)
from cookbook.cli import main as cli_main

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
LOG = LOGS / "torchtitan_requeued_local.log"
# `sacct -c -D -P -n -o JobID,State,Submit,Start,End,NNodes,AllocTRES` for that job (jobcomp/filetxt)
ACCOUNTING = LOGS / "torchtitan_requeued_local.sacct"


@pytest.fixture(scope="module")
def attempts():
    text = ACCOUNTING.read_text()
    return parse_accounting(text, text.split("|")[0])


def test_accounting_gives_one_attempt_per_start(attempts):
    assert len(attempts) == 2
    assert attempts[0].state != "COMPLETED" and attempts[1].state == "COMPLETED"
    assert attempts[0].end <= attempts[1].start and attempts[0].nodes == 2 and attempts[0].gpus == 0
    gpu = parse_accounting(
        "7|COMPLETED|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T01:01:00|2|"
        "billing=16,cpu=32,gres/gpu=16,node=2",
        "7",
    )[0]
    assert gpu.gpus == 16 and gpu.units == 16 and gpu.seconds == 3600


def test_log_segments_follow_the_script_starts():
    segments = log_segments(LOG)
    assert len(segments) == 2
    first, second = ([s for s, _ in seg.steps] for seg in segments)
    assert first[0] == 1 and second[0] == min(second) and min(second) <= max(first)
    assert segments[1].restore_s > 0 and segments[0].saves and all(t for _, t in segments[1].steps)


def test_parts_add_up_and_redone_is_the_repeated_steps(attempts):
    ledger = goodput_ledger(LOG, attempts, price=2.0)
    assert sum(ledger.parts_unit_s.values()) == pytest.approx(sum(a.seconds * a.units for a in attempts))
    first, second = ({s for s, _ in seg.steps} for seg in log_segments(LOG))
    assert ledger.redone_steps == sorted(first & second) and ledger.steps_redone >= 1
    assert ledger.steps_done == len(first | second)
    assert ledger.parts_s["redone"] > 0 and ledger.parts_s["productive"] > ledger.parts_s["redone"]
    assert 0 < ledger.goodput < 1
    assert ledger.cost == pytest.approx(ledger.allocated_unit_hours * 2.0)
    table = ledger.table()
    assert list(table["part"])[0] == "queue" and set(table["part"]) <= {"queue", *ALLOCATED_PARTS}
    assert table["share_pct"].dropna().sum() == pytest.approx(100, abs=0.5)
    fig = ledger.plot()
    assert fig.axes and "goodput" in fig.axes[0].get_title()


def test_a_log_without_timestamps_is_counted_not_split():
    log = LOGS / "seed_torchtune_tqdm.log"
    att = [Attempt(datetime(2026, 1, 1, 0, 0, 0), datetime(2026, 1, 1, 0, 10, 0), "COMPLETED", 2, 16)]
    ledger = goodput_ledger(log, att)
    assert ledger.parts_s == {"productive": 0.0, "redone": 0.0, "untimed": 600.0}
    assert ledger.goodput == 0 and ledger.unit == "GPU"


def test_forecast_and_prices():
    assert price_per_gpu_hour("H100") > price_per_gpu_hour("a100-80") > 0
    assert price_per_gpu_hour("h100", 1.25) == 1.25 and price_per_gpu_hour("cpu") == 0.0
    att = parse_accounting(ACCOUNTING.read_text(), ACCOUNTING.read_text().split("|")[0])
    ledger = goodput_ledger(LOG, att, forecast_step_s=2.0)
    assert ledger.forecast_productive_s == 2.0 * ledger.steps_done
    assert "planner forecast" in ledger.render()


def test_resolve_run_and_cli_errors(tmp_path, capsys):
    ref = resolve_run(str(LOG))
    assert ref.log == LOG
    log = tmp_path / "gp-123.out"
    log.write_text("x\n")
    assert resolve_run(str(log)).job_id == "123"
    assert cli_main(["goodput", str(tmp_path / "nope")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert cli_main(["goodput", str(log), "--price-per-gpu-hour", "-1"]) == 2
    assert re.search(r">= 0", capsys.readouterr().err)
