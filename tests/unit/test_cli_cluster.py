"""`cookbook cluster` as a user meets it: the env line, and a clear refusal without root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from cookbook.cli import main


def test_env_prints_the_export_line(capsys):
    assert main(["cluster", "env", "--name", "demo-x"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("export SLURM_CONF=") and out.endswith(".cluster/demo-x/etc/slurm.conf")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to nobody")
def test_up_without_root_says_what_is_needed_and_that_a_real_cluster_needs_none_of_it(tmp_path):
    env = {**os.environ, "COOKBOOK_HOME": str(tmp_path)}
    r = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "cookbook",
            "cluster",
            "up",
            "--name",
            "nobody",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2
    assert all(s in r.stderr for s in ("needs root", "slurmctld", "real Slurm cluster", "sudo make cluster-up"))
    assert "Traceback" not in r.stderr


def test_env_of_the_gpu_cluster_points_at_its_own_config(capsys):
    assert main(["cluster", "env", "--name", "gpu"]) == 0
    assert capsys.readouterr().out.strip().endswith(".cluster/gpu/etc/slurm.conf")


def test_the_gpu_preset_can_run_beside_the_shared_cpu_cluster():
    from cookbook.local.cluster import ClusterConfig

    cpu, gpu = ClusterConfig.named("cookbook"), ClusterConfig.named("gpu")
    assert cpu == ClusterConfig(), "`cluster up` with no flags is the plain CPU cluster"
    assert (gpu.gpus_per_node, gpu.cpus_per_node) == (8, 192)
    for key in ("name", "subnet", "ctld_port", "slurmd_port", "multi_port0", "netns_prefix", "root"):
        assert getattr(gpu, key) != getattr(cpu, key), key
    assert ClusterConfig.named("gpu", nodes=4, cpus_per_node=None).nodes == 4


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--gpus-per-node", "-1"], "--gpus-per-node"),
        (["--nodes", "0"], "--nodes"),
        (["--cpus-per-node", "0"], "--cpus-per-node"),
    ],
)
def test_up_refuses_impossible_counts_in_one_line(capsys, args, flag):
    assert main(["cluster", "up", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} must be a positive number") and "\n" not in err


def test_gpu_nodes_are_written_with_device_files_gres_and_claimed_cpus(tmp_path, monkeypatch):
    from cookbook.local import cluster as lc

    monkeypatch.setattr(lc, "_port_free", lambda port: True)  # the real `gpu` cluster may hold 7017 now
    cluster = lc.LocalCluster(lc.ClusterConfig.named("gpu", mode="netns", base_dir=tmp_path))
    for d in (cluster.etc, cluster.run_dir):
        d.mkdir(parents=True)
    cluster._configure()
    conf = cluster.cfg.conf.read_text().splitlines()
    assert "GresTypes=gpu" in conf and "TaskPlugin=task/none" in conf and "SlurmdParameters=config_overrides" in conf
    assert (
        "NodeName=n1 NodeAddr=10.79.0.1 CPUs=192 Boards=1 SocketsPerBoard=1 CoresPerSocket=192 ThreadsPerCore=1 "
        "RealMemory=1843200 Gres=gpu:8 State=UNKNOWN" in conf
    )
    assert "SlurmctldPort=7017" in conf and "SlurmdPort=7018" in conf
    gres = (cluster.etc / "gres.conf").read_text().splitlines()
    nodes = lc.PRESETS["gpu"]["nodes"]
    assert gres[1:] == ["AutoDetect=off", f"NodeName=n[1-{nodes}] Name=gpu File={tmp_path}/dev/nvidia[0-7]"]
    assert [p.name for p in cluster.gpu_devices()] == [f"nvidia{i}" for i in range(8)]


def test_step_cpus_lines_are_parsed_and_a_short_task_is_named():
    from cookbook.local.cluster import StepCpus, parse_step_cpus

    out = (
        "hello\nstep_cpus host=n1 slurm_cpus_per_task=1 affinity=2 job_cpus_per_task=16\n"
        "step_cpus host=n2 slurm_cpus_per_task=16 affinity=16 job_cpus_per_task=16\n"
    )
    got = parse_step_cpus(out)
    assert got == [StepCpus("n1", 1, 2, 16), StepCpus("n2", 16, 16, 16)]
    assert [s.short for s in got] == [True, False]


def test_step_cpus_snippet_survives_strict_bash_outside_a_step():
    from cookbook.local.cluster import STEP_CPUS_SNIPPET, parse_step_cpus

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", STEP_CPUS_SNIPPET], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    (line,) = parse_step_cpus(r.stdout)
    assert (line.slurm_cpus_per_task, line.job_cpus_per_task) == (1, 1)
    assert line.affinity == len(os.sched_getaffinity(0))
