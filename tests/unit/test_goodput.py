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


def test_price_comes_from_the_profile_and_the_gpu_table():
    from cookbook.gpus import LIST_PRICE_PER_GPU_HOUR
    from cookbook.spec import profiles

    assert price_per_gpu_hour(None, profile="nebius") == LIST_PRICE_PER_GPU_HOUR[profiles()["nebius"].gpu]
    assert price_per_gpu_hour("h200", profile="aws-efa") == LIST_PRICE_PER_GPU_HOUR["h200"]  # --gpu names the kind
    assert price_per_gpu_hour("NVIDIA H100 80GB HBM3") == LIST_PRICE_PER_GPU_HOUR["h100"]
    assert price_per_gpu_hour(None, profile="generic") == 0.0  # no GPU kind: no price
    assert price_per_gpu_hour("h100", profile="local-cpu") == 0.0  # the profile's own price wins
    assert price_per_gpu_hour(None, 4.5, profile="nebius") == 4.5  # --price-per-gpu-hour wins
    gpu = [Attempt(datetime(2026, 1, 1), datetime(2026, 1, 1, 1), "COMPLETED", 1, 8)]
    assert goodput_ledger(LOGS / "seed_torchtune_tqdm.log", gpu, profile="crusoe").cost == pytest.approx(8 * 3.0)
    unpriced = goodput_ledger(LOGS / "seed_torchtune_tqdm.log", gpu, profile="generic")
    assert unpriced.cost == 0 and any("--price-per-gpu-hour" in n for n in unpriced.notes)


def _run_folder(tmp_path: Path, profile: str, recipe: str = "llama3_8b_c4") -> Path:
    """A run folder as `submit` leaves it (job.json + job.sbatch), for the fixture log."""
    from cookbook.slurm.record import JobRecord

    folder = tmp_path / f"run-{profile}"
    folder.mkdir()
    script = folder / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=8\n")
    JobRecord("80", script, LOG, folder / "runs", recipe, profile, "gp").save()
    return folder


def test_planner_forecast_for_a_real_shape():
    from cookbook.analysis.goodput import planned_step_seconds

    step = planned_step_seconds("llama3_8b_c4", 1, 8, "h100")
    assert step is not None and 0.1 < step < 60
    assert planned_step_seconds("llama3_8b_c4", 1, 8, None) is None
    assert planned_step_seconds("no_such_recipe", 1, 8, "h100") is None


def test_cli_defaults_to_the_profile_price_and_prints_the_forecast(tmp_path, capsys, monkeypatch, attempts):
    import cookbook.analysis.goodput as goodput
    from cookbook.analysis.goodput import planned_step_seconds

    gpu_attempts = [Attempt(a.start, a.end, a.state, a.nodes, 8, a.submit) for a in attempts]
    monkeypatch.setattr(goodput, "slurm_attempts", lambda client, job_id: gpu_attempts)
    folder = _run_folder(tmp_path, "nebius")
    assert resolve_run(str(folder)).profile == "nebius"
    assert cli_main(["goodput", str(folder), "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    forecast = planned_step_seconds("llama3_8b_c4", 1, 8, "h100") * len(
        {s for g in log_segments(LOG) for s, _ in g.steps}
    )
    assert f"planner forecast for these steps: {forecast:.0f} s productive" in out
    assert "(at 3 per GPU-hour)" in out  # nebius: H100 at its list price
    # the profile's GPU kind alone gives the forecast too; the price can be overridden
    assert cli_main(["goodput", str(folder), "--price-per-gpu-hour", "2.5"]) == 0
    out = capsys.readouterr().out
    assert "planner forecast" in out and "(at 2.5 per GPU-hour)" in out
    # a local-cpu run: no GPU kind, no forecast, costs nothing
    local = _run_folder(tmp_path, "local-cpu")
    monkeypatch.setattr(goodput, "slurm_attempts", lambda client, job_id: attempts)
    assert cli_main(["goodput", str(local)]) == 0
    out = capsys.readouterr().out
    assert "planner forecast" not in out and "cost 0.00 (at 0 per node-hour)" in out


def test_a_requeue_of_a_finished_job_is_no_start():
    """`scontrol requeue` of a FAILED job writes a PENDING record with 0 nodes to the job-completion log
    (seen on Debian's Slurm 22.05): not a start. (A running job requeued leaves PENDING with its nodes: a start.)"""
    text = (
        "1004|FAILED|2026-11-25T04:07:36|2026-11-25T04:07:42|2026-11-25T04:08:05|2|\n"
        "1004|PENDING|2026-11-25T04:07:36|2026-11-25T04:07:42|2026-11-25T04:08:08|0|\n"
        "1004|COMPLETED|2026-11-25T04:08:14|2026-11-25T04:08:14|2026-11-25T04:08:36|2|\n"
    )
    assert [a.state for a in parse_accounting(text, "1004")] == ["FAILED", "COMPLETED"]
