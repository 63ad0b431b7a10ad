"""`cookbook rehearse` on the GPU-shaped local cluster: every committed GPU script of slurm-recipes/ runs as
it is (8 GPUs per node advertised through Slurm GRES, --exclusive, the profile's environment), with the
launcher swapped for the node check, over a staged model layout with the real file names of the 70B, 8B
and FLUX downloads (empty files: only their presence is read). Then deliberately broken scripts, one per
problem of the rehearsal issue, each caught with the node that has it.

The rehearsals are submitted together and collected afterwards, so the cluster runs several at once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook.paths import project_root
from cookbook.rehearsal import RehearsalReport, finish_rehearsal, rehearse, start_rehearsal
from cookbook.slurm.client import SlurmClient

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RECIPES = project_root() / "slurm-recipes"
# the committed scripts (test_render holds them equal to the generator's): what a user copies and rehearses
GPU_SCRIPTS = sorted(f"{p.parent.name}/{p.name}" for p in RECIPES.glob("*/*.sbatch") if ".local-cpu." not in p.name)
SECRET = "hf_rehearsalSECRET0123456789"

# the files of each download (names as on the Hub; contents empty)
LLAMA_70B = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "original/params.json",
    "original/tokenizer.model",
    *(f"model-{i:05d}-of-00030.safetensors" for i in range(1, 31)),
]
LLAMA_8B = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "original/params.json",
    "original/tokenizer.model",
    *(f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)),
]
FLUX_SCHNELL = [
    "model_index.json",
    "ae.safetensors",
    "flux1-schnell.safetensors",
    "scheduler/scheduler_config.json",
    "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors.index.json",
    "text_encoder/config.json",
    "text_encoder_2/config.json",
    "tokenizer/vocab.json",
    "tokenizer_2/spiece.model",
    "vae/config.json",
]


def stage(root: Path) -> dict[str, str]:
    """The three downloads under ``root/models``; the variables that point the scripts at them."""
    layout = {"Llama-3.3-70B-Instruct": LLAMA_70B, "Llama-3.1-8B": LLAMA_8B, "FLUX.1-schnell": FLUX_SCHNELL}
    for model, files in layout.items():
        for name in files:
            path = root / "models" / model / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    # the training runs the *_use scripts read: a torchtune run folder, a torchtitan one with its checkpoints
    for name in ("trained/torchtune/torchtune_config.yaml", "trained/flux/checkpoint/step-4/.metadata"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return {"FLUX_DIR": str(root / "models" / "FLUX.1-schnell")}


def hf_token_file(root: Path) -> Path:
    """A token file holding SECRET, as `hf auth login` writes one (outside the rehearsals' folders)."""
    path = root / "hf-token"
    if not path.exists():
        path.write_text(SECRET)
    return path


def job_env(root: Path, script: str) -> dict[str, str]:
    """What a user exports before `sbatch`: the model folder, a run folder, the training venv."""
    model = "Llama-3.1-8B" if "llama3_8b_c4" in script else "Llama-3.3-70B-Instruct"
    return {
        "MODEL_DIR": str(root / "models" / model),
        "FLUX_DIR": str(root / "models" / "FLUX.1-schnell"),
        "RUN_DIR": str(root / "runs" / Path(script).stem),
        "TRAINED_DIR": str(root / "trained" / ("flux" if "flux" in script else "torchtune")),
        "HF_TOKEN": SECRET,  # not given to Slurm: the job reads it from the token file (issue 40)
        "HF_TOKEN_PATH": str(hf_token_file(root)),
        "VENV": sys.prefix,  # the script's Python environment (its default: the checkout's .venv, this one here)
    }


@pytest.fixture(scope="module")
def gpu(gpu_cluster):
    return SlurmClient(gpu_cluster.env())


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("rehearse")
    stage(root)
    return root


def run_all(gpu: SlurmClient, jobs: dict[str, tuple[Path, dict[str, str]]], folder: Path) -> dict[str, RehearsalReport]:
    """Start every rehearsal, then collect them all (the cluster runs as many at once as it has nodes)."""
    started = {
        name: start_rehearsal(script, gpu, folder=folder / name.replace("/", "_"), env=env)
        for name, (script, env) in jobs.items()
    }
    return {name: finish_rehearsal(r, timeout=1200) for name, r in started.items()}


def test_every_committed_gpu_script_passes_its_rehearsal(gpu, staged):
    reports = run_all(gpu, {n: (RECIPES / n, job_env(staged, n)) for n in GPU_SCRIPTS}, staged / "reh")
    failed = {n: r.table() for n, r in reports.items() if not r.ok}
    assert not failed, "\n\n".join(failed.values())
    for name, report in reports.items():
        nodes = 1 if "_use." in name else 2  # a job using a trained model runs on one node
        assert len(report.nodes) == nodes and len({n.node for n in report.nodes}) == nodes, name
        for node in report.nodes:
            d = node.facts
            assert d["gpus"]["visible"] == 8 and d["gpus"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7", name
            assert d["cpus"]["step"] == d["cpus"]["job_on_node"] == 192, (name, d["cpus"])
            assert d["config"].startswith("parsed by"), name
            assert d["launcher"].endswith(("/torchrun", "/tune")), name
            assert "(hidden)" in d["env"]["HF_TOKEN"]
            assert d["env"]["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:", name
        assert report.nodes[0].facts["rendezvous"]["reached_by"] == [n.facts["host"] for n in report.nodes[1:]], name
        if ".nebius." in name or ".crusoe." in name:
            assert {n.facts["network"]["NCCL_SOCKET_IFNAME"] for n in report.nodes} == {"eth0"}, name
        if "flux_schnell" in name:
            paths = report.nodes[-1].facts["paths"]
            assert paths["encoder.autoencoder_path"].endswith("FLUX.1-schnell/ae.safetensors")
    # a secret in the environment is in no report, log or manifest
    hits = [p for p in (staged / "reh").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert hits == []


def _copy(name: str, dest: Path) -> Path:
    """A copy of a committed script's folder (script + configs) to break."""
    src = RECIPES / name
    shutil.copytree(src.parent, dest, ignore=shutil.ignore_patterns("*.sbatch", ".rehearsal", "runs"))
    shutil.copy(src, dest / src.name)
    runtime = RECIPES / "cookbook_runtime"  # beside the folder, as shipped ($RUNTIME_DIR = $RECIPE_DIR/..)
    shutil.copytree(
        runtime, dest.parent / runtime.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest / src.name


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new))


@pytest.fixture
def hidden_but_on_n1(gpu_cluster, staged):
    """The 70B model folder present on node n1 only: on every other node an empty folder is bind-mounted
    over it in that node's mount namespace (the jobs its slurmd starts see that; n1 and this machine do not)."""
    target = staged / "models" / "Llama-3.3-70B-Instruct"
    empty = staged / "empty"
    empty.mkdir(exist_ok=True)
    pids = [
        pid for name, pid in gpu_cluster.status().daemons.items() if name.startswith("slurmd ") and name != "slurmd n1"
    ]
    for pid in pids:
        subprocess.run(
            ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "mount", "--bind", str(empty), str(target)], check=True
        )
    yield target
    for pid in pids:
        subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "umount", str(target)], check=True)


def test_each_problem_is_caught_on_a_deliberately_broken_script(gpu, staged, tmp_path, hidden_but_on_n1):
    jobs: dict[str, tuple[Path, dict[str, str]]] = {}

    def broken(key: str, name: str) -> Path:
        script = _copy(name, tmp_path / key / Path(name).parent.name)  # a runtime of its own: one is edited
        jobs[key] = (script, job_env(staged, name))
        return script

    # 1. a line added by hand expanding an empty array unguarded (bash < 4.4 aborts) -- caught before submission
    launch = "exec python3 -m cookbook_runtime.run"
    s = broken("array", "torchtitan/llama3_8b_c4.generic.sbatch")
    _edit(s, launch, 'EXTRA=()\necho "${EXTRA[@]}"\n' + launch)
    # 2. a head node taken by hand with `head` (SIGPIPE on large allocations)
    s = broken("head", "fsdp/fsdp.generic.sbatch")  # MODEL unset: the default, llama3_1_8b
    _edit(s, launch, 'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n' + launch)
    # 3. a config another script wrote for itself
    s = broken("config", "torchtune/llama3_3_70b_lora.generic.sbatch")
    (s.parent / "other.sbatch").write_text(s.read_text())
    _edit(s.parent / "llama3_3_70b_lora.yaml", "# output_dir is set", "# for other.sbatch\n# output_dir is set")
    # 4. FLUX without its autoencoder path (torchtitan's relative default) and a download without ae.safetensors
    s = broken("flux", "torchtitan/flux_schnell.nebius.sbatch")
    _edit(s, '  --encoder.autoencoder_path "${FLUX_DIR}"/ae.safetensors \\\n', "")
    # 5, 6, 7: profiling on (torchtitan's default, as the config had it), plain FSDP at batch 64, the 100 s
    # collective timeout
    s = broken("titan-defaults", "torchtitan/flux_schnell.crusoe.sbatch")
    titan = s.parent.parent / "cookbook_runtime" / "programs" / "cookbook_titan.py"  # its copy's runtime
    _edit(titan, "cfg.profiler.enable_profiling = False", "cfg.profiler.enable_profiling = True")
    _edit(
        s,
        '  --parallelism.data_parallel_replicate_degree "${SLURM_JOB_NUM_NODES}" \\\n',
        "  --training.local_batch_size 64 \\\n  --comm.train_timeout_seconds 100 \\\n",
    )
    # ... and profiling the user asked for (rendered with the profiling overrides): a note, not a problem
    s = broken("profiling-asked", "torchtitan/llama3_8b_c4.crusoe.sbatch")
    _edit(s, "  --dump_folder ", "  --profiler.enable_profiling \\\n  --dump_folder ")
    # 8. CPUs asked for: the runtime passes them to srun (Slurm 22.05's srun does not inherit them)
    s = broken("cpus", "fsdp/fsdp.nebius.sbatch")
    jobs["cpus"][1]["MODEL"] = "llama3_2_1b"
    _edit(s, "#SBATCH --exclusive\n", "#SBATCH --exclusive\n#SBATCH --cpus-per-task=16\n")
    # 9. an interface name the nodes do not have; an EFA setting missing
    s = broken("iface", "torchtune/llama3_3_70b_lora.aws-efa.sbatch")
    _edit(s, "export FI_EFA_USE_HUGE_PAGE=0", "export NCCL_SOCKET_IFNAME=ib-nope")
    # 10. a container whose mounts miss the model (and this cluster has no pyxis)
    s = broken("mounts", "torchtune/llama3_3_70b_full.generic.sbatch")
    mounts = f"--srun-arg=--container-image=img --srun-arg=--container-mounts={s.parent}:{s.parent}"
    _edit(s, "  --requeue", f"  {mounts} \\\n  --requeue")
    # 11. the log in a folder Slurm does not create
    s = broken("logs", "fsdp/fsdp.crusoe.sbatch")
    jobs["logs"][1]["MODEL"] = "mistral_7b"
    _edit(s, "#SBATCH --output=%x-%j.out", "#SBATCH --output=logs/%x-%j.out")
    # 12. the model folder missing on the nodes but n1 (hidden_but_on_n1): the committed script, pinned to n1
    # and n2 (the preset has 4 nodes)
    s = broken("one-node", "torchtune/llama3_3_70b_full.crusoe.sbatch")
    _edit(s, "#SBATCH --nodes=2\n", "#SBATCH --nodes=2\n#SBATCH --nodelist=n1,n2\n")
    # 13. a tensor-parallel degree that does not divide the GPUs (a hand-edited config)
    s = broken("untagged-tp", "torchtune/llama3_3_70b_full.nebius.sbatch")
    cfg = s.parent / "llama3_3_70b_full.yaml"
    cfg.write_text(cfg.read_text() + "tensor_parallel_dim: 3\n")

    flux_dir = staged / "models" / "FLUX.1-no-ae"
    shutil.copytree(staged / "models" / "FLUX.1-schnell", flux_dir)
    (flux_dir / "ae.safetensors").unlink()
    jobs["flux"][1]["FLUX_DIR"] = str(flux_dir)

    r = run_all(gpu, jobs, tmp_path / "reh")

    def said(key: str, text: str, node: str | None = None, note: bool = False) -> bool:
        rep = r[key]
        if node is None and any(text in p for p in rep.problems):
            return True
        return any(text in x for n in rep.nodes if node in (None, n.node) for x in (n.notes if note else n.failures))

    assert not r["array"].ok and said("array", "bash before 4.4")
    assert not r["head"].ok and said("head", "SIGPIPE")
    assert not r["config"].ok and said("config", "was written for other.sbatch")
    flux = r["flux"]
    assert not flux.ok and all(
        any("encoder.autoencoder_path" in p and "relative path" in p for p in n.failures) for n in flux.nodes
    )
    assert not said("flux", "hf_assets_path")  # the folder itself is there
    assert not r["titan-defaults"].ok
    for key, text in (
        ("parallelism.data_parallel_replicate_degree=1", "HSDP"),
        ("profiler.enable_profiling=True", "on request"),
        ("comm.train_timeout_seconds=100", "shared filesystem"),
        ("training.local_batch_size=64", "32 images"),
    ):
        assert all(any(key in x and text in x for x in n.failures) for n in r["titan-defaults"].nodes), key
    asked = r["profiling-asked"]
    assert asked.ok and all(any("profiling was asked for" in x for x in n.notes) for n in asked.nodes), asked.table()
    cpus = r["cpus"]
    assert cpus.ok and all(n.facts["cpus"]["step"] == n.facts["cpus"]["job_on_node"] == 16 for n in cpus.nodes), cpus
    for key, text in (
        ("iface", "NCCL_SOCKET_IFNAME=ib-nope: no such interface"),
        ("iface", "FI_EFA_USE_HUGE_PAGE=None where the profile sets '0'"),
        ("untagged-tp", "tensor_parallel_dim=3 does not divide the 8 processes per node"),
    ):
        assert not r[key].ok and len(r[key].nodes) == 2, (key, r[key].table())
        assert all(any(text in x for x in n.failures) for n in r[key].nodes), (key, text, r[key].table())
    assert (
        not r["mounts"].ok
        and said("mounts", "has no such option (the pyxis plugin")
        and said("mounts", "inside no --container-mounts")
    )
    assert not r["logs"].ok and said("logs", "does not create logs/")
    one = r["one-node"]
    assert not one.ok and [n.node for n in one.nodes] == ["n1", "n2"], one.table()
    assert [n.node for n in one.nodes if not n.ok] == ["n2"], one.table()
    assert any("checkpointer.checkpoint_dir" in p and "lacks config.json" in p for p in one.nodes[1].failures)
    hits = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert hits == []


def _assert_no_secret(paths: list[Path]) -> None:
    """No file at or under ``paths`` holds the secret (checked before the rehearsal folder is deleted)."""
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    assert files and [f for f in files if SECRET.encode() in f.read_bytes()] == []


def test_cli_rehearse_prints_the_table_and_exits_0_only_when_every_node_passes(gpu_cluster, staged, tmp_path):
    env = {**gpu_cluster.env(), **job_env(staged, "fsdp/fsdp.generic.sbatch"), "MODEL": "llama3_2_1b"}
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "cookbook",
            "rehearse",
            str(RECIPES / "fsdp/fsdp.generic.sbatch"),
            "--json",
            str(tmp_path / "r.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"^n\d\s+n\d\s+8\s+192/192\s+head, reached by 1", ok.stdout, re.M), ok.stdout
    assert "PASSED" in ok.stdout and SECRET not in ok.stdout + ok.stderr
    _assert_no_secret([tmp_path / "r.json", RECIPES / "fsdp" / ".rehearsal"])
    shutil.rmtree(RECIPES / "fsdp" / ".rehearsal", ignore_errors=True)
    env["NCCL_SOCKET_IFNAME"] = "ib-nope"
    bad = subprocess.run(
        [sys.executable, "-m", "cookbook", "rehearse", str(RECIPES / "fsdp/fsdp.nebius.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    _assert_no_secret([RECIPES / "fsdp" / ".rehearsal"])
    shutil.rmtree(RECIPES / "fsdp" / ".rehearsal", ignore_errors=True)
    assert SECRET not in bad.stdout + bad.stderr
    assert bad.returncode == 1 and re.search(r"problem on n\d: NCCL_SOCKET_IFNAME=ib-nope", bad.stdout), bad.stdout
    assert "Traceback" not in bad.stderr


def test_the_runtime_reads_a_4000_node_allocation_whole_with_slurms_own_scontrol(gpu_cluster, monkeypatch):
    """Problem 2 with Slurm's real scontrol: the runtime reads every host of the allocation (the old bash
    `| head -n 1` died of SIGPIPE under pipefail on large allocations), in Slurm's order."""
    from cookbook_runtime import slurm as runtime_slurm

    for key, value in gpu_cluster.env().items():
        monkeypatch.setenv(key, value)
    hosts = runtime_slurm.hostnames("gpu[1-4000]")
    assert len(hosts) == 4000 and hosts[0] == "gpu1" and hosts[-1] == "gpu4000"


def test_rehearse_with_a_missing_model_names_it_before_training(gpu, staged, tmp_path):
    """The check step a notebook runs: `rehearse` from Python, the model folder missing everywhere."""
    env = {**job_env(staged, "torchtitan/llama3_8b_c4.crusoe.sbatch"), "MODEL_DIR": str(tmp_path / "nowhere")}
    report = rehearse(RECIPES / "torchtitan/llama3_8b_c4.crusoe.sbatch", gpu, folder=tmp_path / "r", env=env)
    assert not report.ok
    assert all(
        any("hf_assets_path" in p and "does not exist on this node" in p for p in n.failures) for n in report.nodes
    )
    assert "FAILED" in report.table()
