"""Bad nodes on a private 3-node local cluster (`nodes3`), with a real 2-node FSDP job (local-cpu):

- the pre-flight gate fails on one node (injected on that node only): the log names the node and the reason,
  the job excludes it (Slurm refuses ExcNodeList for a running job, so by resubmission with --exclude) and
  completes on the other two; the failing node ran no training step;
- a node dies mid-run (its slurmd killed, the node set DOWN: Slurm ends the run NODE_FAIL and requeues it):
  the requeued run starts without it, says so, and completes;
- with no retry left (COOKBOOK_MAX_RETRIES=0) the job says so and ends without resubmitting.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from cluster_wait import wait_for as _wait_for
from fsdp_job import fsdp_spec as _spec

from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BATCH = re.compile(r"Batch (\d+) Loss")
RESUBMITTED = re.compile(r"by resubmission with --exclude=(\S+) .*: job (\d+) \(retry 1 of 2\)")


def test_preflight_failure_excludes_the_node_and_the_job_completes_on_the_other_two(
    nodes3_cluster, tiny_assets, job_dir: Path
):
    reason = "GPU 3 fell off the bus"
    env = {**nodes3_cluster.env(), "COOKBOOK_PREFLIGHT_INJECT": f"n1:{reason}"}
    slurm = SlurmClient(env)
    script = write_job(_spec(job_dir, tiny_assets, "preflight-test", 4, 0.0), job_dir / "job.sbatch")
    assert (job_dir / "cookbook_runtime" / "nodecheck.py").is_file()  # the runtime, in the job folder
    (job_dir / "logs").mkdir()
    first = slurm.submit(script, cwd=job_dir)
    info = slurm.wait(first, timeout=300)
    log = read_output(job_dir / "logs" / f"preflight-test-{first}.out")
    assert info.state == "FAILED", f"{info}\n{log[-3000:]}"
    assert f"cookbook: pre-flight failed on n1: {reason} (injected by COOKBOOK_PREFLIGHT_INJECT)" in log, log[-3000:]
    assert re.search(r"cookbook: pre-flight ok on n2 in [\d.]+ s: .*matmul_tflops", log), log[-3000:]
    moved = RESUBMITTED.search(log)
    assert moved and moved.group(1) == "n1", log[-3000:]
    assert "scontrol update ExcNodeList is refused for a running job" in log
    # the failing node ran no training step: this job launched no training at all
    assert "Training starts" not in log and not BATCH.search(log), log[-3000:]

    second = moved.group(2)
    info = slurm.wait(second, timeout=400)
    log2 = read_output(job_dir / "logs" / f"preflight-test-{second}.out")
    assert info.state == "COMPLETED", f"{info}\n{log2[-3000:]}"
    nodes = slurm.hostnames(slurm.show_job(second)["NodeList"])
    assert sorted(nodes) == ["n2", "n3"], nodes
    assert "cookbook: pre-flight ok on n2" in log2 and "cookbook: pre-flight ok on n3" in log2, log2[-3000:]
    assert "allreduce_busbw_gbps" in log2
    assert sorted(int(s) for s in BATCH.findall(log2)) == [1, 2, 3, 4]
    took = [int(t) for t in re.findall(r"cookbook: pre-flight took (\d+) s on 2 node", log + log2)]
    print(f"pre-flight gate on 2 nodes: {took} s")


def test_node_fail_requeues_the_job_without_the_dead_node(nodes3_cluster, tiny_assets, job_dir: Path):
    slurm = SlurmClient({**nodes3_cluster.env(), "COOKBOOK_PREFLIGHT": "0"})  # the gate: the test above
    script = write_job(_spec(job_dir, tiny_assets, "node-fail-test", 8, 0.3), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = slurm.submit(script, cwd=job_dir)
    log_path = job_dir / "logs" / f"node-fail-test-{job}.out"

    def training() -> bool:
        assert not slurm.state(job).done, read_output(log_path)[-3000:]
        return bool(BATCH.search(read_output(log_path)))

    _wait_for(training, 240, "the first training step")
    nodes = slurm.hostnames(slurm.show_job(job)["NodeList"])
    dead = nodes[-1]  # not the batch node: its slurmd dies, and Slurm is told the node is down
    pid_file = nodes3_cluster.run_dir / f"slurmd-{dead}.pid"
    try:
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        slurm.run("scontrol", "update", f"NodeName={dead}", "State=DOWN", "Reason=cookbook-test-node-died")
        slurm.release_requeued(job, timeout=60)
        info = slurm.wait(job, timeout=400)
        log = read_output(log_path)
        assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
        assert f"cookbook: node failure: {dead} of job {job}'s previous run is down" in log, log[-3000:]
        assert f"cookbook: excluding {dead} (NODE_FAIL in the previous run) by Slurm's requeue" in log
        second = log.split("NODE_FAIL in the previous run", 1)[1]
        assert dead not in slurm.hostnames(slurm.show_job(job)["NodeList"])
        assert max(int(s) for s in BATCH.findall(second)) == 8
    finally:
        nodes3_cluster.up()  # restarts the slurmd; the node registers and returns to service
        _wait_for(lambda: nodes3_cluster.status().up, 60, f"{dead} back in service")


def test_no_retry_left_ends_the_job_without_resubmitting(nodes3_cluster, tiny_assets, job_dir: Path):
    env = {**nodes3_cluster.env(), "COOKBOOK_PREFLIGHT_INJECT": "n1:bad link", "COOKBOOK_MAX_RETRIES": "0"}
    slurm = SlurmClient(env)
    script = write_job(_spec(job_dir, tiny_assets, "no-retry-test", 4, 0.0), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = slurm.submit(script, cwd=job_dir)
    info = slurm.wait(job, timeout=300)
    log = read_output(job_dir / "logs" / f"no-retry-test-{job}.out")
    assert info.state == "FAILED", f"{info}\n{log[-3000:]}"
    assert "cookbook: pre-flight failed on n1: bad link (injected by COOKBOOK_PREFLIGHT_INJECT)" in log
    spent = "the retry budget is spent (0 of COOKBOOK_MAX_RETRIES=0)"
    assert f"cookbook: not excluding n1 (pre-flight: bad link (injected by COOKBOOK_PREFLIGHT_INJECT)): {spent}" in log
    assert "resubmission" not in log and "Training starts" not in log
    assert not list((job_dir / "run" / ".cookbook").glob("retries-*"))
