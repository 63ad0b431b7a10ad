"""`cookbook watch JOBID` against the real local Slurm cluster: live steps, the final state, the diagnosis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

COOKBOOK = [sys.executable, "-c", "import sys; from cookbook.cli import main; sys.exit(main())"]
# Real torchtitan step lines (ANSI colours, thousands separators), as rank 0 prints them under torchrun.
STEP = (
    r"[rank0]:[titan] 2026-11-22 22:19:0%d,470 - root - INFO - \033[31mstep: %2d  \033[32mloss: %s  "
    r"\033[38;2;180;60;0mgrad_norm:  1.4093  \033[38;2;54;234;195mmemory:  0.70GiB(2.97%%)  "
    r"\033[34mtps: 1,549  \033[36mtflops: 0.00  \033[35mmfu: 0.00%%\033[39m\n"
)
LOSSES = ["7.98863", "7.74540", "7.13840", "6.18503", "5.42659", "5.06574"]

OOM_LINE = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.11 GiB of which 1.25 GiB is free."
)


def _job(job_dir: Path, name: str, body: str) -> Path:
    script = job_dir / f"{name}.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={job_dir}/%j.out\n#SBATCH --time=2\n{textwrap.dedent(body)}")
    return script


def _watch(slurm, job: str, timeout: float = 120) -> tuple[int, list[tuple[float, str]]]:
    """Run `cookbook watch JOB` as users do; return its exit code and (seconds since start, line) pairs."""
    env = {**os.environ, **slurm.env}
    proc = subprocess.Popen(
        [*COOKBOOK, "watch", job, "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    return rc, lines


def _step_rows(lines: list[tuple[float, str]]) -> dict[int, tuple[float, str]]:
    """Table rows printed by watch: step -> (when, row)."""
    rows = {}
    for when, line in lines:
        m = re.match(r"\s*(\d+)\s+train\s+(\S+)", line)
        if m:
            rows.setdefault(int(m[1]), (when, m[2]))
    return rows


def test_watch_shows_steps_live_and_reports_completed(slurm, job_dir):
    prints = "".join(f"printf '%b' '{STEP % (i, i + 1, loss)}'; sleep 1.5\n" for i, loss in enumerate(LOSSES))
    job = slurm.submit(_job(job_dir, "steps", "echo NCCL INFO noise\n" + prints + "echo done\n"))
    rc, lines = _watch(slurm, job)
    text = "\n".join(line for _, line in lines)
    assert rc == 0, text
    rows = _step_rows(lines)
    assert sorted(rows) == [1, 2, 3, 4, 5, 6], text
    assert [float(rows[s][1]) for s in sorted(rows)] == [float(x) for x in LOSSES]
    ended = next(when for when, line in lines if f"job {job} ended" in line)
    assert f"job {job} ended COMPLETED" in text and "6 steps logged" in text
    # live: the first step was on screen while the job still had ~7 s of steps to print
    assert ended - rows[1][0] > 4, lines
    assert rows[1][0] < rows[6][0]


def test_watch_of_a_failed_job_exits_nonzero_with_the_diagnosis(slurm, job_dir):
    job = slurm.submit(
        _job(
            job_dir,
            "oom",
            f"""\
        printf '%b' '{STEP % (1, 1, LOSSES[0])}'
        sleep 1
        echo '{OOM_LINE}'
        exit 1
        """,
        )
    )
    rc, lines = _watch(slurm, job)
    text = "\n".join(line for _, line in lines)
    assert rc != 0, text
    assert f"job {job} ended FAILED" in text and "1 steps logged" in text
    assert "cuda_oom" in text and "batch size" in text, text
    assert 1 in _step_rows(lines)
