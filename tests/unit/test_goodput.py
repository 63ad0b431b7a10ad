"""Goodput ledger on a real local-cluster log (no Slurm needed: the accounting text is given)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
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


# ---------------------------------------------------------------- recovery inside the allocation (issue #40)
T0 = datetime(2026, 1, 1, 0, 0, 0)


def _at(seconds: float) -> str:
    t = T0 + timedelta(seconds=seconds)
    return f"[titan] {t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d} - root - INFO - "


def _step(seconds: float, step: int, loss: float) -> str:
    return _at(seconds) + f"step: {step:2d}  loss: {loss:8.5f}  grad_norm:  1.0000  memory:  0.70GiB(3.00%)  tps: 100"


def _recovered_run(tmp_path: Path) -> tuple[Path, Path, list[Attempt]]:
    """A 2-node job with 1 spare (3 nodes allocated, 50 s): steps 1-4 every 2 s, n2's ranks SIGKILLed at 20.5 s,
    the step ended at 23 s, the spare decided at 24 s, the relaunch resumes from step 3's checkpoint: step 4
    again at 42 s, then 5 and 6; the job completes at 50 s."""
    from cookbook_runtime.decide import Incident

    log = tmp_path / "spare-7.out"
    log.write_text(
        "\n".join(
            [
                "job 7: 2 node(s) [n1,n2], rendezvous 10.0.0.1:29500, run dir /r, spare(s) [n3]",
                _at(5) + "Starting job: llama3",
                _at(10) + "Training starts at step 1",
                *(_step(10 + 2 * s, s, 9.0 - s) for s in range(1, 5)),
                "cookbook: recovery: n2 (its ranks died of SIGKILL) replaced by spare n3 in job 7 (1 of 2 left)",
                "cookbook: relaunching on n1,n3 from the newest checkpoint (4 s after the fault)",
                "job 7: 2 node(s) [n1,n3], rendezvous 10.0.0.1:29501, run dir /r, spare(s) []",
                _at(30) + "Starting job: llama3",
                _at(40) + "Training starts at step 4",
                *(_step(42 + 2 * (s - 4), s, 9.0 - s) for s in range(4, 7)),
            ]
        )
        + "\n"
    )
    run_dir = tmp_path / "runs"
    (run_dir / ".cookbook").mkdir(parents=True)
    epoch = [(T0 + timedelta(seconds=x)).timestamp() for x in (24, 20.5, 23)]
    incident = Incident(epoch[0], "7", ("n2",), "its ranks died of SIGKILL", "spare", epoch[1], epoch[2], ("n3",))
    (run_dir / ".cookbook" / "recoveries.tsv").write_text(incident.row() + "\n")
    return log, run_dir, [Attempt(T0, T0 + timedelta(seconds=50), "COMPLETED", 3, 0, T0)]


def test_each_recovery_is_a_line_with_its_parts_and_the_spare_a_row(tmp_path):
    from cookbook.analysis.goodput import read_incidents

    log, run_dir, attempts = _recovered_run(tmp_path)
    incidents = read_incidents(run_dir, "7")
    assert len(incidents) == 1 and read_incidents(run_dir, "8") == [] and read_incidents(tmp_path / "none") == []
    ledger = goodput_ledger(log, attempts, incidents=incidents)
    (cost,) = ledger.incidents
    assert (cost.detection_s, cost.decide_s, cost.relaunch_s) == pytest.approx((2.5, 1.0, 18.0))
    assert cost.to_first_step_s == pytest.approx(21.5) and cost.redone == (4,)
    assert cost.spare_unit_s == pytest.approx(24.0)  # n3 stood by from the allocation's start to the decision
    # one Slurm start, two launches: cut at the decision; 2 nodes train, the third stands by throughout
    assert not ledger.notes[:-1] and ledger.steps_done == 6 and ledger.redone_steps == [4]
    want = {"preflight": 5 + 6, "startup": 5 + 10, "productive": 8 + 4, "redone": 2, "lost": 6, "shutdown": 4}
    assert {k: v for k, v in ledger.parts_s.items() if k != "spare"} == pytest.approx(want)
    assert ledger.parts_s["spare"] == pytest.approx(50) and ledger.parts_unit_s["spare"] == pytest.approx(50)
    assert sum(ledger.parts_unit_s.values()) == pytest.approx(150)  # 3 nodes x 50 s
    assert ledger.parts_unit_s["productive"] == pytest.approx(2 * 12) and ledger.goodput == pytest.approx(24 / 150)
    table = ledger.table()
    assert table.set_index("part").loc["spare", "node_hours"] == pytest.approx(50 / 3600)
    text = ledger.render()
    assert "recoveries (1):" in text and "n2 (its ranks died of SIGKILL) -> spare n3 swapped in" in text
    assert "22 s to the first new step (detection 2 s, stop/decide 1 s, relaunch + restore 18 s)" in text
    assert "1 step(s) redone (4)" in text and "stood by 0.00667 node-hours" in text
    rows = ledger.recoveries_table()
    assert list(rows["action"]) == ["spare"] and rows["steps_redone"].tolist() == [1]
    # without the recoveries: the old matching, in order, and a note saying so
    plain = goodput_ledger(log, attempts)
    assert not plain.incidents and any("matched in order" in n for n in plain.notes)


def test_a_recovery_in_an_untimed_log_keeps_its_row_times_and_the_redone_steps(tmp_path):
    from cookbook.analysis.goodput import incident_costs, read_incidents

    log, run_dir, attempts = _recovered_run(tmp_path)
    untimed = tmp_path / "untimed.out"
    untimed.write_text(re.sub(r"\[titan\] \S+ \S+ - root - INFO - ", "", log.read_text()))
    (cost,) = incident_costs(read_incidents(run_dir), log_segments(untimed), attempts)
    assert cost.relaunch_s is None and cost.to_first_step_s is None and cost.redone == (4,)
    assert cost.detection_s == pytest.approx(2.5) and "? to the first new step" in cost.line("node")


def test_goodput_and_explain_read_the_run_folders_recoveries(tmp_path, capsys, monkeypatch):
    import cookbook.analysis.goodput as goodput
    from cookbook.analysis.explain import check_recoveries
    from cookbook.analysis.goodput import read_incidents
    from cookbook.slurm.record import JobRecord

    log, run_dir, attempts = _recovered_run(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=3\n")
    JobRecord("7", script, log, run_dir, "llama3_8b_c4", "local-cpu", "spare").save()
    monkeypatch.setattr(goodput, "slurm_attempts", lambda client, job_id: attempts)
    assert cli_main(["goodput", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "recoveries (1):" in out and re.search(r"^\s+spare\s+50\.0", out, re.M)
    (fault,) = check_recoveries(log, read_incidents(run_dir))
    assert fault.fault and fault.kind == "node_fault" and "spare n3 swapped in" in fault.finding
    assert "stood by" not in fault.finding, "without Slurm's starts the standing-by time is unknown, not shown"
    (fault,) = check_recoveries(log, read_incidents(run_dir), attempts)
    assert "the spare(s) stood by" in fault.finding
    # `cookbook explain` asks Slurm for the starts, as `goodput` does
    import cookbook.analysis.explain as explain

    seen = {}
    real = explain.check_recoveries
    monkeypatch.setattr(
        explain, "check_recoveries", lambda lg, inc, att=(): seen.setdefault("att", att) and real(lg, inc, att)
    )
    cli_main(["explain", str(tmp_path)])
    assert seen.get("att") == attempts


def test_the_ledger_shows_each_starts_gate_whole_or_own_checks_only(tmp_path):
    """Issue #41 item 5: a restart on nodes that passed the whole gate in this job runs their own checks only;
    the ledger shows each start's gate seconds and which it was (the batch step against the fake Slurm)."""
    from batch_step import FakeSlurm

    from cookbook.analysis.goodput import Ledger

    fake = FakeSlurm(tmp_path)
    argv = ["--nproc-per-node=1", "--gate", "--", "torchrun", "-m", "train"]
    first = fake.run_step(argv, FAKE_GATE="ok")
    again = fake.run_step(argv, FAKE_GATE="ok", SLURM_RESTART_COUNT="1")
    log = tmp_path / "job.out"
    log.write_text(first.out + again.out)
    gates = [(s.gate_s, s.gate_local) for s in log_segments(log) if s.gate_s is not None]
    assert [local for _, local in gates] == [False, True], first.out + again.out
    ledger = Ledger({}, {}, 0.0, [], 0, 0, [], gates=gates)
    assert re.search(r"pre-flight gate per start: \d+ s \(full\), \d+ s \(own checks only\)", ledger.render())


def test_explain_has_a_fix_for_every_recovery_action_the_runtime_records():
    """Each action ``decide.recovery`` can record gets its own advice in ``explain``, not the fallback."""
    import inspect

    from cookbook.analysis import explain
    from cookbook_runtime import decide

    actions = set(re.findall(r'Recovery\("([\w-]+)"', inspect.getsource(decide.recovery)))
    assert {"spare", "requeue-excluding", "requeue-later"} <= actions, actions
    source = inspect.getsource(explain.check_recoveries)
    for action in actions - {"train-on", "train-on-gate", "stop", "requeue"}:
        assert f'"{action}":' in source, action
