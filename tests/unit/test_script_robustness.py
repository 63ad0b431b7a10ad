"""The generated scripts against what a first real run would hit (issue: rehearse every GPU script).

Each test fails on the script text as it was before the fix (the "broken" variants below are those
texts), or on the runtime (cookbook_runtime.run) the script's last line hands the job to, so a regression in
the template or the runtime is caught without a GPU cluster.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from batch_step import FakeSlurm, committed_scripts, job_view, runtime_args, runtime_argv, unset_env

from cookbook.recipes import get_recipe, list_recipes
from cookbook.rehearsal.rehearse import manifest, possibly_empty_arrays, static_problems
from cookbook.render import render_job, write_job
from cookbook.spec import JobSpec, make_spec, profiles
from cookbook_runtime import decide, resume, run, slurm

SCRIPTS = committed_scripts()
GPU_SCRIPTS = {n: t for n, t in SCRIPTS.items() if ".local-cpu." not in n}


@functools.cache
def _switches(name: str) -> argparse.Namespace:
    """The runtime's switches of a generated script (its last line), as the runtime parses them."""
    return runtime_args(SCRIPTS[name])


def _launch(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> list[str]:
    """The srun command the runtime starts the ranks with, for job 1234 on n1,n2 (8 processes each)."""
    return run.launch_command(job_view(args), "10.0.0.1", 29500, 8, list(extra))


def _program(args: argparse.Namespace) -> list[str]:
    """The program and its arguments: the words after the launcher (torchrun, tune run)."""
    return args.launcher[run.launcher_words(args.launcher) :]


@pytest.fixture
def no_interface_env(monkeypatch):
    """No NCCL/gloo interface set by this machine or left behind by the runtime; no rehearsal hook."""
    unset_env(monkeypatch, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "COOKBOOK_REHEARSE")


def test_every_recipe_and_profile_is_generated():
    """One script per recipe and profile; the FSDP recipes share one per profile (``MODEL`` picks the model)."""
    others = [r for r in list_recipes() if r.framework != "fsdp"]
    shipped = profiles(builtin_only=True)
    assert len(SCRIPTS) == (len(others) + 1) * len(shipped)
    assert {n for n in SCRIPTS if n.startswith("fsdp/")} == {f"fsdp/fsdp.{p}.sbatch" for p in shipped}


def _model_block(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# --- the model"))
    end = next(i for i, ln in enumerate(lines) if ln == "export MODEL")
    return "\n".join(lines[start : end + 1])


@pytest.mark.parametrize("profile", ["nebius", "local-cpu"])
def test_the_fsdp_script_takes_every_model_and_refuses_others_in_one_line(profile):
    from cookbook.recipes.fsdp import DEFAULT_MODEL, FSDP_MODELS

    text = SCRIPTS[f"fsdp/fsdp.{profile}.sbatch"]
    block = "set -euo pipefail\n" + _model_block(text) + '\necho "$MODEL $SHAPE $MAX_STEPS"'
    for model, _, steps in FSDP_MODELS:
        out = subprocess.run(["bash", "-c", block], env={"MODEL": model}, capture_output=True, text=True)
        shape = ("tiny_moe" if model.startswith("mixtral") else "tiny") if profile == "local-cpu" else model
        max_steps = "20" if profile == "local-cpu" else str(steps)
        assert out.returncode == 0 and out.stdout.split() == [model, shape, max_steps]
    default = subprocess.run(["bash", "-c", block], env={}, capture_output=True, text=True)
    assert default.stdout.split()[0] == DEFAULT_MODEL
    bad = subprocess.run(["bash", "-c", block], env={"MODEL": "llama9_1t"}, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "unknown MODEL=llama9_1t" in bad.stderr and "llama3_1_70b" in bad.stderr
    assert 'RUN_DIR=${RUN_DIR:-"${RECIPE_DIR}"/runs/fsdp-"${MODEL}"-' in text
    assert '--model="${SHAPE}"' in text and '--max_steps="${MAX_STEPS}"' in text


def test_the_rehearsal_of_the_fsdp_script_checks_the_model_of_the_job():
    text = SCRIPTS["fsdp/fsdp.generic.sbatch"]
    assert manifest(text)["recipe"] == "fsdp_llama3_1_8b"
    assert manifest(text, {"MODEL": "mixtral_8x7b"})["recipe"] == "fsdp_mixtral_8x7b"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_script_expands_a_possibly_empty_array_unguarded(name):
    """Problem 1: bash before 4.4 aborts on "${A[@]}" of an empty array under set -u. The scripts keep no array
    (the runtime builds the launch in Python), and the check still catches one added to them."""
    text = SCRIPTS[name]
    assert possibly_empty_arrays(text) == [] and static_problems(text) == []
    unguarded = 'EXTRA=()\nprintf "%s" "${EXTRA[@]}"\n'
    broken = text.replace("set -euo pipefail\n", "set -euo pipefail\n" + unguarded, 1)
    assert possibly_empty_arrays(broken) == ["EXTRA"]
    assert any("EXTRA" in p and "4.4" in p for p in static_problems(broken))
    guarded = broken.replace('"${EXTRA[@]}"', '${EXTRA[@]+"${EXTRA[@]}"}')
    assert possibly_empty_arrays(guarded) == []


def test_guarded_expansion_keeps_arguments_and_expands_empty_to_nothing():
    script = (
        'set -euo pipefail\nA=()\nprintf "[%s]" x ${A[@]+"${A[@]}"}\nA+=("a b" c)\nprintf "[%s]" ${A[@]+"${A[@]}"}\n'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == "[x][a b][c]"


@pytest.mark.parametrize(
    "name",
    [
        "torchtune/llama3_3_70b_full.nebius.sbatch",
        "torchtune/llama3_3_70b_lora.local-cpu.sbatch",
        "torchtitan/llama3_8b_c4.nebius.sbatch",
        "fsdp/fsdp.local-cpu.sbatch",
    ],
)
def test_a_first_start_without_checkpoints_launches_with_no_resume_argument(name, tmp_path, no_interface_env):
    """What the empty RESUME_ARGS array was under bash 4.2: on an empty run folder the resume adds nothing (not
    even an empty word) and the launch ends with the program's own arguments."""
    args = _switches(name)
    assert args.resume != "none"
    extra, said = resume.resume(
        args.resume, tmp_path, checkpoint_dir=tmp_path / "checkpoints", adapter=args.resume_adapter,
        filename_format=args.resume_filename_format, job="1234",
    )  # fmt: skip
    assert (extra, said) == ([], [])
    command = _launch(args, tuple(extra))
    assert command[-len(_program(args)) :] == _program(args) and "" not in command


def test_the_rendezvous_is_the_batch_hosts_own_address_and_the_node_list_is_read_whole(
    tmp_path, monkeypatch, no_interface_env
):
    """Problem 2: no script pipes `scontrol show hostnames` into `head` (under pipefail scontrol dies of SIGPIPE on
    large allocations; the static check still catches it); the runtime reads the node list whole and takes the
    batch host's own address for the rendezvous, never the NodeName. (The real scontrol half is in
    tests/cluster/test_rehearsal.py.)"""
    for text in SCRIPTS.values():
        assert "scontrol show hostnames" not in text
    pipe = 'set -euo pipefail\nHEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
    broken = SCRIPTS["torchtitan/llama3_8b_c4.generic.sbatch"].replace("set -euo pipefail\n", pipe)
    assert any("SIGPIPE" in p for p in static_problems(broken))
    monkeypatch.setenv("PATH", f"{FakeSlurm(tmp_path).bin}:{os.environ['PATH']}")
    many = [f"gpu-{i:04d}" for i in range(4096)]
    assert slurm.hostnames(",".join(many)) == many
    local = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "10.1.2.3"), ("ib0", "192.168.7.3")]
    monkeypatch.setattr(run, "local_addresses", lambda: local)
    monkeypatch.setattr(run, "resolved_addresses", lambda: ["192.168.7.3"])
    monkeypatch.setattr(slurm, "reachable", lambda address, port, timeout=3.0: False)
    args = _switches("torchtitan/llama3_8b_c4.generic.sbatch")
    assert run.rendezvous(job_view(args, nodes=("gpu-0001", "gpu-0002"))) == ("192.168.7.3", 29500)
    monkeypatch.setattr(run, "resolved_addresses", lambda: ["127.0.1.1"])  # the name resolves to loopback
    assert run.rendezvous(job_view(args, nodes=("gpu-0001", "gpu-0002")))[0] == "10.1.2.3"


def test_two_renders_into_one_folder_keep_their_own_configs(tmp_path):
    """Problem 3: the YAML is named after the script, and says which script it belongs to."""
    a = write_job(make_spec("llama3_3_70b_lora", "nebius", overrides={"batch_size": "1"}), tmp_path / "a.sbatch")
    b = write_job(make_spec("llama3_3_70b_lora", "nebius", overrides={"batch_size": "3"}), tmp_path / "b.sbatch")
    assert "batch_size: 1" in (tmp_path / "a.yaml").read_text() and "batch_size: 3" in (tmp_path / "b.yaml").read_text()
    assert '"${RECIPE_DIR}"/a.yaml' in a.read_text() and '"${RECIPE_DIR}"/b.yaml' in b.read_text()
    assert not [p for p in static_problems(a.read_text(), a) if "written for" in p]
    # the old naming: both scripts read one file, the second render's
    (tmp_path / "a.yaml").write_text((tmp_path / "b.yaml").read_text())
    assert any("written for b.sbatch" in p for p in static_problems(a.read_text(), a))


@pytest.mark.parametrize("name", sorted(GPU_SCRIPTS))
def test_every_start_path_is_an_absolute_script_variable(name):
    """Problem 4: no start-up path is left relative to the folder the job starts in."""
    text = GPU_SCRIPTS[name]
    recipe, profile = re.search(r"^# (\S+) \(\w+\), profile ([\w-]+):", text, re.M).groups()
    recipe = recipe.replace("${MODEL}", "llama3_1_8b")  # fsdp.<profile>.sbatch: the default MODEL
    rec = get_recipe(recipe)
    spec = JobSpec(recipe=recipe, profile=profile)
    for sp in rec.start_paths(spec):
        if sp.variable:
            default = re.search(rf"^{sp.variable}=\$\{{{sp.variable}:-(.*)\}}$", text, re.M)
            assert default, f"{sp.variable} not defined in {name}"
            value = default.group(1)
            assert sp.hub_ok or value.startswith('"${RECIPE_DIR}"/'), value
    if rec.framework == "torchtitan":
        for sp in rec.start_paths(spec):
            assert f"--{sp.key}" in _switches(name).launcher, sp.key


def test_flux_autoencoder_and_assets_are_set_and_warned_about(tmp_path):
    job = render_job(make_spec("flux_schnell", "nebius", recipe_dir=str(tmp_path)))
    words = runtime_args(job.script, {"FLUX_DIR": "/models/flux"}).launcher  # the script's variable, at run time
    assert words[words.index("--encoder.autoencoder_path") + 1] == "/models/flux/ae.safetensors"
    assert any("encoder.autoencoder_path" in w and "does not exist" in w for w in job.warnings)
    assert any(
        "hf_assets_path" in w
        for w in render_job(make_spec("llama3_8b_c4", "crusoe", recipe_dir=str(tmp_path))).warnings
    )


def test_torchtitan_gpu_configs_profile_only_on_request_with_the_seed_timeout():
    """Problems 5, 6, 7: what the parsed GPU configs say (torchtitan's own parser)."""
    from cookbook.recipes.torchtitan import parse_config

    llama, err = parse_config("llama3_8b_c4", {})
    assert llama is not None, err
    assert llama.profiler.enable_profiling is False and llama.comm.train_timeout_seconds == 300
    flux, err = parse_config("flux_schnell", {"parallelism.data_parallel_replicate_degree": "2"})
    assert flux is not None, err
    assert flux.profiler.enable_profiling is False and flux.comm.train_timeout_seconds == 300
    assert flux.training.local_batch_size == 32 and flux.parallelism.data_parallel_replicate_degree == 2
    text = GPU_SCRIPTS["torchtitan/flux_schnell.nebius.sbatch"]
    words = runtime_args(text, {"SLURM_JOB_NUM_NODES": "16"}).launcher  # the job's node count, at run time
    assert words[words.index("--parallelism.data_parallel_replicate_degree") + 1] == "16"
    expected = get_recipe("flux_schnell").expected_config(JobSpec("flux_schnell", profile="nebius"))
    assert expected["parallelism.data_parallel_replicate_degree"][0] == "$SLURM_JOB_NUM_NODES"
    assert expected["training.local_batch_size"][0] == 32


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_cpus_reach_the_launcher(name, monkeypatch, no_interface_env):
    """Problem 8: srun gets --cpus-per-task (Slurm 22.05-23.02 srun does not inherit it): the job's
    SLURM_CPUS_PER_TASK, else every CPU it has on the node; a container's options follow."""
    args = _switches(name)
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "96")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "12")
    command = _launch(args)
    srun = command[: command.index("--kill-on-bad-exit=1")]
    assert srun == run.srun_prefix(args) and srun[0] == "srun" and "--cpus-per-task=12" in srun
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert "--cpus-per-task=96" in run.srun_prefix(args)
    container = [w for w in runtime_argv(SCRIPTS[name]) if w.startswith("--srun-arg=")]
    assert [f"--srun-arg={w}" for w in srun if w.startswith("--container-")] == container


def test_profiles_settings_with_sources():
    """Problem 9."""
    efa = {v.name: v for v in profiles()["aws-efa"].env}
    assert efa["FI_EFA_USE_HUGE_PAGE"].value == "0"
    assert "NCCL_BUFFSIZE" not in efa and "NCCL_P2P_NET_CHUNKSIZE" not in efa
    for name in ("nebius", "crusoe"):
        assert profiles()[name].interface == "detect"
        assert "NCCL_SOCKET_IFNAME" not in {v.name for v in profiles()[name].env}
    for prof in profiles().values():
        assert all(v.source for v in prof.env)
        assert "seed" not in " ".join(v.source for v in prof.env).lower()
    nebius = GPU_SCRIPTS["torchtune/llama3_3_70b_lora.nebius.sbatch"]
    # the interface is detected at run time (next test), never pinned in the script
    assert _switches("torchtune/llama3_3_70b_lora.nebius.sbatch").interface == "detect"
    assert "export NCCL_SOCKET_IFNAME" not in nebius and "GLOO_SOCKET_IFNAME" not in nebius
    assert 'export TRITON_CACHE_DIR="${TMPDIR:-/tmp}/triton-cache-$SLURM_JOB_ID"' in nebius


def test_interface_detection_picks_the_interface_holding_the_address(monkeypatch, capsys, no_interface_env):
    """--interface=detect: NCCL and gloo get the interface holding the head address (never loopback or a container
    bridge); a user's NCCL_SOCKET_IFNAME wins and gloo follows it; --interface=none exports nothing."""
    assert ("lo", "127.0.0.1") in run.local_addresses()  # this machine's `ip -o -4 addr show`, parsed
    local = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("ens5", "10.0.3.7"), ("ib0", "192.168.0.7")]
    monkeypatch.setattr(run, "local_addresses", lambda: local)
    monkeypatch.setattr(run, "resolved_addresses", lambda: ["10.0.3.7"])
    monkeypatch.setattr(slurm, "reachable", lambda address, port, timeout=3.0: False)
    args = _switches("torchtitan/llama3_8b_c4.crusoe.sbatch")
    assert args.interface == "detect"
    assert run.rendezvous(job_view(args))[0] == "10.0.3.7"
    assert os.environ["NCCL_SOCKET_IFNAME"] == os.environ["GLOO_SOCKET_IFNAME"] == "ens5"
    assert "network interface: ens5" in capsys.readouterr().out
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert run.rendezvous(job_view(args))[0] == "192.168.0.7"
    assert os.environ["NCCL_SOCKET_IFNAME"] == os.environ["GLOO_SOCKET_IFNAME"] == "ib0"
    unset_env(monkeypatch, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    none = _switches("fsdp/fsdp.local-cpu.sbatch")
    assert none.interface == "none"
    run.rendezvous(job_view(none))
    assert "NCCL_SOCKET_IFNAME" not in os.environ and "GLOO_SOCKET_IFNAME" not in os.environ


def test_gloo_never_gets_a_pinned_nccl_selector(monkeypatch, no_interface_env):
    """aws-efa pins NCCL_SOCKET_IFNAME='^docker,lo,veth', NCCL's selector syntax; gloo takes exact interface names
    only: it gets the interface the selector picked, or nothing (the bash set gloo's only when it detected one)."""
    text = GPU_SCRIPTS["torchtitan/llama3_8b_c4.aws-efa.sbatch"]
    assert "export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-'^docker,lo,veth'}" in text
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker,lo,veth")
    monkeypatch.setattr(run, "local_addresses", lambda: [("lo", "127.0.0.1"), ("ens32", "10.0.9.4")])
    monkeypatch.setattr(run, "resolved_addresses", lambda: ["10.0.9.4"])
    monkeypatch.setattr(slurm, "reachable", lambda address, port, timeout=3.0: False)
    assert run.rendezvous(job_view(_switches("torchtitan/llama3_8b_c4.aws-efa.sbatch")))[0] == "10.0.9.4"
    assert os.environ.get("GLOO_SOCKET_IFNAME") in (None, "ens32")


@pytest.mark.parametrize("name", ["fsdp/fsdp.local-cpu.sbatch", "torchtitan/llama3_8b_c4.crusoe.sbatch"])
def test_a_rendezvous_port_already_listened_on_is_skipped(name, monkeypatch, capsys, no_interface_env):
    """Two jobs rendered with other base ports (or a service) can land on one port of a shared head node: the
    runtime takes the next port nobody listens on (the e2e run once died of EADDRINUSE there)."""
    monkeypatch.setattr(decide, "head_address", lambda *a: ("127.0.0.1", "lo"))
    args = argparse.Namespace(**vars(_switches(name)))
    with socket.socket() as taken, socket.socket() as also_taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            also_taken.bind(("127.0.0.1", port + 1))
            also_taken.listen()
        except OSError:
            pytest.skip(f"port {port + 1} is in use here")
        assert slurm.reachable("127.0.0.1", port)
        args.port = port - 1234 % args.port_span if args.port_span else port  # job 1234 lands on `port`
        assert run.rendezvous(job_view(args, job_id="1234")) == ("127.0.0.1", port + 2)
    out = capsys.readouterr().out
    assert f"rendezvous port {port} is taken on 127.0.0.1; trying {port + 1}" in out
    assert f"rendezvous port {port + 1} is taken on 127.0.0.1; trying {port + 2}" in out
    assert not slurm.reachable("127.0.0.1", port)  # closed again


def test_container_mounts_must_cover_what_the_job_reads(tmp_path):
    """Problem 10: render says which folder no mount covers."""
    spec = make_spec(
        "llama3_8b_c4",
        "generic",
        recipe_dir="/shared/jobs",
        run_dir="/shared/runs/x",
        container_image="nvcr.io#nvidia/pytorch:25.01-py3",
        container_mounts=["/shared/jobs:/shared/jobs"],
    )
    warnings = render_job(spec).warnings
    assert any("run folder" in w and "/shared/runs/x" in w for w in warnings)
    ok = make_spec(
        "llama3_8b_c4",
        "generic",
        recipe_dir="/shared/jobs",
        run_dir="/shared/runs/x",
        container_image="img",
        container_mounts=["/shared:/shared"],
    )
    assert not [w for w in render_job(ok).warnings if "container" in w]


def test_container_mounts_must_cover_the_dataset(tmp_path):
    """Problem 10 for a dataset: render names a dataset path no mount covers; so does the node check."""
    from cookbook_runtime.rehearsal import path_check

    spec = make_spec(
        "llama3_8b_c4",
        "generic",
        recipe_dir="/shared/jobs",
        run_dir="/shared/runs/x",
        container_image="img",
        container_mounts=["/shared:/shared"],
        overrides={"dataloader.dataset_path": "/no-such-store/c4"},
    )
    warnings = [w for w in render_job(spec).warnings if "container" in w]
    assert len(warnings) == 1 and "dataloader.dataset_path" in warnings[0] and "/no-such-store/c4" in warnings[0]
    data = tmp_path / "data" / "c4"
    data.mkdir(parents=True)
    (data / "c4-train.00000-of-01024.json.gz").touch()
    label = "dataloader.dataset_path (the training dataset folder)"
    missed = path_check(label, str(data), "dir", ["c4-train.00000-of-01024.json.gz"], [str(tmp_path / "jobs")])
    assert missed == [f"{label}: {data} is inside no --container-mounts destination ({tmp_path / 'jobs'})"]
    assert path_check(label, str(data), "dir", [], [str(tmp_path / "data") + "/"]) == []
    assert path_check(label, str(data), "dir", [], []) == []  # no container: no mounts to check


def test_node_check_fails_on_changed_intent_profile_settings_and_untagged_logs(monkeypatch):
    """Problems 5/6/7, 9 and 13 fail the rehearsal (not notes); profiling the user asked for is a note."""
    from cookbook_runtime.rehearsal import config_problems, env_problems, log_tag_problems

    m = manifest(GPU_SCRIPTS["torchtitan/flux_schnell.nebius.sbatch"])
    expected = m["expect_config"]["torchtitan"]
    assert not m["profiling_requested"]
    values = {
        "profiler.enable_profiling": True,
        "comm.train_timeout_seconds": 100,
        "training.local_batch_size": 64,
        "parallelism.data_parallel_replicate_degree": 1,
    }
    problems, notes = config_problems(values, expected, 2)
    assert len(problems) == 4 and not notes
    assert any("parallelism.data_parallel_replicate_degree=1 where the recipe sets 2" in p for p in problems)
    assert any("comm.train_timeout_seconds=100" in p and "set comm.train_timeout_seconds=300" in p for p in problems)
    problems, notes = config_problems(values, expected, 2, profiling_requested=True)
    assert len(problems) == 3 and len(notes) == 1 and "profiler.enable_profiling" in notes[0]
    spec = make_spec("flux_schnell", "nebius", overrides=get_recipe("flux_schnell").profiling_overrides())
    assert manifest(render_job(spec).script)["profiling_requested"]
    as_parsed = {k: 2 if v[0] == "$SLURM_JOB_NUM_NODES" else v[0] for k, v in expected.items()}
    assert config_problems(as_parsed, expected, 2) == ([], [])

    efa = manifest(GPU_SCRIPTS["torchtune/llama3_3_70b_lora.aws-efa.sbatch"])["expect_env"]
    monkeypatch.setenv("FI_PROVIDER", "efa")
    monkeypatch.delenv("FI_EFA_USE_HUGE_PAGE", raising=False)
    assert [p for p in env_problems(efa) if p.startswith("FI_EFA_USE_HUGE_PAGE=None where the profile sets '0'")]
    for name, (value, _) in efa.items():
        monkeypatch.setenv(name, value)
    assert env_problems(efa) == []

    monkeypatch.setenv("SLURM_LABELIO", "1")
    monkeypatch.setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
    assert log_tag_problems({"tee": "3"}) == []
    assert "global rank" in log_tag_problems({})[0]
    monkeypatch.setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}]:")
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in log_tag_problems({"tee": "3"})[0]
    monkeypatch.delenv("SLURM_LABELIO")
    assert log_tag_problems({"tee": "3"})


def test_node_check_looks_for_the_efa_or_infiniband_device(tmp_path, monkeypatch):
    """Problem 9: the fabric the profile names must have a device under /sys/class/infiniband; a problem on a
    GPU node, a note on a node without nvidia-smi (the CPU bench)."""
    from cookbook_runtime import nodecheck
    from cookbook_runtime.rehearsal import rdma_check

    sysfs = tmp_path / "infiniband"
    monkeypatch.delenv("NCCL_IB_HCA", raising=False)
    monkeypatch.setenv("FI_PROVIDER", "efa")
    monkeypatch.setattr(nodecheck, "PLUGIN_DIRS", (str(tmp_path / "ofi-nccl"),))
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    info, problems, notes = rdma_check(sysfs, gpu_node=True)
    assert info["devices"] == [] and len(problems) == 2 and not notes
    assert "FI_PROVIDER=efa but no EFA device" in problems[0] and "ibv_devices" in problems[0]
    assert "aws-ofi-nccl's NCCL plugin (libnccl-net*.so)" in problems[1]  # #30 item 4: else NCCL uses sockets
    info, problems, notes = rdma_check(sysfs, gpu_node=False)
    assert not problems and "FI_PROVIDER=efa" in notes[0]
    (sysfs / "rdmap16s27").mkdir(parents=True)
    (tmp_path / "ofi-nccl").mkdir()
    (tmp_path / "ofi-nccl" / "libnccl-net-ofi.so").touch()
    assert rdma_check(sysfs, gpu_node=True)[1:] == ([], [])
    monkeypatch.delenv("FI_PROVIDER")
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5")
    assert "NCCL_IB_HCA=mlx5 matches no device" in rdma_check(sysfs, gpu_node=True)[1][0]
    (sysfs / "mlx5_0").mkdir()
    assert rdma_check(sysfs, gpu_node=True)[1:] == ([], [])
    monkeypatch.setenv("NCCL_IB_HCA", "=mlx5_1:1,=mlx5_2")
    assert rdma_check(sysfs, gpu_node=True)[1]
    monkeypatch.setenv("NCCL_IB_HCA", "=mlx5_0:1")
    assert rdma_check(sysfs, gpu_node=True)[1:] == ([], [])
    monkeypatch.setenv("NCCL_IB_HCA", "^mlx5_3")  # exclusions only: nothing to look for
    assert rdma_check(tmp_path / "none", gpu_node=True)[1:] == ([], [])


def test_plain_sbatch_needs_no_folder_created_first(tmp_path):
    """Problem 11: the log goes where sbatch runs; the old logs/ default is caught before submission."""
    for text in SCRIPTS.values():
        assert "#SBATCH --output=%x-%j.out" in text
    script = write_job(make_spec("fsdp_llama3_1_8b", "generic"), tmp_path / "job.sbatch")
    assert not static_problems(script.read_text(), script)
    broken = tmp_path / "old.sbatch"
    broken.write_text(script.read_text().replace("--output=%x-%j.out", "--output=logs/%x-%j.out"))
    assert any("does not create logs/" in p for p in static_problems(broken.read_text(), broken))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_log_line_is_tagged_with_node_and_rank(name, no_interface_env):
    """Problem 13: srun --label (the node index) and torchrun --role=rank --tee=3 ("[rankN]:"), the launcher's
    flags before the program's own arguments; the template of the global rank is the next test's."""
    args = _switches(name)
    command = _launch(args)
    assert "--label" in command[: command.index("--kill-on-bad-exit=1")]
    flags = command[: len(command) - len(_program(args))]
    assert "--role=rank" in flags and "--tee=3" in flags
    assert "--local-ranks-filter=0" in flags  # #30 item 9: each node's first rank in the job log, all in files
    assert not any(f.startswith("--log-dir") for f in flags)  # #41 item 6: the launcher's, node-local
    assert command[len(flags) :] == _program(args)


@pytest.mark.slow
def test_the_job_log_gets_the_first_rank_of_the_node_and_every_rank_writes_its_own_file(tmp_path):
    """#30 item 9 on real torchrun, with the runtime's own output flags: 2 ranks on a node, rank 0's line in the
    console (the job log), each rank's line in its own file under --log-dir."""
    ran = FakeSlurm(tmp_path / "slurm").run_step(
        runtime_argv(SCRIPTS["fsdp/fsdp.nebius.sbatch"]), COOKBOOK_PREFLIGHT="0"
    )
    (launch,) = ran.launches()
    output = [a for a in launch["argv"] if a.startswith(("--tee=", "--local-ranks-filter=", "--role="))]
    worker = tmp_path / "worker.py"
    worker.write_text("import os\nprint('Batch 0 Loss: 1.5 from rank', os.environ['RANK'], flush=True)\n")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node=2", *output, f"--log-dir={tmp_path}/logs", str(worker)]
    env = {**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
    console = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=True).stdout
    assert [ln for ln in console.splitlines() if "Loss" in ln] == ["[rank0]:Batch 0 Loss: 1.5 from rank 0"], console
    files = sorted((tmp_path / "logs").rglob("stdout.log"))
    assert [f.read_text().strip() for f in files] == [f"Batch 0 Loss: 1.5 from rank {r}" for r in (0, 1)]


def test_the_ranks_log_lines_carry_the_global_rank(tmp_path):
    """torchrun's own tag is the LOCAL rank (the same on every node): the batch step, run for real with stand-in
    srun/scontrol, hands the ranks a template naming ${rank}, which torchrun fills in."""
    ran = FakeSlurm(tmp_path).run_step(runtime_argv(SCRIPTS["fsdp/fsdp.generic.sbatch"]), COOKBOOK_PREFLIGHT="0")
    (launch,) = ran.launches()
    assert launch["env"]["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:", ran.out
    assert {"--label", "--role=rank", "--tee=3", "--local-ranks-filter=0"} <= set(launch["argv"])


def _torchrun_node(node_rank: int, port: int, worker: Path, prefix_line: str, tmp: Path) -> subprocess.Popen:
    """One node of a 2-node torchrun (static rendezvous on this machine: node_rank fixed), launched as the
    runtime launches it (``--role=rank --tee=3``) after the batch step's prefix template."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = (
        f"{prefix_line}\n{torchrun} --nnodes=2 --node-rank={node_rank} --nproc-per-node=1 "
        f"--master-addr=127.0.0.1 --master-port={port} --role=rank --tee=3 --log-dir={tmp}/logs{node_rank} {worker}"
    )
    return subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_log_lines_carry_the_global_rank_and_the_parser_keeps_rank_0(tmp_path):
    """Problem 13 on real torchrun: node 1's process is tagged [rank1] (torchrun's default tag is the local
    rank: [rank0] on every node), and parse_log keeps rank 0's numbers from a log where node 1 comes first."""
    from cookbook.metrics import parse_log

    argv = runtime_argv(SCRIPTS["fsdp/fsdp.generic.sbatch"])
    (launch,) = FakeSlurm(tmp_path / "slurm").run_step(argv, COOKBOOK_PREFLIGHT="0").launches()
    template = launch["env"]["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"]  # what the batch step hands the ranks
    line = f"export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE={shlex.quote(template)}"
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os\nr = int(os.environ['RANK'])\n"
        "print(f'2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: {1.5 + r}, Speed: 4.88 samples/sec, "
        "lr: 0.000100', flush=True)\n"
    )

    def two_nodes(prefix_line: str) -> list[str]:  # a 2-node torchrun on this machine
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        nodes = [_torchrun_node(i, port, worker, prefix_line, tmp_path / prefix_line[:6]) for i in (0, 1)]
        outs = [n.communicate(timeout=120)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], outs
        # as srun --label writes them; node 1's lines first
        return [f"{i}: {ln}" for i in (1, 0) for ln in outs[i].splitlines() if "Loss" in ln]

    tagged = two_nodes(line)
    assert any(ln.startswith("1: [rank1]:") for ln in tagged), tagged
    # without the line, torchrun tags node 1's process with its local rank: [rank0]
    assert not any(ln.startswith("1: [rank0]:") for ln in tagged), tagged
    log = tmp_path / "job.out"
    log.write_text("\n".join(tagged) + "\n")
    df = parse_log(log)
    assert list(df["loss"]) == [1.5] and list(df["rank"]) == [0], df
    assert list(parse_log(log, ranks="all").sort_values("rank")["loss"]) == [1.5, 2.5]


def test_manifest_names_the_recipe_paths_and_intent():
    m = manifest(GPU_SCRIPTS["torchtitan/flux_schnell.aws-efa.sbatch"])
    keys = {e["key"]: e for e in m["paths"]["torchtitan"]}
    assert keys["hf_assets_path"]["expect"] == ["model_index.json"] and keys["encoder.t5_encoder"]["hub_ok"]
    assert m["uses_gpus"] and m["expect_env"]["FI_EFA_USE_HUGE_PAGE"][0] == "0"
    assert "profiler.enable_profiling" in m["expect_config"]["torchtitan"]
    tune = manifest(GPU_SCRIPTS["torchtune/llama3_3_70b_full.generic.sbatch"])
    assert {e["key"] for e in tune["paths"]["torchtune"]} >= {"checkpointer.checkpoint_dir", "tokenizer.path"}


def test_node_check_masks_secrets_and_knows_secret_names():
    from cookbook_runtime import rehearsal as node_check

    for name in (
        "HF_TOKEN",
        "WANDB_API_KEY",
        "HUGGING_FACE_HUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "MLFLOW_TRACKING_PASSWORD",
    ):
        assert node_check.SECRET.search(name), name
    for name in ("TOKENIZERS_PARALLELISM", "NCCL_SOCKET_IFNAME", "KEYBOARD"):
        assert not node_check.SECRET.search(name), name
    assert node_check.mask("tune run x hf_abcdef123", ["hf_abcdef123"]) == "tune run x ***"


def test_node_check_splits_launcher_arguments():
    from cookbook_runtime.rehearsal import launcher_split, program_of

    words, flags, args = launcher_split(
        [
            "tune",
            "run",
            "--nnodes=2",
            "--nproc-per-node=8",
            "--rdzv-endpoint=h:1",
            "--role=rank",
            "--tee=3",
            "full_finetune_distributed",
            "--config",
            "x.yaml",
        ]
    )
    assert words == ["tune", "run"] and flags["nproc-per-node"] == "8" and flags["tee"] == "3"
    assert program_of(words, args) == ("torchtune", ["full_finetune_distributed", "--config", "x.yaml"])
    words, flags, args = launcher_split(["torchrun", "--nnodes=2", "-m", "torchtitan.train", "--module", "m"])
    assert program_of(words, args) == ("torchtitan", ["--module", "m"])
    words, flags, args = launcher_split(["torchrun", "--nnodes=2", "/r/train.py", "--model=x"])
    assert program_of(words, args) == ("fsdp", ["/r/train.py", "--model=x"])


def test_rehearse_refuses_what_it_cannot_run(tmp_path):
    """Bad input: one line on stderr, exit 2, never a traceback (the real command, as a user runs it)."""
    plain = tmp_path / "plain.sbatch"
    plain.write_text("#!/bin/bash\nsrun hostname\n")
    good = Path(__file__).resolve().parents[2] / "slurm-recipes" / "fsdp" / "fsdp.generic.sbatch"
    blocked = tmp_path / "blocked" / good.name  # its report folder cannot be made (root may write anywhere)
    blocked.parent.mkdir()
    blocked.write_text(good.read_text())
    (blocked.parent / ".rehearsal").write_text("a file where the rehearsal's folder goes")
    for args, said in (
        ([str(tmp_path / "missing.sbatch")], "no such script"),
        ([str(plain)], "not a cookbook script"),
        ([str(good), "--json", str(tmp_path / "no-such-folder" / "r.json")], "--json"),
        ([str(blocked)], "cannot write the rehearsal's files"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "cookbook", "rehearse", *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, r.stderr
    assert not (good.parent / ".rehearsal").exists()  # refused before anything was written or submitted


def test_slurm_recipes_folders_run_as_they_are():
    root = Path(__file__).resolve().parents[2] / "slurm-recipes"
    for rel in SCRIPTS:
        script = root / rel
        assert not static_problems(script.read_text(), script), rel


def test_readme_lists_every_start_path():
    from cookbook.render import START_PATHS_BEGIN, with_start_paths_table

    readme = (Path(__file__).resolve().parents[2] / "slurm-recipes" / "README.md").read_text()
    assert START_PATHS_BEGIN in readme
    assert with_start_paths_table(readme) == readme, "run `make recipes`: the start-paths table drifted"
    assert "`MODEL_DIR` | `checkpointer.checkpoint_dir`" in readme and "`encoder.autoencoder_path`" in readme


def test_node_check_names_a_python_without_the_framework_and_one_that_cannot_run_here(tmp_path):
    """#30 items 1 and 6: the training interpreter must have torch and the framework at the tested versions and
    run on the node (a venv built on an x86 login node does not run on an aarch64 GB200 node)."""
    import platform

    from cookbook_runtime.rehearsal import python_environment

    answer, problems = python_environment(sys.executable, {"torch": "2.13.0", "nosuchframework": ""}, "x86_64")
    assert answer["versions"]["torch"].startswith("2.13.0") and answer["machine"] == platform.machine()
    assert problems == [p for p in problems if "nosuchframework is not installed for" in p] and len(problems) == 1
    assert "VENV=" in problems[0]
    _, problems = python_environment(sys.executable, {"torch": "9.9.9"}, "")
    assert problems[0].startswith("torch 2.13.0") and "tested with 9.9.9" in problems[0]
    foreign = tmp_path / "python3"
    foreign.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))  # an ELF header of no machine this one runs
    foreign.chmod(0o755)
    _, problems = python_environment(str(foreign), {"torch": ""}, "aarch64" if platform.machine() != "aarch64" else "x")
    assert len(problems) == 1 and f"the training interpreter {foreign} does not run here (this node is" in problems[0]
