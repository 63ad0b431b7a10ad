"""Shared fixtures: the real local Slurm cluster and the tiny assets, each made once per test run.

Under pytest-xdist several workers ask at once; a file lock makes the first one do the work and the
others reuse it. The cluster stays up after the run (``make cluster-down`` stops it) so repeated
runs start fast; tests that need their own cluster use another ``ClusterConfig(name=...)``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock

from cookbook.paths import project_root

LOCK_DIR = project_root() / ".cluster"
# no cluster, ~1 CPU-minute: first, so one worker runs it while the other brings the local cluster up
FIRST = ("tests/unit/test_gpu_check.py",)
# little CPU, long waits on Slurm (a job's time limit, 78 s; controller restarts): among the heavy files, so that
# the other worker's jobs use the cores meanwhile (run last, beside the short unit files, they left both idle ~80 s)
WAITS = ("tests/cluster/test_slurm_client.py", "tests/cluster/test_local_cluster.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work first, the many short unit files last, so that the two xdist workers (``--dist loadfile
    --no-loadscope-reorder``, the Makefile's) end together: FIRST, then every file marked slow (real jobs on the
    local cluster) and the WAITS, then the rest, each group in collection order."""

    def group(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return 0 if path in FIRST else 1 if item.get_closest_marker("slow") or path in WAITS else 2

    items.sort(key=group)


@pytest.fixture(autouse=True, scope="session")
def _no_personal_profiles(tmp_path_factory):
    """The suite sees the built-in profiles only: a developer's ~/.config/cookbook/profiles stays out of it
    (tests of profile files set XDG_CONFIG_HOME themselves)."""
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))


def _locked(name: str) -> FileLock:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    return FileLock(str(LOCK_DIR / f"{name}.lock"), timeout=900)


@pytest.fixture(scope="session")
def local_cluster():
    """The shared local cluster `cookbook` (2 nodes), started if needed."""
    from cookbook.local.cluster import ClusterConfig, LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = LocalCluster(ClusterConfig(name="cookbook", nodes=2))
    with _locked("cookbook-up"):
        if not cluster.status().up:
            cluster.up()
    threading.Thread(target=_keep_daemons, args=(cluster,), name="cookbook-keeper", daemon=True).start()
    return cluster


def _keep_daemons(cluster, every: float = 5.0) -> None:
    """Start again a daemon of the shared cluster that died, as systemd does on a real node. Debian's slurmd 22.05
    has crashed mid-suite (dmesg: ``slurmd[5537]: segfault at 0 ... in libc.so.6``, a node of the shared cluster
    gone for the rest of the run); no test stops the shared cluster's daemons on purpose (they use their own)."""
    while True:
        time.sleep(every)
        try:
            if all(cluster.status().daemons.values()):
                continue
            with _locked("cookbook-up"):
                dead = [name for name, pid in cluster.status().daemons.items() if not pid]
                if dead:
                    print(f"\n[keeper] {', '.join(dead)} of the shared cluster died: started again", file=sys.stderr)
                    cluster.up()
        except Exception as e:  # noqa: BLE001 - a keeper never fails the run; the tests say what broke
            print(f"\n[keeper] could not check the shared cluster: {e}", file=sys.stderr)


@pytest.fixture(scope="session")
def slurm(local_cluster):
    """A SlurmClient bound to the shared local cluster; also exports SLURM_CONF for subprocesses."""
    from cookbook.slurm.client import SlurmClient

    os.environ["SLURM_CONF"] = str(local_cluster.cfg.conf)
    return SlurmClient(local_cluster.env())


@pytest.fixture(scope="session")
def tiny_assets():
    """Tiny model, tokenizers and datasets (cached under .cache/tiny)."""
    from cookbook.local.assets.tiny import ensure_tiny_assets

    with _locked("tiny-assets"):
        return ensure_tiny_assets()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A per-test folder visible to the cluster's nodes (same filesystem)."""
    return tmp_path


@pytest.fixture(scope="session")
def gpu_cluster():
    """The GPU-shaped local cluster `gpu` (preset: 8 nodes x 8 fake GPUs, 192 CPUs each), beside `cookbook`."""
    from cookbook.local.cluster import ClusterConfig, LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = LocalCluster(ClusterConfig.named("gpu"))
    with _locked("gpu-up"):
        if not cluster.status().up:
            cluster.up()
    return cluster


@pytest.fixture(scope="session")
def nodes3_cluster():
    """A private 3-node CPU cluster `nodes3` (preset), beside `cookbook`: a 2-node job that loses a node
    still has two to run on (the pre-flight gate's exclusion, NODE_FAIL retry)."""
    from cookbook.local.cluster import ClusterConfig, LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = LocalCluster(ClusterConfig.named("nodes3"))
    with _locked("nodes3-up"):
        if not cluster.status().up:
            cluster.up()
    return cluster
