"""Rendered scripts: golden text, shell quoting proven under bash, no secrets, slurm-recipes/ in sync."""

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from batch_step import committed_scripts, job_view, runtime_args, unset_env

from cookbook.cli import main
from cookbook.render import generate_recipes, generated_files, quote_with_vars, render_job, write_job
from cookbook.spec import JobSpec, SpecError, make_spec
from cookbook_runtime import resume, run
from cookbook_runtime.probe import build_parser as _probe_parser

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EVIL = "my job 'x\" $(touch PWNED) `touch PWNED2` ${HOME}"

GOLDEN_SPECS = {
    "llama3_3_70b_full.generic.sbatch": JobSpec(
        "llama3_3_70b_full", partition="gpu", account="acct", cpus_per_task=96, recipe_dir="/shared/recipes"
    ),
    "llama3_3_70b_lora.local-cpu.sbatch": JobSpec(
        "llama3_3_70b_lora",
        profile="local-cpu",
        gpus_per_node=0,
        exclusive=False,
        time="00:10:00",
        signal_seconds=30,
        recipe_dir="/r",
        assets_dir="/tiny",
        venv="/venv",
    ),
    "llama3_3_70b_full.generic.slurm-options.sbatch": JobSpec(
        "llama3_3_70b_full",
        partition="gpu",
        account="acct",
        qos="high",
        time="1-00:00:00",
        exclude="gpu[07,12]",
        constraint="h100&ib",
        reservation="maint window",
        mem="0",
        gres="gpu:h100:8",
        sbatch_extra=["--mail-type=END,FAIL", "--comment=two words"],
        recipe_dir="/shared/recipes",
    ),
    "llama3_8b_c4.aws-efa.sbatch": JobSpec(
        "llama3_8b_c4",
        profile="aws-efa",
        recipe_dir="/r",
        container_image="nvcr.io#nvidia/pytorch:25.01-py3",
        container_mounts=["/fsx:/fsx"],
        overrides={"training.steps": "50"},
    ),
    # 16 nodes train, 2 stand by: #SBATCH --nodes=18 and --no-kill, the runtime's --spare-nodes=2, the replica
    # count and the plain-srun comment on the 16
    "llama3_8b_c4.nebius.spare-nodes.sbatch": JobSpec(
        "llama3_8b_c4", profile="nebius", nodes=16, spare_nodes=2, recipe_dir="/r"
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_golden(name):
    text = render_job(GOLDEN_SPECS[name]).script
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"rendered text changed; if intended: UPDATE_GOLDEN=1 pytest {__file__}"
    assert shellcheck(path) == ""


def test_quoting_keeps_values_literal_under_bash(tmp_path):
    quoted = quote_with_vars(EVIL + "/$RUN_DIR/x", ("RUN_DIR",))
    out = subprocess.run(
        ["bash", "-c", f"RUN_DIR=/runs; printf %s {quoted}"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert out == EVIL + "//runs/x"
    assert not list(tmp_path.iterdir())


def test_hostile_job_name_and_paths_are_never_executed(tmp_path):
    spec = JobSpec(
        "llama3_3_70b_lora",
        profile="local-cpu",
        gpus_per_node=0,
        exclusive=False,
        job_name=EVIL,
        log_dir=str(tmp_path / "log s"),
        run_dir=str(tmp_path / EVIL),
        time="10",
    )
    with pytest.raises(SpecError, match="a job name is one folder name"):  # a name is a folder: no shell in it
        write_job(spec, tmp_path / "dir with space" / "job.sbatch")
    assert not (tmp_path / "dir with space").exists()
    spec.job_name = "my-job"  # the paths stay hostile
    script = write_job(spec, tmp_path / "dir with space" / "job.sbatch")
    subprocess.run(["bash", "-n", str(script)], check=True)
    # run every assignment/mkdir line before the first Slurm command, under bash, in tmp_path
    lines = script.read_text().split("# --- cluster profile")[0].split("set -euo pipefail")[1]
    subprocess.run(["bash", "-c", "set -euo pipefail; SLURM_SUBMIT_DIR=.;" + lines], cwd=tmp_path, check=True)
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    assert (tmp_path / EVIL).is_dir()  # RUN_DIR created with the literal name
    output = next(ln for ln in script.read_text().splitlines() if ln.startswith("#SBATCH --output="))
    assert shlex.split(output.split("=", 1)[1]) == [f"{tmp_path}/log s/%x-%j.out"]


def test_hf_token_never_written(tmp_path, monkeypatch):
    token = "hf_SECRETvalue1234567890"
    monkeypatch.setenv("HF_TOKEN", token)
    for name, spec in GOLDEN_SPECS.items():
        write_job(spec, tmp_path / name)
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert len(files) > 3 and not any(token in f.read_text() for f in files)
    assert main(["render", "llama3_3_70b_full", "--env", f"HF_TOKEN={token}", "-o", str(tmp_path / "x")]) == 2


def test_generated_recipes_carry_no_secret_from_the_environment(tmp_path, monkeypatch):
    secrets = {"HF_TOKEN": "hf_SECRETgenerate1234567890", "WANDB_API_KEY": "wandbSECRET0123456789abcdef"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    written = generate_recipes(tmp_path)
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert written and sorted(files) == sorted(written)
    assert {f.suffix for f in files} >= {".sbatch", ".yaml", ".txt"}  # the programs: the runtime's, never a copy
    leaked = [
        (str(f.relative_to(tmp_path)), name) for f in files for name, value in secrets.items() if value in f.read_text()
    ]
    assert not leaked


def test_cli_render_errors_exit_2(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    assert (
        main(["render", "llama3_3_70b_full", "--gpus-per-node", "8", "--set", "tensor_parallel_dim=3", "-o", str(out)])
        == 2
    )
    assert "must divide GPUs per node" in capsys.readouterr().err
    assert main(["render", "llama3_3_70b_full", "--set", "checkpoint_dir=/x", "-o", str(out)]) == 2
    assert "checkpointer.checkpoint_dir" in capsys.readouterr().err
    assert not out.exists()
    assert main(["render", "llama3_3_70b_full", "--set", "batch_size=2", "-o", str(out)]) == 0
    assert "batch_size: 2" in (tmp_path / "job.yaml").read_text()  # configs are named after the script


def test_cli_render_with_spare_nodes_asks_slurm_for_them_and_trains_on_the_others(tmp_path):
    out = tmp_path / "job.sbatch"
    args = ["render", "llama3_8b_c4", "--profile", "local-cpu", "--nodes", "2", "--spare-nodes", "1", "-o", str(out)]
    assert main(args) == 0
    text = out.read_text()
    lines = text.splitlines()
    at = lines.index("#SBATCH --nodes=3")
    assert lines[at - 1] == (
        "# 2 nodes train, 1 spare stands by (--spare-nodes=1): a node at fault is swapped for a spare in this job"
    )
    assert "#SBATCH --no-kill" in lines and "#SBATCH --nodes=2" not in lines
    # every #SBATCH line comes before the first command (a comment between them does not end sbatch's reading)
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH ")) < first_command
    (launch,) = [ln for ln in lines if "--max-retries=" in ln]
    assert "--spare-nodes=1" in launch.split() and "--script" not in text
    assert (
        "# Without the runtime (and without spares): srun --nodes=2 --ntasks-per-node=1 torchrun --nnodes=2 \\" in lines
    )
    assert "SLURM_JOB_NUM_NODES" not in text
    assert shellcheck(out) == ""


def test_spare_nodes_zero_writes_neither_no_kill_nor_the_switch():
    text = render_job(make_spec("llama3_8b_c4", "local-cpu", nodes=2)).script
    assert "#SBATCH --nodes=2" in text.splitlines()
    assert "--no-kill" not in text and "--spare-nodes" not in text and "--script" not in text


def test_spare_nodes_leave_the_training_count_to_torchtitan():
    """Slurm's $SLURM_JOB_NUM_NODES counts the spares: FLUX's replica count (one per node) is written as the nodes
    that train."""
    text = render_job(make_spec("flux_schnell", "nebius", nodes=4, spare_nodes=1)).script
    assert "--parallelism.data_parallel_replicate_degree 4 \\" in text and "SLURM_JOB_NUM_NODES" not in text
    plain = render_job(make_spec("flux_schnell", "nebius", nodes=4)).script
    assert '--parallelism.data_parallel_replicate_degree "${SLURM_JOB_NUM_NODES}"' in plain


def shellcheck(*paths: Path) -> str:
    """shellcheck's findings (every severity, bash) on ``paths``; "" when clean."""
    r = subprocess.run(
        ["shellcheck", "--shell=bash", "--severity=style", "--format=gcc", *map(str, paths)],
        capture_output=True,
        text=True,
    )
    assert r.returncode in (0, 1), r.stderr  # 1: findings; anything else: shellcheck itself failed
    return r.stdout


def test_every_committed_script_passes_shellcheck():
    scripts = sorted((ROOT / "slurm-recipes").glob("**/*.sbatch"))
    assert scripts
    assert shellcheck(*scripts) == ""


def test_probe_and_rehearsal_files_pass_shellcheck_and_keep_a_hostile_partition_one_word(tmp_path):
    from cookbook.doctor import PROBE_SBATCH
    from cookbook.render import render_template

    work = tmp_path / "probe dir"
    sbatch = tmp_path / "probe.sbatch"
    sbatch.write_text(
        render_template(
            PROBE_SBATCH,
            partition="gpu $(touch PWNED)",
            nodes=2,
            work=str(work),
            python="/usr/bin/python3",
            site="/site",
            needs=("torch", "torchtune"),
            disks=["/data/my models"],
        )
    )
    from cookbook.rehearsal.rehearse import CHECK_TEMPLATE

    (tmp_path / "node-check").write_text(render_template(CHECK_TEMPLATE, node_check=str(work / "node_check.py")))
    assert shellcheck(sbatch, tmp_path / "node-check") == ""
    line = next(ln for ln in sbatch.read_text().splitlines() if ln.startswith("#SBATCH --partition="))
    assert shlex.split(line.split("=", 1)[1]) == ["gpu $(touch PWNED)"]
    srun = next(ln for ln in sbatch.read_text().splitlines() if ln.startswith("srun "))
    probe = _probe_parser().parse_args(shlex.split(srun)[5:])  # the runtime's own parser reads the line as written
    assert (probe.out, probe.marker, probe.disk) == (str(work), str(work / "marker"), ["/data/my models"])
    assert probe.needs == ["torch", "torchtune"]
    assert shlex.split(srun)[2:5] == ["python3", "-m", "cookbook_runtime.probe"]


def test_shellcheck_catches_an_unquoted_variable(tmp_path):
    """The check above can fail: shellcheck is installed and reads bash."""
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\nmkdir -p $RUN_DIR\n")
    assert "SC2086" in shellcheck(bad)


def test_slurm_recipes_match_the_generator():
    expected = generated_files()
    root = ROOT / "slurm-recipes"
    stale = [rel for rel, text in expected.items() if not (root / rel).is_file() or (root / rel).read_text() != text]
    assert not stale, f"slurm-recipes/ drifted from the generator; run `cookbook generate-recipes`: {stale}"
    # and no committed script the generator no longer writes (the script tests read the committed ones)
    extra = sorted(set(committed_scripts()) - set(expected))
    assert not extra, f"slurm-recipes/ holds scripts the generator does not write: {extra}"


def _rdzv_port(script: str, job_id: int) -> int:
    """The rendezvous port the runtime takes with ``script``'s switches for a job id (no port taken)."""
    return run.rendezvous(job_view(runtime_args(script), job_id=str(job_id)))[1]


def test_jobs_sharing_nodes_rendezvous_on_ports_of_their_own(monkeypatch):
    from cookbook.spec import SpecError, make_spec

    unset_env(monkeypatch, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    monkeypatch.setattr(run, "free_port", lambda address, port: port)  # a taken port: test_script_robustness
    shared = render_job(make_spec("llama3_3_70b_lora", profile="local-cpu", port=29500)).script
    assert {_rdzv_port(shared, j) for j in (116, 117, 2116)} == {29616, 29617}  # 2116 wraps onto 116
    exclusive = render_job(make_spec("llama3_3_70b_lora", profile="generic")).script
    assert _rdzv_port(exclusive, 116) == _rdzv_port(exclusive, 117) == 29500
    with pytest.raises(SpecError, match="port=64000"):
        render_job(make_spec("llama3_3_70b_lora", profile="local-cpu", port=64000))


def _resume(script: str, run_dir: Path) -> tuple[list[str], list[str]]:
    """The runtime's resume for ``script``'s switches on ``run_dir`` (job 77): (launch arguments, log lines)."""
    args = runtime_args(script)
    return resume.resume(
        args.resume, run_dir, adapter=args.resume_adapter, filename_format=args.resume_filename_format, job="77"
    )


def _age(path: Path, seconds: float) -> None:
    """Set ``path``'s modification time ``seconds`` into the past (the resume compares mtimes)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_torchtune_resumes_from_the_epoch_its_recipe_state_belongs_to(tmp_path):
    """torchtune writes recipe_state.pt after epoch N's weights and not after the final epoch: an
    epoch folder newer than the state (final, or cut off mid-save) is moved aside, never loaded."""
    from cookbook.spec import make_spec

    script = render_job(make_spec("llama3_3_70b_full", profile="local-cpu")).script
    run_dir = tmp_path / "run"
    (run_dir / "epoch_0").mkdir(parents=True)
    assert _resume(script, run_dir) == ([], [])  # no recipe state yet: start afresh
    state = run_dir / "recipe_state" / "recipe_state.pt"
    state.parent.mkdir()
    state.write_bytes(b"state after epoch 0")
    (run_dir / "epoch_1").mkdir()  # cut off (or final): after the state
    (run_dir / "epoch_1" / "model-00001-of-00001.safetensors").write_bytes(b"partial")
    _age(run_dir / "epoch_0", 300)
    _age(state, 200)
    _age(run_dir / "epoch_1", 100)
    args, said = _resume(script, run_dir)
    assert said == [
        f"moved {run_dir}/epoch_1 aside: written after the recipe state, it trains again",
        f"resuming from {run_dir}/epoch_0",
    ]
    assert args == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files.filename_format=epoch_0/model-{}-of-{}.safetensors",
    ]
    moved = [p.name for p in run_dir.iterdir() if p.name.startswith("superseded.")]
    assert len(moved) == 1 and moved[0].startswith("superseded.epoch_1.77.")
    assert (run_dir / moved[0] / "model-00001-of-00001.safetensors").read_bytes() == b"partial"  # kept
    assert sorted(p.name for p in run_dir.glob("epoch_*")) == ["epoch_0"]


def test_torchtune_resumes_from_the_newest_complete_step_checkpoint_mid_epoch(tmp_path):
    """cookbook_tune.py writes step_N/{epoch_E/, recipe_state/} (as .step_N.partial, renamed when complete): the
    resume takes it when its recipe state is newer than torchtune's own epoch-end one, and never a partial one
    (nor a step folder missing its weights)."""
    from cookbook.spec import make_spec

    full = render_job(make_spec("llama3_3_70b_full", profile="local-cpu")).script
    lora = render_job(make_spec("llama3_3_70b_lora", profile="local-cpu")).script
    run_dir = tmp_path / "run"
    (run_dir / "epoch_0").mkdir(parents=True)
    state = run_dir / "recipe_state" / "recipe_state.pt"
    state.parent.mkdir()
    state.write_bytes(b"state after epoch 0")
    _age(run_dir / "epoch_0", 500)
    _age(state, 400)
    for name, age in (("step_6", 300), (".step_7.partial", 200), ("step_8", 100)):
        if name != "step_8":  # step_8: its recipe state only, the weights never written
            (run_dir / name / "epoch_1").mkdir(parents=True)
        (run_dir / name / "recipe_state").mkdir(parents=True)
        (run_dir / name / "recipe_state" / "recipe_state.pt").write_bytes(b"state at a step")
        _age(run_dir / name / "recipe_state" / "recipe_state.pt", age)
    args, said = _resume(full, run_dir)
    assert said == [f"resuming from {run_dir}/step_6 (mid-epoch)"]
    assert args == [
        "resume_from_checkpoint=True",
        "checkpointer.recipe_checkpoint=step_6/recipe_state/recipe_state.pt",
        "checkpointer.checkpoint_files.filename_format=step_6/epoch_1/model-{}-of-{}.safetensors",
    ]
    assert _resume(lora, run_dir)[0] == [
        "resume_from_checkpoint=True",
        "checkpointer.recipe_checkpoint=step_6/recipe_state/recipe_state.pt",
        "checkpointer.adapter_checkpoint=step_6/epoch_1/adapter_model.pt",
    ]
    (run_dir / "epoch_1").mkdir()  # the next epoch end writes a newer epoch state: that one wins
    _age(run_dir / "epoch_1", 50)
    state.write_bytes(b"state after epoch 1")
    args, said = _resume(full, run_dir)
    assert said == [f"resuming from {run_dir}/epoch_1"]
    assert args == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files.filename_format=epoch_1/model-{}-of-{}.safetensors",
    ]


def test_a_multi_node_job_that_would_fetch_hub_ids_at_start_up_is_warned_with_the_staging_line():
    """#30 item 8: FLUX's T5 (~44 GB) and CLIP encoders are Hub ids by default, and torchtitan streams cc12m from
    the Hub; every rank would fetch them. Each is named with `cookbook stage` and the setting for the local copy."""
    from cookbook.recipes import get_recipe
    from cookbook.render import hub_fetch_warnings

    recipe = get_recipe("flux_schnell")
    spec = make_spec("flux_schnell", profile="nebius", nodes=2, recipe_dir="/shared/recipes")
    said = hub_fetch_warnings(spec, recipe)
    keys = ["encoder.t5_encoder", "encoder.clip_encoder", "dataloader.dataset_path"]
    assert [w.split(" = ")[0] for w in said] == keys
    assert "google/t5-v1_1-xxl is a Hub model every rank of the 2 nodes fetches" in said[0]
    assert "`cookbook stage flux_schnell --root /shared/hf`" in said[0]
    assert "export T5_DIR=/shared/hf/t5-v1_1-xxl HF_HUB_OFFLINE=1 before sbatch" in said[0]
    assert "pixparse/cc12m-wds is a Hub dataset" in said[2]
    assert "--set dataloader.dataset_path=/shared/hf/datasets/cc12m-wds" in said[2]
    staged = {
        "encoder.t5_encoder": "/shared/t5",
        "encoder.clip_encoder": "/shared/clip",
        "dataloader.dataset_path": "/shared/cc12m",
    }
    assert hub_fetch_warnings(make_spec("flux_schnell", profile="nebius", nodes=2, overrides=staged), recipe) == []
    assert hub_fetch_warnings(make_spec("flux_schnell", profile="nebius", nodes=1), recipe) == []


@pytest.mark.parametrize(
    ("name", "fetched", "local"),
    [
        # torchtitan's own table: c4 is allenai/c4, loaded with name="en" (the README's configs and en/)
        ("llama3_8b_c4", [("allenai/c4", "dataset", "dataloader.dataset_path")], {"dataloader.dataset_path": "/d/c4"}),
        # torchtune's alpaca builder: load_dataset(source) on every rank
        ("llama3_3_70b_lora", [("tatsu-lab/alpaca", "dataset", "dataset.source")], {"dataset.source": "/d/a"}),
        ("llama3_3_70b_full", [("tatsu-lab/alpaca", "dataset", "dataset.source")], {"dataset.source": "/d/a"}),
        # train.py: the model's tokenizer and C4 by default
        (
            "fsdp_llama3_1_8b",
            [("meta-llama/Llama-3.1-8B", "model", "tokenizer"), ("allenai/c4", "dataset", "dataset")],
            {"tokenizer": "/d/tok", "dataset": "/d/c4"},
        ),
    ],
)
def test_each_recipe_names_what_its_ranks_fetch_from_the_hub_and_a_local_copy_ends_it(name, fetched, local):
    """#30 item 8: the Hub fetches are the recipe's to name (the render warns of them, `cookbook stage` downloads
    them); once each is a local path the GPU script sets HF_HUB_OFFLINE=1 itself, and local-cpu fetches nothing."""
    from cookbook.recipes import get_recipe
    from cookbook.render import render_job

    recipe = get_recipe(name)
    spec = make_spec(name, profile="crusoe", nodes=2)
    assert [(f.repo_id, f.repo_type, f.key) for f in recipe.hub_fetches(spec)] == fetched
    assert "HF_HUB_OFFLINE" not in render_job(spec).script
    staged = make_spec(name, profile="crusoe", nodes=2, overrides=local)
    assert recipe.hub_fetches(staged) == []
    job = render_job(staged)
    assert "export HF_HUB_OFFLINE=1  # every model, tokenizer and dataset this job reads is a local path" in job.script
    assert not any("Hub" in w for w in job.warnings)
    assert recipe.hub_fetches(make_spec(name, profile="local-cpu", nodes=2)) == []


def test_c4_is_staged_with_the_files_torchtitan_reads():
    """torchtitan loads C4 with name="en": the README (its configs) and en/, not the whole 13 TB repo."""
    from cookbook.recipes import get_recipe

    (c4,) = get_recipe("llama3_8b_c4").hub_fetches(make_spec("llama3_8b_c4", profile="crusoe", nodes=2))
    assert c4.allow == ("README.md", "en/*") and c4.local("/shared/hf") == "/shared/hf/datasets/c4"


def test_a_job_whose_inputs_are_known_only_at_run_time_never_goes_offline():
    """A use job reads its trained run's dataset, a script its own: the render cannot know, so no HF_HUB_OFFLINE."""
    from cookbook.recipes import get_recipe

    spec = make_spec("llama3_3_70b_lora_use", profile="crusoe", nodes=1)
    assert not get_recipe("llama3_3_70b_lora_use").hub_complete(spec)
    assert "HF_HUB_OFFLINE" not in render_job(spec).script
