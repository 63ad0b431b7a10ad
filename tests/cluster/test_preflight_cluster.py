"""Bad nodes on a private 3-node local cluster (`nodes3`), with a real 2-node FSDP job (local-cpu):

- the pre-flight gate fails on one node (its GPU reports an XID, through the bench's fake NVML): the log names
  the node and the reason; it is the batch host, which no spare can replace, so the SAME job is requeued without
  it (requeuehold, ExcNodeList, release: no sbatch) and completes on the other two. The job runs in a reservation
  of the 3 nodes (whose eligible nodes the runtime counts before excluding), under an account and a partition;
  its reservation, account, partition, time limit and comment are the same after the requeue. Its `--qos` cannot
  be: this Slurm has no accounting storage (no slurmdbd, `accounting_storage/none`), which defines no QOS and
  drops the option (QOS=(null)), as the test asserts. The failing node ran no training step; the run's telemetry
  names the GPU that throttled, the XID and the NIC with errors in explain, watch and the plot;
- a node dies mid-run (its slurmd killed, the node set DOWN: Slurm ends the run NODE_FAIL and requeues it):
  the requeued run starts without it, says so, and completes;
- with no recovery left (COOKBOOK_MAX_RETRIES=0) a node blamed at the gate is named and the job trains on it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_wait import wait_for as _wait_for
from fsdp_job import fsdp_spec as _spec

from cookbook.metrics.telemetry import plot_nodes, telemetry_from_log
from cookbook.paths import project_root
from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BATCH = re.compile(r"Batch (\d+) Loss")
REQUEUED = re.compile(r"cookbook: excluding (\S+) \(pre-flight: .*\): job (\d+) requeued with ExcNodeList=(\S+), every")
RESERVATION, ACCOUNT, QOS = "cookbook-requeue-test", "cookbook-test", "normal"
KEPT = ("Partition", "Account", "QOS", "Reservation", "TimeLimit", "Comment")  # what a requeue must not change


@pytest.fixture
def nodes3_reserved(nodes3_cluster) -> Iterator[str]:
    """A reservation of the 3 nodes for this user, deleted after the test (IGNORE_JOBS: another test's job may
    hold them now; PURGE_COMP: Slurm drops it 2 min after it holds no job, should the test die first)."""
    slurm = SlurmClient(nodes3_cluster.env())
    slurm.run("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)  # a dead run's
    slurm.run("scontrol", "create", "reservation", f"ReservationName={RESERVATION}", f"Users={getpass.getuser()}",
              "StartTime=now", "Duration=30", "Nodes=ALL", "Flags=IGNORE_JOBS,PURGE_COMP=00:02:00")  # fmt: skip
    try:
        yield RESERVATION
    finally:
        slurm.run("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)


def test_a_gpu_with_an_xid_excludes_its_node_and_the_telemetry_names_the_throttled_gpu_the_xid_and_the_nic(
    nodes3_cluster, nodes3_reserved: str, tiny_assets, job_dir: Path
):
    """#32 on real Slurm, with the local bench's fake NVML (recorded values, per node) and a sysfs of InfiniBand
    counters per node: n1's GPU 1 reports an XID at the gate, n1 is excluded (the same job, requeued without it)
    and completes on n2 and n3; meanwhile n2's GPU 0 is held by a hardware slowdown, n3's GPU 1 reports an XID and
    its mlx5_0 counts 1.2M symbol errors: `explain`, `watch` and the per-node plot name each by node and GPU."""
    nvml = {
        "default": {"gpus": 2, "sm_mhz": 1980, "mem_mhz": 2619, "power_w": 650, "power_limit_w": 700, "temp_c": 60,
                    "util_pct": 99, "mem_used_mib": 1000, "throttle": 0, "ecc_uncorrected": 0},
        "nodes": {
            "n1": {"xid": {"1": [79]}},
            "n2": {"gpu": {"0": {"sm_mhz": 1410, "throttle": 8}}, "after_s": 2},
            "n3": {"xid": {"1": [48]}, "after_s": 2},
        },
    }  # fmt: skip
    (job_dir / "nvml.json").write_text(json.dumps(nvml))
    counters = {}
    for node in ("n1", "n2", "n3"):
        counters[node] = job_dir / f"ib-{node}" / "mlx5_0" / "ports" / "1" / "counters"
        counters[node].mkdir(parents=True)
        (counters[node] / "symbol_error").write_text("7\n")
    env = {
        **nodes3_cluster.env(),
        "PYTHONPATH": str(project_root() / "cookbook" / "local" / "fake_nvml"),  # `import pynvml` finds the fake
        "COOKBOOK_FAKE_NVML": str(job_dir / "nvml.json"),
        "COOKBOOK_TELEMETRY_S": "1",
        "COOKBOOK_IB_SYSFS": str(job_dir / "ib-{node}"),
    }
    slurm = SlurmClient(env)
    spec = _spec(job_dir, tiny_assets, "preflight-test", 6, 0.5, sbatch_extra=["--comment=kept"], partition="debug",
                 account=ACCOUNT, qos=QOS, reservation=nodes3_reserved)  # fmt: skip
    script = write_job(spec, job_dir / "job.sbatch")
    assert (job_dir / "cookbook_runtime" / "nodecheck.py").is_file()  # the runtime, in the job folder
    (job_dir / "logs").mkdir()
    first = slurm.submit(script, cwd=job_dir)
    log_path = job_dir / "logs" / f"preflight-test-{first}.out"
    asked = slurm.show_job(first)
    assert f"#SBATCH --qos={QOS}" in script.read_text()  # asked, and dropped: no accounting storage, no QOS
    assert [asked[k] for k in KEPT] == ["debug", ACCOUNT, "(null)", nodes3_reserved, "00:10:00", "kept"], asked
    _wait_for(lambda: REQUEUED.search(read_output(log_path)), 300, "the same job requeued without n1")
    log = read_output(log_path)
    assert "cookbook: pre-flight failed on n1: GPU 1 reported an XID: 79 (`dmesg | grep -i xid` on the node)" in log
    assert re.search(r"cookbook: pre-flight ok on n2 in [\d.]+ s: .*matmul_tflops", log), log[-3000:]
    moved = REQUEUED.search(log)
    assert moved and moved.group(1) == "n1" and moved.group(2) == first and moved.group(3) == "n1", log[-3000:]
    # the failing node ran no training step: this run launched no training at all
    assert "Training starts" not in log and not BATCH.search(log), log[-3000:]

    second = first  # the same job, every option kept
    record = slurm.show_job(second)
    assert record["ExcNodeList"] == "n1" and {k: record[k] for k in KEPT} == {k: asked[k] for k in KEPT}, record
    samples = job_dir / "run" / ".cookbook" / "telemetry" / f"{second}-1" / "n3.csv"
    _wait_for(lambda: samples.is_file() and len(samples.read_text().splitlines()) > 2, 300, "n3's first samples")
    (counters["n3"] / "symbol_error").write_text("1200007\n")  # the link errs during the run
    info = slurm.wait(second, timeout=400)
    log2_path = log_path
    log2 = read_output(log2_path).split(moved.group(0), 1)[1]
    assert info.state == "COMPLETED", f"{info}\n{log2[-3000:]}"
    nodes = slurm.hostnames(slurm.show_job(second)["NodeList"])
    assert sorted(nodes) == ["n2", "n3"], nodes
    assert "cookbook: pre-flight ok on n2" in log2 and "cookbook: pre-flight ok on n3" in log2, log2[-3000:]
    assert "allreduce_busbw_gbps" in log2
    assert sorted(int(s) for s in BATCH.findall(log2)) == [1, 2, 3, 4, 5, 6]
    took = [int(t) for t in re.findall(r"cookbook: pre-flight took (\d+) s on \d node", log)]
    print(f"pre-flight gate on 2 nodes: {took} s")

    def cli(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "cookbook", *args], env={**os.environ, **nodes3_cluster.env()},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return r.stdout + r.stderr

    explained = cli("explain", str(log2_path))
    assert "[gpu_xid, a fault] n3 GPU 1 reported XID 48" in explained, explained
    assert re.search(r"\[gpu_throttle, ~\d+% of throughput\] n2 GPU 0 spent \d+% of the run throttled by "
                     r"hw_slowdown at 1,410 MHz", explained), explained  # fmt: skip
    assert "[gpu_nic, a fault] n3's mlx5_0:1 counted 1.2M link errors during the run" in explained, explained
    watched = cli("watch", second)
    assert re.search(r"node n2: 2 GPUs, SM 1,410-1,980 MHz, .*; GPU 0 spent \d+% of the run throttled", watched)
    assert re.search(r"node n3: 2 GPUs, .*GPU 1 reported XID 48; mlx5_0:1 counted 1.2M", watched), watched
    steps = cli("metrics", str(log2_path), "--telemetry")  # each step beside what the GPUs did then
    assert "min_MHz" in steps and "n2:0" in steps, steps
    ledger = cli("goodput", str(log2_path))  # what the GPUs did meanwhile, from the same samples
    assert re.search(r"the GPUs meanwhile: 4 sampled, mean SM clock 1,\d{3} MHz, mean power 650 W, energy \S+ kWh",
                     ledger), ledger  # fmt: skip
    fig = plot_nodes(telemetry_from_log(log2_path))
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == ["n2\nSM MHz", "n3\nSM MHz"]
    assert min(min(line.get_ydata()) for line in fig.axes[0].get_lines()) == 1410
    assert fig.axes[0].get_title(loc="left").startswith("GPU 0 spent")
    assert "GPU 1 reported XID 48; mlx5_0:1 counted 1.2M link errors" in fig.axes[2].get_title(loc="left")


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


def test_no_recovery_left_names_the_node_at_the_gate_and_trains_on_it(nodes3_cluster, tiny_assets, job_dir: Path):
    env = {**nodes3_cluster.env(), "COOKBOOK_PREFLIGHT_INJECT": "n1:bad link", "COOKBOOK_MAX_RETRIES": "0"}
    slurm = SlurmClient(env)
    script = write_job(_spec(job_dir, tiny_assets, "no-retry-test", 4, 0.0), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = slurm.submit(script, cwd=job_dir)
    info = slurm.wait(job, timeout=300)
    log = read_output(job_dir / "logs" / f"no-retry-test-{job}.out")
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
    assert "cookbook: pre-flight failed on n1: bad link (injected by COOKBOOK_PREFLIGHT_INJECT)" in log
    said = "cookbook: keeping n1 (pre-flight: bad link (injected by COOKBOOK_PREFLIGHT_INJECT)): the recovery budget"
    assert said in log and "training on it" in log, log[-3000:]
    assert max(int(s) for s in BATCH.findall(log)) == 4
