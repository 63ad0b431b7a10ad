"""Using what a run trained (cookbook/use, cookbook/recipes/use.py) without Slurm: the use program's errors
(one line, exit 2) and the same checks when a use job renders (CLI and notebook steps, before anything is
submitted), `cookbook diagnose` naming the job's own error line, the FLUX script's refusal to sample without a
checkpoint, the LoRA merge into an HF folder that transformers loads (and the adapter applied in memory the same
way), `cookbook outputs` on each kind of run folder, and the use recipes' validation and rendering. The jobs
themselves run on the local cluster in
tests/cluster/test_recipes_end_to_end.py and in the notebooks' tests."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cookbook.recipes.use import FLUX_NO_CHECKPOINT
from cookbook.use.outputs import NoOutputs, describe
from cookbook_runtime.programs import use_lm as lm_job


def _config(run: Path, base: Path) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "torchtune_config.yaml").write_text(f"checkpointer:\n  checkpoint_dir: {base}\n  output_dir: {run}\n")


def _adapter(folder: Path, shapes: dict[str, tuple[int, int]], rank: int = 4, seed: int = 0) -> None:
    """A PEFT-layout adapter: for each base weight ``name`` of shape (out, in), lora_A (r, in), lora_B (out, r)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out, inp) in shapes.items():
        stem = "base_model.model." + name.removesuffix(".weight")
        tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, inp, generator=gen)
        tensors[f"{stem}.lora_B.weight"] = torch.randn(out, rank, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA"}))


def _main(argv: list[str], capsys) -> tuple[int, str]:
    rc = lm_job.main(argv)
    return rc, capsys.readouterr().err.strip()


def test_a_run_without_a_checkpoint_is_one_line_exit_2(tmp_path, tiny_assets, capsys):
    run = tmp_path / "run"
    _config(run, tiny_assets.llama_dir)
    (run / "epoch_0").mkdir()  # an epoch cut short: no weights in it
    rc, err = _main(["--trained", str(run), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and err.count("\n") == 0, err
    assert err.startswith(f"use_lm.py: error: no checkpoint in {run}: torchtune writes epoch_N/")
    rc, err = _main(["--trained", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "no such run folder" in err and err.count("\n") == 0


def test_an_adapter_of_another_model_is_one_line_exit_2(tmp_path, tiny_assets, capsys):
    run = tmp_path / "run"
    _config(run, tiny_assets.llama_dir)
    # trained on a wider model: q_proj is 64 x 64 in the tiny base, the adapter's is 128 x 128
    _adapter(run / "epoch_0", {"model.layers.0.self_attn.q_proj.weight": (128, 128)})
    rc, err = _main(["--trained", str(run), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and err.count("\n") == 0, err
    assert "is for another model: model.layers.0.self_attn.q_proj.weight is (64, 64)" in err
    # a module the base does not have at all
    _adapter(run / "epoch_1", {"model.layers.7.self_attn.q_proj.weight": (64, 64)})
    rc, err = _main(["--trained", str(run), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "has no weight model.layers.7.self_attn.q_proj.weight" in err and err.count("\n") == 0


def test_a_prompt_file_that_is_not_utf8_is_one_line_exit_2(tmp_path, tiny_assets, capsys):
    run = tmp_path / "run"
    _config(run, tiny_assets.llama_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("Qu'est-ce que c'est ?\n".encode("latin-1") + b"caf\xe9\n")
    rc, err = _main(["--trained", str(run), "--out", str(tmp_path / "out"), "--prompts", str(prompts)], capsys)
    assert rc == 2 and err.count("\n") == 0, err
    assert err == f"use_lm.py: error: {prompts} is not UTF-8 text (byte 0xe9 at offset 25): save it as UTF-8"


def test_lora_merge_writes_an_hf_folder_transformers_loads_with_the_adapter_in_it(tmp_path, tiny_assets):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = tiny_assets.llama_dir
    target = "model.layers.1.mlp.down_proj.weight"  # (64, 256) in the tiny model
    _adapter(tmp_path / "adapter", {target: (64, 256), "model.layers.0.self_attn.v_proj.weight": (32, 64)})
    merged = lm_job.merge_lora(base, tmp_path / "adapter", tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert type(model).__name__ == "LlamaForCausalLM"
    a = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    stem = "base_model.model." + target.removesuffix(".weight")
    delta = 2.0 * a[f"{stem}.lora_B.weight"] @ a[f"{stem}.lora_A.weight"]  # lora_alpha / r = 2
    before = load_file(next(base.glob("*.safetensors")))[target].float()
    after = dict(model.named_parameters())[target].detach().float()
    assert torch.allclose(after, before + delta, atol=0.05 * float(delta.abs().max())), "the merge is W + a/r B A"
    assert (merged / "config.json").is_file() and (merged / "tokenizer.json").is_file()


def test_heldout_split_follows_the_training_split():
    assert lm_job.heldout_split("train[:90%]") == ("train[90%:]", False)
    assert lm_job.heldout_split("train[:1000]") == ("train[1000:]", False)
    assert lm_job.heldout_split("train") == ("train[90%:]", True)


def test_outputs_of_each_kind_of_run_and_of_none(tmp_path, tiny_assets, capsys):
    from cookbook.cli import main

    full = tmp_path / "full"
    _config(full, tiny_assets.llama_dir)
    for epoch in ("epoch_0", "epoch_1"):
        (full / epoch).mkdir()
        (full / epoch / "model-00001-of-00001.safetensors").write_bytes(b"x" * 1500)
    out = describe(full)
    assert out.kind == "full" and out.weights == full / "epoch_1" and out.size_bytes == 1500
    assert out.serve["vLLM"] == f"vllm serve {full / 'epoch_1'} --tensor-parallel-size 1"
    assert "AutoModelForCausalLM.from_pretrained" in out.serve["transformers"] and out.others == [full / "epoch_0"]
    assert f"--model_args pretrained={full / 'epoch_1'},dtype=bfloat16" in out.serve["lm-eval"]

    lora = tmp_path / "lora"
    _config(lora, tiny_assets.llama_dir)
    _adapter(lora / "epoch_0", {"model.layers.0.self_attn.q_proj.weight": (64, 64)}, rank=8)
    out = describe(lora)
    size = (lora / "epoch_0" / "adapter_model.safetensors").stat().st_size
    assert out.kind == "lora" and out.size_bytes == size and out.adapter_rank == 8
    assert out.base == str(tiny_assets.llama_dir)
    assert "--enable-lora --lora-modules tuned=" in out.serve["vLLM"] and "PeftModel" in out.serve["transformers"]
    assert f"pretrained={tiny_assets.llama_dir},peft={lora / 'epoch_0'}," in out.serve["lm-eval"]  # base + adapter

    titan = tmp_path / "titan"
    (titan / "checkpoint" / "step-3").mkdir(parents=True)  # incomplete: no .metadata
    (titan / "checkpoint" / "step-2").mkdir()
    (titan / "checkpoint" / "step-2" / ".metadata").write_text("m")
    out = describe(titan)
    assert out.kind == "dcp" and out.weights.name == "step-2"
    assert "torch.distributed.checkpoint.format_utils dcp_to_torch_save" in out.serve["one file"]

    assert main(["outputs", str(full)]) == 0
    assert "weights: " in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoOutputs):
        describe(tmp_path / "empty")
    assert main(["outputs", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no weights in" in err, err


def test_use_recipes_validate_their_overrides_and_render_one_node_scripts():
    from cookbook.render import render_job, validate
    from cookbook.spec import SpecError, make_spec

    spec = make_spec("llama3_3_70b_lora_use", "generic", nodes=1, overrides={"merge": "$RUN_DIR/merged"})
    job = render_job(spec)
    assert "#SBATCH --nodes=1" in job.script and '"${RUNTIME_DIR}"/cookbook_runtime/programs/use_lm.py' in job.script
    assert '--trained="${TRAINED_DIR}"' in job.script and '--merge="${RUN_DIR}"/merged' in job.script
    assert job.files["cookbook_runtime/programs/use_lm.py"] == Path(lm_job.__file__).read_text()
    for recipe, overrides, said in (
        ("llama3_3_70b_lora_use", {"prompt": "x"}, "did you mean prompts"),
        ("llama3_3_70b_full_use", {"merge": "/tmp/m"}, "merge is for LoRA"),
        ("llama3_3_70b_lora_use", {"rows": "0"}, "rows=0: use a positive integer"),
        ("llama3_3_70b_lora_use", {"out": "/tmp/o"}, "set by the recipe"),
    ):
        with pytest.raises(SpecError, match=said):
            validate(make_spec(recipe, "generic", nodes=1, overrides=overrides))


def test_the_rehearsal_knows_the_use_program_by_the_name_the_recipe_writes():
    """node_check.py (standard library only, runs on the nodes) names the program file: the same as the recipe's."""
    from cookbook.recipes.use import FLUX_INFER, PROGRAM
    from cookbook_runtime import rehearsal as node_check

    assert node_check.program_of(["torchrun"], [f"/x/{PROGRAM}", "--trained=/r"]) == (
        "use",
        [f"/x/{PROGRAM}", "--trained=/r"],
    )
    assert node_check.program_of(["torchrun"], ["-m", FLUX_INFER, "--module", "m"]) == ("torchtitan", ["--module", "m"])
    assert node_check.program_of(["torchrun"], ["/x/train.py"])[0] == "fsdp"


# ------------------------------------------------------------------------------ checks before submitting
def _render(capsys, tmp_path, recipe: str, *args: str) -> tuple[int, str]:
    """`cookbook render RECIPE --nodes 1 ARGS -o FILE`: exit status, stderr; the script is written only on success."""
    from cookbook.cli import main

    out = tmp_path / "use.sbatch"
    out.unlink(missing_ok=True)
    rc = main(["render", recipe, "--profile", "generic", "--nodes", "1", *args, "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert out.exists() == (rc == 0), (rc, err)
    return rc, err


def _headers_only(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A safetensors shard whose header declares ``shapes`` (bf16) but that holds no tensor data: reading it
    whole fails, so a check that passes on it read the header only (a 70B base costs nothing to check)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


_70B = {  # layer 0 of Llama 3.3 70B: 8192 wide, 8 KV heads of 128
    "model.layers.0.self_attn.q_proj.weight": (8192, 8192),
    "model.layers.0.self_attn.v_proj.weight": (1024, 8192),
    "model.layers.0.mlp.down_proj.weight": (8192, 28672),
}


def test_render_refuses_a_use_job_whose_run_holds_no_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    _config(run, tmp_path / "base")
    (run / "epoch_0").mkdir()  # cut short: no weights
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={run}")
    assert rc == 2 and err.count("\n") == 0, err
    assert (
        err == f"error: invalid job: no checkpoint in {run}: torchtune writes epoch_N/ at the end of each "
        "epoch (did the job finish one?)"
    )
    # weights without the config.json transformers loads them with
    (run / "epoch_0" / "model-00001-of-00001.safetensors").write_bytes(b"")
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={run}")
    assert rc == 2 and err.endswith(
        "epoch_0: no config.json beside the weights (torchtune's HF checkpointer writes one)"
    )
    (run / "epoch_0" / "config.json").write_text("{}")
    assert _render(capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={run}")[0] == 0
    # a run folder given by hand that is not there; the training config gone
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={tmp_path / 'nope'}")
    assert (
        rc == 2
        and err
        == f"error: invalid job: trained={tmp_path / 'nope'} does not exist (give the folder "
        "or file the job should read, or leave the key out)"
    )
    (run / "torchtune_config.yaml").unlink()
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={run}")
    assert rc == 2 and "torchtune_config.yaml: no training config" in err and err.count("\n") == 0


def test_render_refuses_an_adapter_of_another_model_from_the_headers_alone(tmp_path, capsys):
    base = tmp_path / "Llama-3.3-70B-Instruct"
    _headers_only(base / "model-00001-of-00030.safetensors", _70B)
    (base / "config.json").write_text("{}")
    run = tmp_path / "run"
    _config(run, base)
    # an adapter trained on Llama 3.1 8B (4096 wide) in a 70B run's folder
    _adapter(run / "epoch_0", {"model.layers.0.self_attn.q_proj.weight": (4096, 4096)})
    args = ("--set", f"trained={run}", "--set", f"base={base}")
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_lora_use", *args)
    assert rc == 2 and err.count("\n") == 0, err
    assert err == (
        f"error: invalid job: the adapter in {run / 'epoch_0'} is for another model: model.layers.0.self_attn."
        f"q_proj.weight is (8192, 8192) in {base}, the adapter expects (4096, 4096)"
    )
    # the adapter of this model (rank 8 on q and v): renders, the 70B shards never read
    _adapter(run / "epoch_1", {k: v for k, v in _70B.items() if "proj" in k and "mlp" not in k}, rank=8)
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_lora_use", *args)
    assert rc == 0, err
    # a lora_A without its lora_B
    from safetensors.torch import load_file, save_file

    tensors = load_file(run / "epoch_1" / "adapter_model.safetensors")
    save_file(
        {k: v for k, v in tensors.items() if "v_proj.lora_B" not in k}, run / "epoch_1" / "adapter_model.safetensors"
    )
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_lora_use", *args)
    assert rc == 2 and "v_proj.lora_A.weight has no lora_B partner" in err and err.count("\n") == 0


def test_render_refuses_a_prompt_file_that_is_not_utf8_or_missing(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"caf\xe9\n")
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_lora_use", "--set", f"prompts={prompts}")
    assert rc == 2 and err == (
        f"error: invalid job: {prompts} is not UTF-8 text (byte 0xe9 at offset 3): save it as UTF-8"
    )
    rc, err = _render(capsys, tmp_path, "llama3_3_70b_lora_use", "--set", f"prompts={tmp_path / 'none.txt'}")
    assert rc == 2 and f"prompts={tmp_path / 'none.txt'} does not exist" in err and err.count("\n") == 0
    prompts.write_text("café ?\n")
    assert _render(capsys, tmp_path, "llama3_3_70b_lora_use", "--set", f"prompts={prompts}")[0] == 0


def test_with_a_dependency_the_checks_only_warn(tmp_path, capsys):
    """`--dependency afterok:TRAINING`: the checkpoint is written while the use job waits."""
    run = tmp_path / "run"
    _config(run, tmp_path / "base")
    rc, err = _render(
        capsys, tmp_path, "llama3_3_70b_full_use", "--set", f"trained={run}", "--dependency", "afterok:12"
    )
    assert rc == 0 and f"warning: no checkpoint in {run}" in err and "(the job starts after afterok:12" in err


def test_render_refuses_a_flux_run_without_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "flux-run"
    (run / "checkpoint" / "step-5").mkdir(parents=True)  # a save cut short: no .metadata
    rc, err = _render(capsys, tmp_path, "flux_schnell_use", "--set", f"dump_folder={run}")
    assert rc == 2 and err.count("\n") == 0, err
    assert (
        err == f"error: invalid job: no checkpoint in {run / 'checkpoint'} (no step-N/ with .metadata): "
        "torchtitan would sample from random weights; point TRAINED_DIR (--set dump_folder=) at a flux_schnell "
        "run folder that saved one"
    )
    (run / "checkpoint" / "step-5" / ".metadata").write_text("m")
    assert _render(capsys, tmp_path, "flux_schnell_use", "--set", f"dump_folder={run}")[0] == 0


def test_the_flux_script_itself_refuses_to_sample_without_a_checkpoint(tmp_path):
    """The rendered script's own check (a copy-paste user runs sbatch without render): its text up to the check,
    run by bash on an empty run folder, then on one with a complete checkpoint."""
    from cookbook.render import render_job
    from cookbook.spec import make_spec

    script = render_job(replace(make_spec("flux_schnell_use", "generic", nodes=1), recipe_dir=str(tmp_path))).script
    head = script[: script.index("\nfi\n", script.index("# --- the checkpoint to sample from")) + 4]
    run = tmp_path / "trained"
    (run / "checkpoint" / "step-2").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "TRAINED_DIR": str(run)}
    res = subprocess.run(["bash", "-c", head], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and res.stderr == (
        f"flux_schnell_use: error: {FLUX_NO_CHECKPOINT.format(folder=f'{run}/checkpoint')}\n"
    )
    (run / "checkpoint" / "step-2" / ".metadata").write_text("m")
    res = subprocess.run(["bash", "-c", head], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_the_notebook_steps_stop_with_one_line_and_submit_nothing(tmp_path, tiny_assets):
    from cookbook import walkthrough as wt
    from cookbook.executor import Job
    from cookbook.slurm.client import SlurmClient
    from cookbook.spec import make_spec

    def trained(run: Path, recipe: str) -> tuple:
        job = Job("1", tmp_path / "job.sbatch", tmp_path / "t.out", run, recipe, "local-cpu", "train")
        return make_spec(recipe, "local-cpu", gpus_per_node=0), job

    run = tmp_path / "lora-run"
    _config(run, tiny_assets.llama_dir)
    _adapter(run / "epoch_0", {"model.layers.0.self_attn.q_proj.weight": (128, 128)})
    spec, job = trained(run, "llama3_3_70b_lora")
    client = SlurmClient()  # never reached: the job is refused before sbatch
    with pytest.raises(wt.NotebookStop) as stop:
        wt.use_model(spec, job, root=tmp_path / "runs", client=client)
    assert str(stop.value).count("\n") == 0 and "is for another model" in str(stop.value)
    flux = tmp_path / "flux-run"
    flux.mkdir()
    spec, job = trained(flux, "flux_schnell")
    with pytest.raises(wt.NotebookStop) as stop:
        wt.sample_images(spec, job, root=tmp_path / "runs", client=client)
    assert str(stop.value) == f"invalid job: {FLUX_NO_CHECKPOINT.format(folder=flux / 'checkpoint')}"
    assert not any((tmp_path / "runs").rglob("*.sbatch"))  # nothing rendered, nothing submitted


def test_diagnose_shows_the_jobs_own_error_line_not_the_generic_failure(tmp_path):
    """A node saw what the login node could not: the program's real error line, in the log as srun and torchrun
    tag it, is the finding (whole), and torchrun's ChildFailedError adds no generic hint."""
    from cookbook.metrics.diagnose import diagnose_text

    program = Path(lm_job.__file__)
    res = subprocess.run(
        [sys.executable, str(program), "--trained", str(tmp_path / "gone" / ("x" * 150)), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    line = res.stderr.strip()
    log = (
        "job 7: 1 node(s) [n1], rendezvous 10.0.0.1:29500, run dir /r\n"
        f"0: [rank0]:{line}\n"
        "0: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "srun: error: n1: task 0: Exited with exit code 1\n"
    )
    found = diagnose_text(log)
    assert [f.kind for f in found] == ["job_refused"]
    assert f"use_lm.py: error: {tmp_path / 'gone' / ('x' * 150)}: no such run folder" in str(found[0])  # whole
    flux = "flux_schnell_use: error: no checkpoint in /r/checkpoint (no step-N/ with .metadata): torchtitan ..."
    assert [f.kind for f in diagnose_text(flux + "\n")] == ["job_refused"]
    # without the program's line, the generic hint stays
    assert [f.kind for f in diagnose_text(log.replace(f"0: [rank0]:{line}\n", ""))] == ["rank_failed"]


def test_the_adapter_applied_in_memory_is_the_merge(tmp_path, tiny_assets):
    """apply_adapter (one module at a time, in the weight's dtype) gives the weights merge_lora writes."""
    import torch
    from transformers import AutoModelForCausalLM

    base = tiny_assets.llama_dir
    shapes = {"model.layers.1.mlp.down_proj.weight": (64, 256), "model.layers.0.self_attn.q_proj.weight": (64, 64)}
    _adapter(tmp_path / "adapter", shapes, seed=3)
    merged = dict(
        AutoModelForCausalLM.from_pretrained(
            lm_job.merge_lora(base, tmp_path / "adapter", tmp_path / "m")
        ).named_parameters()
    )
    model = lm_job.apply_adapter(lm_job.load_model(base), tmp_path / "adapter", base)
    before = dict(lm_job.load_model(base).named_parameters())
    for name, p in model.named_parameters():
        # the merged folder keeps the base's bf16; in memory the model is float32 (CPU): equal to bf16's precision
        assert (p.to(merged[name].dtype).float() - merged[name].float()).abs().max() <= 2**-7 * p.abs().max(), name
        assert torch.equal(p, before[name]) == (name not in shapes), name
