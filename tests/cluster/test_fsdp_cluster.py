"""fsdp_<model> local-cpu on the real local cluster: 2 nodes train, checkpoint, get requeued mid-run and
resume from the newest complete checkpoint with no step lost; the two ranks train on different data."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from cluster_wait import wait_for as _wait_for
from fsdp_job import fsdp_spec

from cookbook.render import write_job
from cookbook.slurm.client import read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BATCH = re.compile(
    r"Batch (\d+) Loss: ([\d.]+), Speed: [\d.]+ samples/sec, lr: [\d.]+, "
    r"tokens_per_second_per_gpu: [\d.]+, mfu: N/A"
)
FIRST = re.compile(r"rank (\d) first batch sha256 (\w+) at step (\d+)")
RESUMED = re.compile(r"Resumed from checkpoint \S*/step-(\d+) \(step (\d+)\)")


def _runs(log: str) -> list[str]:
    """The log split per start of train.py (the log is appended to across requeues)."""
    parts = re.split(r"(?=HF token: )", log)
    return [p for p in parts if "HF token: " in p]


def test_fsdp_two_nodes_requeued_mid_run_resumes_without_losing_a_step(slurm, tiny_assets, job_dir: Path):
    max_steps = 24
    spec = fsdp_spec(job_dir, tiny_assets, "fsdp-resume-test", max_steps, throttle=0.4,
                     overrides={"checkpoint_freq": "4", "keep_checkpoints": "0"})  # fmt: skip
    script = write_job(spec, job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    ckpts = job_dir / "run" / "checkpoints"
    started = time.monotonic()
    job = slurm.submit(script, cwd=job_dir)
    log_path = job_dir / "logs" / f"fsdp-resume-test-{job}.out"

    # kill it mid-run, once a checkpoint is complete (requeue: Slurm kills every rank, then restarts the job)
    def step8_or_ended() -> bool:
        if (ckpts / "step-8" / "COMPLETE").is_file():
            return True
        assert not slurm.state(job).done, read_output(log_path)[-3000:]
        return False

    _wait_for(step8_or_ended, 240, "checkpoint step-8")
    time.sleep(1.0)  # a step or two past the checkpoint: that work is lost and redone
    slurm.requeue(job)
    slurm.release_requeued(job)  # Slurm holds a requeued job back (BeginTime, ~2 min); skip the wait
    killed_at = max(int(p.parent.name[5:]) for p in ckpts.glob("step-*/COMPLETE"))
    info = slurm.wait(job, timeout=400)
    log = read_output(log_path)
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"

    runs = _runs(log)
    assert len(runs) == 2, log[-3000:]
    first, second = runs
    first_steps = {int(s): float(v) for s, v in BATCH.findall(first)}
    second_steps = {int(s): float(v) for s, v in BATCH.findall(second)}
    assert 8 <= max(first_steps) < max_steps, "the first run was not cut mid-run"
    resumed = RESUMED.search(second)
    assert resumed, second[-2000:]
    resume_step = int(resumed.group(1))
    assert resume_step >= killed_at >= 8
    # continues at checkpoint + 1, nothing missing, ends at max_steps
    assert min(second_steps) == resume_step + 1
    assert sorted(second_steps) == list(range(resume_step + 1, max_steps + 1))
    assert set(range(1, max_steps + 1)) <= set(first_steps) | set(second_steps)
    assert set(range(1, resume_step + 1)) <= set(first_steps)
    losses = {**first_steps, **second_steps}
    early, late = [losses[s] for s in range(1, 5)], [losses[s] for s in range(max_steps - 3, max_steps + 1)]
    assert sum(late) / 4 < sum(early) / 4, losses  # it learns, across the requeue
    # exact resume: steps trained twice (after the checkpoint, before the kill) give the same loss
    for step in set(first_steps) & set(second_steps):
        assert first_steps[step] == pytest.approx(second_steps[step], abs=1e-4), step
    # each rank trains on its own data, in both runs
    for run, step in ((first, 1), (second, resume_step + 1)):
        firsts = {int(r): (h, int(s)) for r, h, s in FIRST.findall(run)}
        assert set(firsts) == {0, 1}, run[-2000:]
        assert firsts[0][0] != firsts[1][0]
        assert firsts[0][1] == firsts[1][1] == step
    assert (ckpts / f"step-{max_steps}" / "COMPLETE").is_file()
    assert not list(ckpts.glob(".step-*"))
    print(f"fsdp requeue test: {time.monotonic() - started:.0f} s, resumed from step-{resume_step}")


SAVED = re.compile(r"cookbook: saved at step (\d+) for preemption: (\S+)")


def _fsdp_job(slurm, tiny_assets, folder: Path, name: str, max_steps: int) -> tuple[str, Path]:
    """A 2-node FSDP job whose periodic checkpoints are off (interval longer than the run)."""
    spec = fsdp_spec(folder, tiny_assets, name, max_steps, throttle=0.5, overrides={"checkpoint_freq": "1000"},
                     signal_seconds=None)  # fmt: skip
    script = write_job(spec, folder / "job.sbatch")
    (folder / "logs").mkdir(parents=True)
    job = slurm.submit(script, cwd=folder)
    return job, folder / "logs" / f"{name}-{job}.out"


def test_fsdp_saves_on_usr1_at_the_step_boundary_and_resumes_there(slurm, tiny_assets, job_dir: Path):
    """USR1 mid-run, both ways Slurm sends it: to the batch shell (`--batch`, what --signal=B:USR1@N does)
    and to the job's steps (plain `scancel --signal=USR1`, which must not kill torchrun). Every rank saves
    at the next step boundary, the job requeues, and resumes at that step: nothing redone, and the final
    loss is the uninterrupted run's."""
    max_steps = 10
    jobs = {
        key: _fsdp_job(slurm, tiny_assets, job_dir / key, f"fsdp-stop-{key}", max_steps)
        for key in ("baseline", "batch", "steps")
    }
    how = {"batch": ("--batch",), "steps": ()}
    signalled: set[str] = set()

    def send_when_mid_run() -> bool:
        for key, extra in how.items():
            job, log = jobs[key]
            if key not in signalled and log.is_file() and re.search(r"Batch 3 Loss", log.read_text()):
                slurm.run("scancel", "--signal=USR1", *extra, job)
                signalled.add(key)
            assert not slurm.state(job).done, read_output(log)[-3000:]
        return len(signalled) == len(how)

    _wait_for(send_when_mid_run, 300, "step 3 of the signalled jobs")
    for key in how:
        slurm.release_requeued(jobs[key][0])
    logs = {}
    for key, (job, log) in jobs.items():
        info = slurm.wait(job, timeout=400)
        logs[key] = read_output(log)
        assert info.state == "COMPLETED", f"{key}: {info}\n{logs[key][-3000:]}"

    reference = {int(s): float(v) for s, v in BATCH.findall(logs["baseline"])}
    assert sorted(reference) == list(range(1, max_steps + 1))
    redone = {}
    for key in how:
        runs = _runs(logs[key])
        assert len(runs) == 2, f"{key}: {logs[key][-3000:]}"
        first, second = runs
        saved = SAVED.search(first)
        assert saved, f"{key}: no stop-save\n{first[-3000:]}"
        step = int(saved.group(1))
        assert Path(saved.group(2)).name == f"step-{step}" and 3 <= step < max_steps
        assert f"cookbook: requeueing job {jobs[key][0]}" in first
        assert ("cookbook: got USR1" in first) == (key == "batch")  # plain scancel: only the steps see it
        assert "User defined signal" not in first and "SignalException" not in first, "the launcher died of USR1"
        first_steps = {int(s) for s, _ in BATCH.findall(first)}
        second_steps = {int(s): float(v) for s, v in BATCH.findall(second)}
        assert max(first_steps) == step, "the ranks stopped at the step they saved"
        assert RESUMED.search(second) and int(RESUMED.search(second).group(1)) == step
        assert sorted(second_steps) == list(range(step + 1, max_steps + 1))
        redone[key] = len(first_steps & set(second_steps))
        assert redone[key] <= 1
        assert second_steps[max_steps] == pytest.approx(reference[max_steps], abs=1e-4)
    print(f"fsdp save on USR1: saved and resumed, steps redone {redone}")
