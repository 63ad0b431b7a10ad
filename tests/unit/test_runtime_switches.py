"""The short script and the runtime agree: every committed script's launch line is one the runtime accepts,
states the profile's thresholds, and the scripts stay short."""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from batch_step import EXEC, committed_scripts

from cookbook.spec import profiles
from cookbook_runtime import run

ROOT = Path(__file__).resolve().parents[2] / "slurm-recipes"
SCRIPTS = committed_scripts()


def launch_words(text: str) -> list[str]:
    """The words of the script's last line (``exec python3 -m cookbook_runtime.run ...``) as bash expands them,
    with the script's own variables set as a job would have them."""
    exec_at = text.index(EXEC)
    line = text[exec_at:].replace(EXEC, "printf '%s\\0'", 1)
    env = {"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": "/submit", "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}
    head = text[text.index("# --- where things are") : text.index("export PYTHONPATH=")]  # the FSDP MODEL's sizes too
    out = subprocess.run(["bash", "-c", head + line], env=env, capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_launch_line_is_one_the_runtime_accepts(name: str):
    args = run.build_parser().parse_args(launch_words(SCRIPTS[name]))
    launcher = args.launcher[1:] if args.launcher[:1] == ["--"] else args.launcher
    assert launcher[0] in ("torchrun", "tune"), launcher[:3]
    assert args.gate and args.max_retries >= 0
    assert args.requeue == ("#SBATCH --requeue" in SCRIPTS[name])
    assert (args.once and args.resume != "none") == ("_use." not in name and "flux_schnell_use" not in name)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_launch_line_states_the_profiles_gate_thresholds(name: str):
    profile = profiles()[name.rsplit(".", 2)[1]]
    gate = profile.gate()
    args = run.build_parser().parse_args(launch_words(SCRIPTS[name]))
    assert args.gate_seconds == gate.time_limit_s.value
    assert args.gate_busbw_floor == gate.allreduce_min_busbw_gbps.value
    assert args.gate_min_free_gb == gate.min_free_disk_gb.value
    assert args.gate_allreduce_mb == gate.allreduce_mb
    assert args.max_retries == gate.max_retries.value
    if gate.matmul_fraction:
        assert args.gate_matmul_fraction == gate.matmul_fraction.value
    gpus_from_slurm = args.nproc_per_node == 0  # the GPU count is written once, in #SBATCH --gpus-per-node
    assert gpus_from_slurm == (".local-cpu." not in name)


def test_the_scripts_are_short_and_slurm_recipes_small():
    """Issue #29: the nebius LoRA script at most 60 lines, slurm-recipes/ at most 8,900 (8,000 until issue #40's
    recovery inside the allocation added ~330 runtime lines: spares, the node watch, the requeue of the same job;
    then #41's ~180: the space check's certainty, the lead read from #SBATCH --signal, the gate's restart
    shortcut; the scripts did not grow; then #41's ~280 more: the quota, the model's own stop, the kernel log's
    XIDs, the unshared node, torch's extension, Slurm's failures said, and a line per script: $VENV's python3),
    no file twice."""
    assert len(SCRIPTS["torchtune/llama3_3_70b_lora.nebius.sbatch"].splitlines()) <= 60
    files = [p for p in ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    # +80 for #41 item 6: each node's rank output in one file, one shared HANG poll a node; +260 for #41 item 3's
    # pairwise bandwidth gate: two rounds of node pairs through the store, the verdict naming a node, the fabric stop;
    # +680 for #43 item 1: the rehearsal's node check moved into the runtime (the programs moved in too, from copies
    # here, so they cost nothing); +276 for #43 item 5's split of the runtime's functions over 60 lines (fsdp_train,
    # rehearsal, run, the titan trainer, use_lm, nodecheck, decide) into named steps: helpers' defs, docstrings, blanks
    # +235 for #43's last node programs moved in from cookbook/: the doctor's probe (templates/doctor_probe.sh, as
    # probe.py: the node facts the gate, the rehearsal and the probe now share) and torchtitan's triton stand-in
    # (recipes/titan_import.py, 110 lines), less the rehearsal's own copies of those readers (-26)
    # +71 for #40/#41's recovery fixes: srun's word for a launcher killed outright, the spent budget's later start
    # (requeuehold/StartTime/release), the requeue said only once accepted; +88 for #41 items 3 and 6's gate fixes
    # (each pair's group under the gate's timeout, one report a node gathered by local rank 0, a TERM writer for what
    # the gate has) and the shortcut line's regex that goodput reads; +9 for srun's lines read back from the job
    # log rather than relayed (a relay reordered the training's lines)
    assert sum(len(p.read_text().splitlines()) for p in files) <= 10599
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
    assert len(set(digests)) == len(digests)


def test_the_plain_launch_is_written_beside_the_runtimes():
    """For people who want none of the runtime: the plain srun torchrun line, as a comment."""
    text = SCRIPTS["torchtune/llama3_3_70b_lora.nebius.sbatch"]
    assert "# Without the runtime: srun --ntasks-per-node=1 tune run --nnodes=" in text
    assert shlex.split(text.splitlines()[-1])[0] == 'output_dir="${RUN_DIR}"'.replace('"', "")


# ``import cookbook``/``from cookbook...``, and the ways around an import statement: importlib's
# ``import_module("cookbook...")``/``__import__``/``find_spec``, or a module loaded from a file of the package
# (``spec_from_file_location(..., ".../cookbook/...")``, ``runpy``)
NEEDS_COOKBOOK = re.compile(
    r"^\s*(?:from|import)\s+cookbook(?:\.|\s|$)"
    r"|(?:import_module|__import__|find_spec|run_module)\(\s*[\"']cookbook(?:\.|[\"'])"
    r"|(?:spec_from_file_location|run_path|SourceFileLoader)\([^)]*[\"'][^\"']*\bcookbook/",
    re.M,
)


def test_the_finder_sees_every_way_to_load_the_cookbook_package():
    """Issue #43: the rehearsal loaded ``cookbook.recipes.titan_import`` through importlib, which an import-statement
    regex cannot see."""
    caught = [
        "from cookbook.recipes import x",
        "import cookbook",
        '    stand_in = importlib.import_module("cookbook.recipes.titan_import")',
        "__import__('cookbook')",
        'importlib.util.find_spec("cookbook.local")',
        'spec_from_file_location("t", "/repo/cookbook/recipes/titan_import.py")',
        'runpy.run_module("cookbook.local.compat.cpu")',
    ]
    missed = ["from cookbook_runtime import probe", 'import_module("cookbook_runtime.titan_import")',
              "# the cookbook package", 'spec_from_file_location("cookbook_fsdp_train", args[0])']  # fmt: skip
    assert all(NEEDS_COOKBOOK.search(line) for line in caught)
    assert not any(NEEDS_COOKBOOK.search(line) for line in missed)


def test_no_gpu_script_or_shipped_file_needs_the_cookbook_package():
    """The nodes of a GPU cluster need torch and the framework, never ``cookbook`` (local-cpu scripts name its
    CPU shims, the local bench's): no shipped file imports it, by statement or through importlib."""
    shipped = [p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts]
    assert shipped and not [p for p in shipped if NEEDS_COOKBOOK.search(p.read_text())]
    gpu = {n: t for n, t in SCRIPTS.items() if ".local-cpu." not in n}
    assert gpu and not [n for n, t in gpu.items() if re.search(r"\bcookbook\.", t)]


def test_a_container_job_imports_its_image_once_per_node(tmp_path):
    """#30 item 7 (no pyxis here: the rendered lines, run by the batch step against a fake Slurm): every srun
    of the job -- the nodes' Python, the gate, the launch -- names the image and one container name, so pyxis
    imports the image once per node and reuses it (its container_scope is the job)."""
    from batch_step import FakeSlurm, runtime_argv

    from cookbook.render import render_job
    from cookbook.spec import make_spec

    spec = make_spec("llama3_3_70b_lora", profile="nebius", container_image="/shared/slurm-cookbook.sqsh",
                     container_mounts=["/shared:/shared"])  # fmt: skip
    script = render_job(spec).script
    assert "VENV=" not in script  # the image's Python, not a venv of the login node
    ran = FakeSlurm(tmp_path).run_step(runtime_argv(script), SLURM_GPUS_ON_NODE="8")
    sruns = ran.argv("srun")
    assert len(sruns) == 3, ran.out
    for argv in sruns:
        assert "--container-image=/shared/slurm-cookbook.sqsh" in argv and "--container-mounts=/shared:/shared" in argv
        assert [a for a in argv if a.startswith("--container-name=")] == [f"--container-name={spec.name}"]
