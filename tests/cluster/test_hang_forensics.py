"""Hang forensics on the real local cluster: a 2-node FSDP job (local-cpu, gloo) where one rank stalls after a
step (COOKBOOK_HANG_INJECT) so the other waits in the next collective. The ranks' watch (cookbook_hang.py beside
the script) sees no step for K x the median step time, every rank dumps its stack and flight recorder, the job
ends at once instead of at its time limit, the runtime names the node at fault (with no recovery left here, and
nothing to resume, it ends the job: no requeue, no new job), and `cookbook diagnose RUN` names that rank, its host
(told apart here by srun's node label, not by the watch), the collective's sequence number and the stack. A known
HF_TOKEN is in no dump."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fsdp_job import fsdp_spec

from cookbook.cli import main
from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KNOWN_TOKEN = "hf_hangForensicsKnownValue4242"
STALL_RANK, STALL_STEP = 1, 4


def test_a_rank_that_never_enters_the_collective_is_named_with_its_host_seq_and_stack(
    slurm, tiny_assets, job_dir: Path, capsys
):
    spec = fsdp_spec(
        job_dir,
        tiny_assets,
        "hang-forensics-test",
        60,
        throttle=0.2,
        overrides={"checkpoint_freq": "1000", "keep_checkpoints": "0"},
        signal_seconds=None,
        env={
            "COOKBOOK_HANG_INJECT": f"{STALL_RANK}:{STALL_STEP}",
            "COOKBOOK_HANG_K": "3",
            "COOKBOOK_HANG_MIN_S": "3",
            "COOKBOOK_HANG_POLL_S": "0.5",
            "COOKBOOK_MAX_RETRIES": "0",
        },
    )
    script = write_job(spec, job_dir / "job.sbatch")
    assert (job_dir / "cookbook_runtime" / "hang.py").is_file()
    (job_dir / "logs").mkdir()
    token = job_dir / "hf-token"  # the ranks get it from the token file; Slurm is never given it (issue 40)
    token.write_text(KNOWN_TOKEN)
    client = SlurmClient({**slurm.env, "HF_TOKEN": KNOWN_TOKEN, "HF_TOKEN_PATH": str(token)})
    started = time.monotonic()
    job = client.submit(script, cwd=job_dir)
    log_path = job_dir / "logs" / f"hang-forensics-test-{job}.out"
    info = slurm.wait(job, timeout=300)
    log = read_output(log_path)
    elapsed = time.monotonic() - started
    assert info.state != "COMPLETED", log[-3000:]
    assert elapsed < 240, f"the hung job was not ended early ({elapsed:.0f} s)\n{log[-3000:]}"

    # the host of the stalled rank, from srun's node label ("1: [rank1]:...") and the job's node list
    nodelist = re.search(r"node\(s\) \[(.+?)\], rendezvous", log)
    assert nodelist, log[-3000:]
    hosts = slurm.run("scontrol", "show", "hostnames", nodelist.group(1)).stdout.split()
    label = re.search(rf"^(\d+): \[rank{STALL_RANK}\]:rank {STALL_RANK} first batch", log, re.M)
    assert label and int(label.group(1)) < len(hosts), f"{hosts}\n{log[-3000:]}"
    host = hosts[int(label.group(1))]

    assert f"cookbook: injected stall on rank {STALL_RANK} ({host}) after step {STALL_STEP}" in log
    assert re.search(r"cookbook: hang on rank \d \(\S+\): no step for \d+ s after step \d+", log), log[-3000:]
    verdict = re.search(
        rf"cookbook: hang: rank {STALL_RANK} on {host} never entered collective #(\d+) \((\S+), process group 0\) "
        rf"that rank\(s\) {1 - STALL_RANK} wait in",
        log,
    )
    assert verdict, log[-3000:]
    seq, op = int(verdict.group(1)), verdict.group(2)
    assert op.startswith("gloo:"), op
    # the runtime's recovery names that node; with no recovery left and no checkpoint, the job ends: no new job
    ended = (
        rf"cookbook: not recovering from {host} \(hang: rank {STALL_RANK} on {host} never entered .*ending job {job}"
    )
    assert re.search(ended, log), log[-3000:]
    assert "Submitted batch job" not in log, log[-3000:]

    # cookbook diagnose RUN (and the log as the target): the same verdict, with the stalled rank's stack
    run_dir = job_dir / "run"
    assert main(["diagnose", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert f"hang: rank {STALL_RANK} on {host} never entered collective #{seq} ({op}, process group 0)" in report
    stack = report.split(f"rank {STALL_RANK} ({host}) stack")[1]
    assert " in train\n" in stack + "\n" and "train.py" in stack, report
    assert main(["diagnose", str(log_path)]) == 0
    by_log = capsys.readouterr().out
    assert f"never entered collective #{seq}" in by_log, by_log

    # torch's own analyzer reads the dumps and agrees
    (folder,) = (run_dir / ".cookbook" / "hang").glob(f"{job}-*")
    fr = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "nccl_trace_rank_", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = fr.stdout + fr.stderr  # its findings go through logging (stderr)
    assert f"sequence number: {seq}" in said and f"missing ranks: {{{STALL_RANK}}}" in said, said

    # no secret in any dump, the report or the log
    for f in folder.iterdir():
        assert KNOWN_TOKEN.encode() not in f.read_bytes(), f
    assert KNOWN_TOKEN not in report + by_log + log
    print(f"hang test: {elapsed:.0f} s, rank {STALL_RANK} on {host}, collective #{seq} {op}")
