"""Using what a run trained (cookbook/use, cookbook/recipes/use.py) without Slurm: the use program's errors
(one line, exit 2), the LoRA merge into an HF folder that transformers loads, `cookbook outputs` on each kind of
run folder, and the use recipes' validation and rendering. The jobs themselves run on the local cluster in
tests/cluster/test_recipes_end_to_end.py and in the notebooks' tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cookbook.use import lm_job
from cookbook.use.outputs import NoOutputs, describe


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
    assert err.startswith(f"error: no checkpoint in {run}: torchtune writes epoch_N/")
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
    assert err == f"error: {prompts} is not UTF-8 text (byte 0xe9 at offset 25): save it as UTF-8"


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

    lora = tmp_path / "lora"
    _config(lora, tiny_assets.llama_dir)
    _adapter(lora / "epoch_0", {"model.layers.0.self_attn.q_proj.weight": (64, 64)}, rank=8)
    out = describe(lora)
    size = (lora / "epoch_0" / "adapter_model.safetensors").stat().st_size
    assert out.kind == "lora" and out.size_bytes == size and out.adapter_rank == 8
    assert out.base == str(tiny_assets.llama_dir)
    assert "--enable-lora --lora-modules tuned=" in out.serve["vLLM"] and "PeftModel" in out.serve["transformers"]

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
    assert "#SBATCH --nodes=1" in job.script and '"${RECIPE_DIR}"/use_lm.py' in job.script
    assert '--trained="${TRAINED_DIR}"' in job.script and '--merge="${RUN_DIR}"/merged' in job.script
    assert job.files["use_lm.py"] == Path(lm_job.__file__).read_text()
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
    from cookbook.rehearsal import node_check

    assert node_check.program_of(["torchrun"], [f"/x/{PROGRAM}", "--trained=/r"]) == (
        "use",
        [f"/x/{PROGRAM}", "--trained=/r"],
    )
    assert node_check.program_of(["torchrun"], ["-m", FLUX_INFER, "--module", "m"]) == ("torchtitan", ["--module", "m"])
    assert node_check.program_of(["torchrun"], ["/x/train.py"])[0] == "fsdp"
