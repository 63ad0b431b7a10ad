"""Life cycle of the embedded cluster, on a private instance so the shared one is never disturbed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cookbook.local.cluster import ClusterConfig, LocalCluster
from cookbook.slurm.client import SlurmClient, SlurmError

# `make test` distributes by file (--dist loadfile), so these tests share one worker and run in order.
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cfg = ClusterConfig(
        name="cbtest",
        nodes=2,
        cpus_per_node=2,
        subnet="10.78.0",
        ctld_port=6917,
        multi_port0=17100,
        base_dir=tmp_path_factory.mktemp("cbtest"),
    )
    cluster = LocalCluster(cfg)
    yield cluster
    cluster.down()


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead process nobody reaped yet holds no resources)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_pids(cluster: LocalCluster) -> dict[str, int | None]:
    return dict(cluster.status().daemons)


def test_up_is_idempotent(private_cluster):
    first = private_cluster.up()
    assert first.up and len(first.nodes) == 2
    pids = _daemon_pids(private_cluster)
    second = private_cluster.up()
    assert second.up
    assert _daemon_pids(private_cluster) == pids, "a second `up` must not restart anything"


def test_controller_restart_loses_no_queued_job(private_cluster, tmp_path):
    private_cluster.up()
    slurm = SlurmClient(private_cluster.env())
    script = tmp_path / "held.sbatch"
    script.write_text("#!/bin/bash\necho ran\n")
    job = slurm.submit(script, "--hold", f"--output={tmp_path}/%j.out")
    assert slurm.state(job).state == "PENDING"
    old = private_cluster.status().daemons["slurmctld"]
    os.kill(old, signal.SIGTERM)
    for _ in range(100):
        if not Path(f"/proc/{old}").exists():
            break
        time.sleep(0.1)
    # controller down: Slurm's own message reaches the user (clients retry ~10 s first)
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        slurm.submit(script, f"--output={tmp_path}/%j.out")
    private_cluster.up()  # starts only the controller again
    assert private_cluster.status().daemons["slurmctld"] != old
    assert slurm.state(job).state == "PENDING"
    slurm.run("scontrol", "release", job)
    assert slurm.wait(job, timeout=60).state == "COMPLETED"
    assert (tmp_path / f"{job}.out").read_text().strip() == "ran"


def test_up_recovers_after_daemons_were_killed_without_down(private_cluster, tmp_path):
    private_cluster.up()
    for pid in _daemon_pids(private_cluster).values():
        os.kill(pid, signal.SIGKILL)  # a machine whose processes were ended: stale pid files remain
    time.sleep(0.5)
    assert not private_cluster.status().up
    status = private_cluster.up()
    assert status.up, status.render()
    slurm = SlurmClient(private_cluster.env())
    script = tmp_path / "after.sbatch"
    script.write_text("#!/bin/bash\nsrun hostname\n")
    job = slurm.submit(script, "--nodes=2", f"--output={tmp_path}/%j.out")
    assert slurm.wait(job, timeout=60).state == "COMPLETED"
    assert sorted((tmp_path / f"{job}.out").read_text().split()) == ["n1", "n2"]


def test_down_leaves_no_process_namespace_or_job_behind(private_cluster, tmp_path):
    private_cluster.up()
    slurm = SlurmClient(private_cluster.env())
    script = tmp_path / "busy.sbatch"
    script.write_text("#!/bin/bash\nsrun sleep 600\n")
    job = slurm.submit(script, "--nodes=2", f"--output={tmp_path}/%j.out")
    slurm.wait(job, timeout=60, until=frozenset({"RUNNING"}))
    time.sleep(1)
    started = {p for p in _daemon_pids(private_cluster).values() if p}
    for ns in ("cbtest-n1", "cbtest-n2"):  # job steps (slurmstepd, sleep) live in the nodes' namespaces
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        started |= {int(p) for p in out.split()}
    assert len(started) > 5, started  # 4 daemons + at least the job's steps
    private_cluster.down()
    alive = [p for p in started if _running(p)]
    assert alive == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in alive]
    assert _processes_mentioning(str(private_cluster.cfg.root)) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "cbtest-" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "cbtest-" not in links


def test_multiple_slurmd_fallback_runs_a_two_node_job(tmp_path_factory, tmp_path):
    """Without network namespaces (mode "multi"): one slurmd per node on its own port, each with its own
    hostname, all on 127.0.0.1; a 2-node job still sees two nodes; down leaves nothing behind."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cfg = ClusterConfig(
        name="cbmulti",
        nodes=2,
        cpus_per_node=1,
        mode="multi",
        ctld_port=6927,
        multi_port0=17200,
        base_dir=tmp_path_factory.mktemp("cbmulti"),
    )
    cluster = LocalCluster(cfg)
    try:
        status = cluster.up()
        assert status.up and status.mode == "multi", status.render()
        slurm = SlurmClient(cluster.env())
        script = tmp_path / "two.sbatch"
        script.write_text("#!/bin/bash\nsrun bash -c 'echo $SLURM_NODEID $(hostname)'\n")
        job = slurm.submit(script, "--nodes=2", f"--output={tmp_path}/%j.out")
        assert slurm.wait(job, timeout=60).state == "COMPLETED"
        assert sorted((tmp_path / f"{job}.out").read_text().split("\n")[:2]) == ["0 n1", "1 n2"]
    finally:
        cluster.down()
    assert _processes_mentioning(str(cfg.root)) == []
