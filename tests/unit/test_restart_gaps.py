"""Step times never span a restart (issue #32): a requeued job appends its second start to the same log,
and the time between the two starts (the requeue's queue wait, the next start-up) is no step.

The logs are built from real lines: the runtime's (``cookbook_runtime.run``: ``job N: ... node(s) [...]``,
``cookbook: launching ...``, the stop protocol's ``got USR1`` / ``saved at step``, ``resuming from``) and
torchtitan 0.3.0's (the step line of ``tests/fixtures/logs/make_derived.py``, checkpoint loading, "Training
starts"), ``[rankN]:`` as torchrun prefixes them; the timings are generated: steps of ~1 s and 171 s from
the last step of the first start to the first of the second, as `cookbook explain 166` saw.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cookbook.analysis.explain import check_stalls, explain_log
from cookbook.analysis.goodput import Attempt, goodput_ledger, log_segments
from cookbook.analysis.starts import parse_starts, split_starts
from cookbook.analysis.stragglers import rank_step_times, straggler_lines, stragglers

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
JOB = "166"
RUN = "/tmp/rg/runs/rg"
STEP = (
    "[rank{rank}]:[titan] {ts} - root - INFO - \x1b[31mstep: {step:2d}  \x1b[32mloss: {loss:8.5f}  "
    "\x1b[38;2;180;60;0mgrad_norm:  1.4093  \x1b[38;2;54;234;195mmemory:  0.70GiB(2.97%)  \x1b[34mtps: {tps:,}  "
    "\x1b[36mtflops: 0.00  \x1b[35mmfu: 0.00%\x1b[39m"
)
TITAN = "[rank{rank}]:[titan] {ts} - root - INFO - {msg}"
T0 = datetime(2026, 11, 24, 10, 0, 0)
GAP_S = 171.0  # last step of the first start -> first step of the second
QUEUE_S = 140.0  # of which the job waited in the queue (the rest: the second start's start-up)


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{t.microsecond // 1000:03d}"


def _start(
    t: datetime,
    steps: range,
    resume_from: int | None,
    stall: dict[int, float],
    late: float,
    saves: dict[int, float] | None = None,
) -> tuple[list[str], datetime]:
    """One start of the batch script as the runtime and torchtitan print it, with a periodic checkpoint save
    of ``saves[step]`` seconds after those steps (torchtitan 0.3.0's lines); returns its lines and the time of
    its last step line."""
    saves = saves or {}
    lines = ["HF token: absent", f"job {JOB}: 2 node(s) [n[1-2]], rendezvous 10.77.0.1:29500, run dir {RUN}"]
    if resume_from is not None:
        lines.append(f"resuming from {RUN}/checkpoint/step-{resume_from}")
    lines.append("cookbook: launching torchrun on 2 node(s), 1 process(es) each")
    for rank in range(2):
        lines.append(TITAN.format(rank=rank, ts=_ts(t), msg="torchtitan version: 0.3.0"))
    if resume_from is not None:
        for rank in range(2):
            lines.append(
                TITAN.format(
                    rank=rank, ts=_ts(t), msg=f"Loading the checkpoint from {RUN}/checkpoint/step-{resume_from}."
                )
            )
            lines.append(TITAN.format(rank=rank, ts=_ts(t), msg="Finished loading the checkpoint in 0.55 seconds."))
    for rank in range(2):
        lines.append(TITAN.format(rank=rank, ts=_ts(t), msg=f"Training starts at step {steps.start}"))
    for step in steps:
        dt = stall.get(step, 1.0 + 0.02 * (step % 3))
        t += timedelta(seconds=dt)
        for rank in range(2):
            lag = timedelta(seconds=late if rank == 1 else 0.0)
            lines.append(STEP.format(rank=rank, ts=_ts(t + lag), step=step, loss=8.0 - 0.1 * step, tps=int(8192 / dt)))
        if step in saves:
            for rank in range(2):
                lines.append(TITAN.format(rank=rank, ts=_ts(t), msg="Saving the checkpoint."))
            t += timedelta(seconds=saves[step])
            for rank in range(2):
                msg = f"Finished saving the checkpoint in {saves[step]:.2f} seconds."
                lines.append(TITAN.format(rank=rank, ts=_ts(t), msg=msg))
    return lines, t


def _log(
    tmp_path: Path, stall: dict[int, float] | None = None, late: float = 0.003, resume_from: int = 5
) -> tuple[Path, list[Attempt]]:
    """Steps 1-5, USR1 (saved at step 5, or killed with ``resume_from`` < 5), requeued; resumed at
    ``resume_from + 1`` through step 10. Returns the log and the two starts as Slurm records them."""
    stall = stall or {}
    first, t5 = _start(T0 + timedelta(seconds=20), range(1, 6), None, stall, late)
    if resume_from == 5:
        first += [
            "cookbook: got USR1: every rank saves at its next step boundary",
            f"[rank0]:cookbook: saved at step 5 for preemption: {RUN}/checkpoint/step-5",
            f"cookbook: requeueing job {JOB} after the stop-save (cookbook: saved at step 5 for preemption: "
            f"{RUN}/checkpoint/step-5)",
        ]
    end1 = t5 + timedelta(seconds=2)
    # the second start's first step ends GAP_S after the first start's last: queue, start-up, one step
    second, t10 = _start(t5 + timedelta(seconds=GAP_S - 1.0), range(resume_from + 1, 11), resume_from, stall, late)
    log = tmp_path / f"rg-{JOB}.out"
    log.write_text("\n".join(first + second) + "\n")
    start2 = end1 + timedelta(seconds=QUEUE_S)
    attempts = [
        Attempt(T0, end1, "REQUEUED", 2, 0, T0),
        Attempt(start2, t10 + timedelta(seconds=3), "COMPLETED", 2, 0, T0),
    ]
    return log, attempts


def test_the_log_is_two_starts(tmp_path):
    log, _ = _log(tmp_path)
    text = log.read_text()
    assert [job for job, _ in split_starts(text)] == [JOB, JOB]
    assert "".join(part for _, part in split_starts(text)) == text
    df = parse_starts(log)
    assert list(df["start"]) == [0] * 5 + [1] * 5 and list(df["step"]) == list(range(1, 11))
    assert [len(seg.steps) for seg in log_segments(log)] == [5, 5]
    assert split_starts("no start line\n") == [(None, "no start line\n")]


def test_the_requeue_gap_is_no_dataloader_stall(tmp_path):
    log, _ = _log(tmp_path)
    report = explain_log(log)
    assert "dataloader_stall" not in report.causes, report.render()
    assert "straggler" not in report.causes, report.render()
    assert check_stalls(parse_starts(log)) == []


def test_a_stall_inside_a_start_is_still_found(tmp_path):
    log, _ = _log(tmp_path, stall={8: 5.0})
    report = explain_log(log)
    assert report.causes[0] == "dataloader_stall", report.render()
    finding = report.evidence[0].finding
    assert finding.startswith("1 of 6 steps") and "longest 5.00 s" in finding, finding


def test_no_step_time_or_arrival_lag_spans_the_restart(tmp_path):
    # killed after step 5 with a checkpoint at step 3: the second start redoes steps 4 and 5
    log, _ = _log(tmp_path, resume_from=3)
    times = rank_step_times(parse_starts(log, ranks="all"))
    assert len(times) == 2 * (5 + 7)
    assert times["step_s"].max() < 2 and times["lag_s"].max() < 0.1, times
    assert stragglers(parse_starts(log, ranks="all")) == []
    assert straggler_lines(str(log)) == []


def test_a_late_rank_is_still_named_across_both_starts(tmp_path):
    log, _ = _log(tmp_path, late=0.7, resume_from=3)
    [found] = stragglers(parse_starts(log, ranks="all"), ["n1", "n2"], 1)
    assert found.rank == 1 and found.host == "n2" and found.slow_share == 1.0
    assert found.steps_compared == 4 + 6  # the first step of each start is its start-up
    assert found.median_lag_s == pytest.approx(0.7)


def test_the_ledger_puts_the_gap_in_the_queue_and_the_start_up(tmp_path):
    log, attempts = _log(tmp_path)
    ledger = goodput_ledger(log, attempts)
    assert ledger.queue_s == pytest.approx(QUEUE_S)  # between the two starts (the first started at once)
    assert ledger.steps_done == 10 and ledger.steps_redone == 0
    steps_s = ledger.parts_s["productive"] + ledger.parts_s["redone"]
    assert steps_s < 12, ledger.render()  # ten steps of ~1 s: the gap is no step
    # the gap less step 6 itself: the first start's end after its last step, the queue, the second's preflight
    preflight_2 = ledger.parts_s["preflight"] - 20  # the first start's: 20 s to its first log line
    assert ledger.parts_s["lost"] + ledger.queue_s + preflight_2 == pytest.approx(GAP_S - 1.0)
    assert sum(ledger.parts_s.values()) == pytest.approx(sum(a.seconds for a in attempts))


def test_a_real_local_requeue_has_no_stall_from_its_gap():
    # the local cluster's requeued torchtitan run (tests/fixtures/logs/README.md): steps 1-4, then 4-6
    log = LOGS / "torchtitan_requeued_local.log"
    df = parse_starts(log)
    assert list(df["step"]) == [1, 2, 3, 4, 4, 5, 6] and list(df["start"]) == [0] * 4 + [1] * 3
    assert "dataloader_stall" not in explain_log(log).causes  # without the split: "longest 31.60 s"


def test_the_start_line_is_the_one_the_runtime_writes(tmp_path):
    """The analysis reads the runtime's own line (``cookbook_runtime.files.START``): the batch step, run against
    a fake Slurm, writes one that matches, with its job id and node count."""
    from batch_step import FakeSlurm, runtime_argv

    from cookbook.render import render_job
    from cookbook.spec import make_spec
    from cookbook_runtime.files import START

    argv = runtime_argv(render_job(make_spec("llama3_3_70b_lora", profile="generic")).script)
    ran = FakeSlurm(tmp_path).run_step(argv, COOKBOOK_PREFLIGHT="0", SLURM_GPUS_ON_NODE="8")
    found = START.search(ran.out)
    assert found and found.groups() == ("41", "2", "n1,n2"), ran.out


def _one_start(tmp_path: Path, stall: dict[int, float], saves: dict[int, float]) -> Path:
    lines, _ = _start(T0, range(1, 11), None, stall, 0.003, saves)
    log = tmp_path / f"save-{JOB}.out"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_a_step_that_holds_a_checkpoint_save_is_no_stall(tmp_path):
    # a 3 s save after step 5 on ~1 s steps: step 6's time is mostly the save, which goodput counts as checkpointing
    log = _one_start(tmp_path, stall={}, saves={5: 3.0})
    df = parse_starts(log)
    assert check_stalls(df) != [], "without the saves, step 6 looks like a stall"
    report = explain_log(log)
    assert "dataloader_stall" not in report.causes, report.render()


def test_a_stall_beside_a_checkpoint_save_is_still_found(tmp_path):
    log = _one_start(tmp_path, stall={8: 5.0}, saves={5: 3.0})
    report = explain_log(log)
    assert report.causes[0] == "dataloader_stall", report.render()
    finding = report.evidence[0].finding
    assert finding.startswith("1 of 7 steps") and "longest 5.00 s" in finding, finding
