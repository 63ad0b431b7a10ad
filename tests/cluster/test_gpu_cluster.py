"""The GPU-shaped local cluster: GPU-profile sbatch headers are accepted and RUN as written, and a step's
CPUs show whether `srun` passed `--cpus-per-task` on (issue 15, items 2 and problem 8)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from cookbook.local.cluster import STEP_CPUS_SNIPPET, ClusterConfig, LocalCluster, parse_step_cpus
from cookbook.slurm.client import SlurmClient

pytestmark = pytest.mark.cluster

# The header every GPU profile writes (slurm-recipes/*/*-{generic,nebius,crusoe,aws-efa}.sbatch), with the
# CPU and memory requests the seeds make.
GPU_HEADER = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --cpus-per-task={cpus}
#SBATCH --mem=512G
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --time=04:00:00
#SBATCH --open-mode=append
"""
SHOW_GPUS = (
    "srun bash -c 'echo \"gpus host=$(hostname) cvd=$CUDA_VISIBLE_DEVICES on_node=$SLURM_GPUS_ON_NODE "
    "step_gpus=$SLURM_STEP_GPUS\"'\n"
)


def _step_cpus_script(header: str) -> str:
    """Two steps of one job: plain srun, then srun --cpus-per-task=$SLURM_CPUS_PER_TASK."""
    snippet = STEP_CPUS_SNIPPET.replace("'", "'\\''")
    return (
        header + "set -euo pipefail\n"
        f"echo '== plain'\nsrun bash -c '{snippet}'\n"
        f"echo '== cpt'\nsrun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" bash -c '{snippet}'\n"
    )


def _run(slurm: SlurmClient, script: Path, tmp_path: Path, *args: str) -> str:
    job = slurm.submit(script, f"--output={tmp_path}/%j.out", *args)
    state = slurm.wait(job, timeout=120).state
    out = (tmp_path / f"{job}.out").read_text()
    assert state == "COMPLETED", out
    return out


def _node_states(cluster: LocalCluster) -> dict[str, str]:
    return dict(cluster.status().nodes)


def _split(out: str) -> tuple[list, list]:
    plain, cpt = out.split("== cpt")
    return parse_step_cpus(plain), parse_step_cpus(cpt)


@pytest.mark.parametrize("cpus", [16, 128])
def test_gpu_profile_job_runs_on_two_nodes_and_each_step_sees_eight_gpus(gpu_cluster, tmp_path, cpus):
    slurm = SlurmClient(gpu_cluster.env())
    script = tmp_path / "gpu.sbatch"
    script.write_text(GPU_HEADER.format(cpus=cpus) + "set -euo pipefail\n" + SHOW_GPUS)
    out = _run(slurm, script, tmp_path)
    lines = sorted(ln for ln in out.splitlines() if ln.startswith("gpus "))
    assert lines == [f"gpus host={h} cvd=0,1,2,3,4,5,6,7 on_node=8 step_gpus=0,1,2,3,4,5,6,7" for h in ("n1", "n2")], (
        out
    )
    states = _node_states(gpu_cluster)  # other tests' jobs may hold nodes: none may be drained or invalid
    assert set(states) >= {"n1", "n2"} and not [
        s for s in states.values() if s.startswith(("drain", "inval", "down"))
    ], f"a GPU job must not drain its nodes: {states}"


def test_plain_srun_gives_the_task_one_cpu_and_srun_cpus_per_task_gives_all(gpu_cluster, tmp_path):
    """Problem 8 as Slurm 22.05 sees it (no binding here: the count comes from the step's TresPerTask)."""
    slurm = SlurmClient(gpu_cluster.env())
    script = tmp_path / "cpus.sbatch"
    script.write_text(_step_cpus_script(GPU_HEADER.format(cpus=16)))
    plain, cpt = _split(_run(slurm, script, tmp_path))
    assert sorted(s.host for s in plain) == sorted(s.host for s in cpt) == ["n1", "n2"]
    assert {(s.slurm_cpus_per_task, s.job_cpus_per_task, s.short) for s in plain} == {(1, 16, True)}
    assert {(s.slurm_cpus_per_task, s.job_cpus_per_task, s.short) for s in cpt} == {(16, 16, False)}


def test_with_cpu_binding_plain_srun_pins_the_task_to_one_core(tmp_path_factory, tmp_path, local_cluster):
    """Problem 8 for real: task/affinity pins a plain srun's task to one core, and to --cpus-per-task cores
    when srun is given it. Nodes claim the machine's real cores (binding cannot fold more). This private
    netns cluster also has GPUs and runs beside the shared `cookbook`; `down` leaves nothing of it."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs 2 cores to tell 1 from --cpus-per-task")
    cfg = ClusterConfig(
        name="gpubind",
        nodes=2,
        cpus_per_node=cores,
        gpus_per_node=2,
        cpu_bind=True,
        mode="netns",
        subnet="10.80.0",
        ctld_port=7027,
        slurmd_port=7028,
        multi_port0=17400,
        base_dir=tmp_path_factory.mktemp("gpubind"),
    )
    cluster = LocalCluster(cfg)
    try:
        assert cluster.up().up
        assert local_cluster.status().up, "the shared cluster runs at the same time"
        header = GPU_HEADER.replace("=8", "=2").replace("--mem=512G", "--mem=1G").format(cpus=cores)
        script = tmp_path / "bind.sbatch"
        script.write_text(_step_cpus_script(header))
        plain, cpt = _split(_run(SlurmClient(cluster.env()), script, tmp_path))
        assert {(s.slurm_cpus_per_task, s.affinity) for s in plain} == {(1, 1)}
        assert {(s.slurm_cpus_per_task, s.affinity) for s in cpt} == {(cores, cores)}
    finally:
        cluster.down()
    assert not list(Path("/run/netns").glob("gpubin-*"))
    assert "gpubin-" not in os.popen("ip -o link show").read()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(cfg.root))]
    assert local_cluster.status().up, "down of one cluster leaves the other running"


def test_gpu_nodes_work_in_the_multiple_slurmd_fallback(tmp_path_factory, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cfg = dataclasses.replace(
        ClusterConfig.named("gpu"),
        name="gpumulti",
        nodes=2,
        mode="multi",
        ctld_port=7037,
        multi_port0=17500,
        base_dir=tmp_path_factory.mktemp("gpumulti"),
    )
    cluster = LocalCluster(cfg)
    try:
        assert cluster.up().mode == "multi"
        script = tmp_path / "gpu.sbatch"
        script.write_text(GPU_HEADER.format(cpus=64) + SHOW_GPUS)
        out = _run(SlurmClient(cluster.env()), script, tmp_path)
        hosts = sorted(ln.split()[1] for ln in out.splitlines() if "cvd=0,1,2,3,4,5,6,7 on_node=8" in ln)
        assert hosts == ["host=n1", "host=n2"], out
        assert _node_states(cluster) == {"n1": "idle", "n2": "idle"}
    finally:
        cluster.down()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(cfg.root))]


def _mentions(proc: Path, text: str) -> bool:
    try:
        return int(proc.name) != os.getpid() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
