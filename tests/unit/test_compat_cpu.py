"""CPU shims: version pinning, launch arguments, and (slow) real torchrun runs of torchtune and torchtitan."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cookbook.local.assets.tiny import TinyAssets
from cookbook.local.assets.tiny_llama import DIMS
from cookbook.local.compat import cpu
from cookbook.paths import project_root


def test_launch_args() -> None:
    assert cpu.cpu_launch_args("torchtune", "full_finetune_distributed") == [
        "-m",
        "cookbook.local.compat.cpu",
        "torchtune",
        "full_finetune_distributed",
    ]
    assert cpu.cpu_launch_args("torchtitan") == ["-m", "cookbook.local.compat.cpu", "torchtitan"]
    with pytest.raises(cpu.CompatError):
        cpu.cpu_launch_args("torchtune")
    with pytest.raises(cpu.CompatError):
        cpu.cpu_launch_args("megatron")


def test_installed_versions_are_the_verified_ones() -> None:
    assert cpu.version_problems("torchtune") == []
    assert cpu.version_problems("torchtitan") == []


def test_other_versions_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cpu.VERIFIED_VERSIONS, "torchtune", "0.7.0")
    monkeypatch.delenv(cpu.ANY_VERSION_ENV, raising=False)
    with pytest.raises(cpu.CompatError, match=r"torchtune 0\.6\.1 \(shims verified with 0\.7\.0\)"):
        cpu.check_versions("torchtune")
    monkeypatch.setenv(cpu.ANY_VERSION_ENV, "1")
    with pytest.warns(UserWarning, match="verified only with"):
        cpu.check_versions("torchtune")


def test_recipe_lookup() -> None:
    path = cpu.torchtune_recipe_path("lora_finetune_distributed")
    assert path.name == "lora_finetune_distributed.py" and path.is_file()
    with pytest.raises(cpu.CompatError, match="full_finetune_distributed"):
        cpu.torchtune_recipe_path("no_such_recipe")


def test_torchtitan_default_args_only_when_absent() -> None:
    assert cpu.with_torchtitan_defaults(["--module", "m"]) == [
        "--module",
        "m",
        "--parallelism.spmd_backend",
        "partial_dtensor",
    ]
    given = ["--parallelism.spmd_backend=spmd_types"]
    assert cpu.with_torchtitan_defaults(given) == given


def test_every_shim_is_documented() -> None:
    readme = (Path(cpu.__file__).parent / "README.md").read_text()
    for shims in cpu.SHIMS.values():
        for shim in shims:
            assert shim.breaks and shim.upstream and shim.fix
            assert f"`{shim.name}`" in readme


def test_cli_errors_are_short() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cookbook.local.compat.cpu", "torchtune", "nope"],
        capture_output=True,
        text=True,
        cwd=project_root(),
    )
    assert res.returncode == 2 and "unknown torchtune recipe 'nope'" in res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------------------------- real runs


def tiny_torchtune_config(assets: TinyAssets, output_dir: Path, lora: bool = False) -> dict:
    """A tiny full_finetune_distributed / lora_finetune_distributed config on the tiny assets."""
    model: dict = {"_component_": "torchtune.models.llama3_1.llama3_1"}
    if lora:
        model = {
            "_component_": "torchtune.models.llama3_1.lora_llama3_1",
            "lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
            "apply_lora_to_mlp": True,
            "apply_lora_to_output": False,
            "lora_rank": 8,
            "lora_alpha": 16,
            "lora_dropout": 0.0,
        }
    model |= {
        "vocab_size": DIMS.vocab_size,
        "num_layers": DIMS.n_layers,
        "num_heads": DIMS.n_heads,
        "num_kv_heads": DIMS.n_kv_heads,
        "embed_dim": DIMS.dim,
        "intermediate_dim": DIMS.ffn_dim,
        "max_seq_len": DIMS.max_seq_len,
        "rope_base": DIMS.rope_theta,
        "norm_eps": DIMS.norm_eps,
    }
    config = {
        "output_dir": str(output_dir),
        "tokenizer": {
            "_component_": "torchtune.models.llama3.llama3_tokenizer",
            "path": str(assets.tokenizer_model),
            "special_tokens_path": str(assets.special_tokens),
            "max_seq_len": 256,
        },
        "dataset": {
            "_component_": "torchtune.datasets.chat_dataset",
            "source": "json",
            "data_files": str(assets.chat_sharegpt),
            "split": "train",
            "conversation_column": "conversations",
            "conversation_style": "sharegpt",
            "train_on_input": False,
            "packed": False,
        },
        "seed": 1234,
        "shuffle": True,
        "model": model,
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(assets.llama_dir),
            "checkpoint_files": ["model-00001-of-00001.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": str(output_dir),
            "model_type": "LLAMA3",
        },
        "resume_from_checkpoint": False,
        "batch_size": 4,
        "epochs": 2,
        "max_steps_per_epoch": 3,
        "gradient_accumulation_steps": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-3 if lora else 2e-3, "fused": False},
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "device": "cpu",
        "dtype": "fp32",
        "compile": False,
        "clip_grad_norm": None,
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "metric_logger": {
            "_component_": "torchtune.training.metric_logging.DiskLogger",
            "log_dir": str(output_dir / "logs"),
        },
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }
    if lora:
        config["save_adapter_weights_only"] = False
        config["lr_scheduler"] = {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": 1,
        }
    else:
        config |= {"fsdp_cpu_offload": False, "optimizer_in_bwd": False}
    return config


def torchrun(args: list[str], cwd: Path, timeout: int = 300) -> str:
    """``torchrun --standalone --nproc-per-node 2`` + args; returns stdout+stderr, fails the test on rc != 0."""
    env = dict(os.environ, PYTHONPATH=str(project_root()), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def disk_logger_losses(log_dir: Path) -> dict[int, float]:
    losses = {}
    for log in log_dir.glob("log_*.txt"):
        for m in re.finditer(r"Step (\d+) \| loss:([0-9.eE+-]+)", log.read_text()):
            losses[int(m.group(1))] = float(m.group(2))
    return losses


@pytest.mark.slow
def test_torchtune_full_finetune_distributed_and_resume(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    out = tmp_path / "full"
    cfg = tmp_path / "full.yaml"
    cfg.write_text(yaml.safe_dump(tiny_torchtune_config(tiny_assets, out)))
    launch = cpu.cpu_launch_args("torchtune", "full_finetune_distributed")
    torchrun([*launch, "--config", str(cfg)], cwd=tmp_path)
    losses = disk_logger_losses(out / "logs")
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert all(v == v and v < 20 for v in losses.values()) and losses[6] < losses[1]
    assert (out / "epoch_1" / "model-00001-of-00001.safetensors").is_file()
    assert (out / "recipe_state" / "recipe_state.pt").is_file()

    # Interrupted after epoch 0: drop epoch 1's output, resume, and get epoch 1's losses again exactly.
    shutil.rmtree(out / "epoch_1")
    shutil.move(out / "logs", tmp_path / "first_logs")
    # torchtune 0.6.1 reads a full-finetune resume's checkpoint_files relative to output_dir.
    torchrun(
        [
            *launch,
            "--config",
            str(cfg),
            "resume_from_checkpoint=True",
            "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
        ],
        cwd=tmp_path,
    )
    resumed = disk_logger_losses(out / "logs")
    assert resumed == {4: losses[4], 5: losses[5], 6: losses[6]}

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(out / "epoch_1")).config.num_hidden_layers == DIMS.n_layers


@pytest.mark.slow
def test_torchtune_lora_finetune_distributed(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    cfg = tmp_path / "lora.yaml"
    config = tiny_torchtune_config(tiny_assets, out, lora=True) | {"epochs": 1, "max_steps_per_epoch": 6}
    cfg.write_text(yaml.safe_dump(config))
    torchrun([*cpu.cpu_launch_args("torchtune", "lora_finetune_distributed"), "--config", str(cfg)], cwd=tmp_path)
    losses = disk_logger_losses(out / "logs")
    assert len(losses) == 6 and losses[6] < losses[1]
    adapter = out / "epoch_0" / "adapter_model.safetensors"
    assert adapter.is_file() and (out / "epoch_0" / "adapter_config.json").is_file()
    from safetensors import safe_open

    with safe_open(str(adapter), "pt") as f:
        assert any("lora" in k for k in f.keys())
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(out / "epoch_0")) is not None  # merged weights load


TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def titan_losses(output: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in TITAN_STEP.finditer(output)}


@pytest.mark.slow
def test_torchtitan_tiny_llama3_checkpoint_profile_tensorboard_resume(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    dump = tmp_path / "titan"
    args = [
        *cpu.cpu_launch_args("torchtitan"),
        "--module",
        "cookbook.local.compat.titan_tiny_configs",
        "--config",
        "tiny_llama3",
        "--hf_assets_path",
        str(tiny_assets.hf_tokenizer_dir),
        "--dataloader.dataset_path",
        str(tiny_assets.c4_dir),
        "--dump_folder",
        str(dump),
        "--training.steps",
        "6",
        "--checkpoint.interval",
        "3",
        "--profiler.profile_freq",
        "3",
    ]
    losses = titan_losses(torchrun(args, cwd=tmp_path))
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and losses[6] < losses[1]
    assert (dump / "checkpoint" / "step-3" / ".metadata").is_file()
    assert (dump / "checkpoint" / "step-6" / ".metadata").is_file()
    assert list((dump / "profiling" / "traces").glob("iteration_3/rank0_trace.json*"))
    assert list((dump / "tb").rglob("events.out.tfevents.*"))

    # "Interrupted" after step 6: a longer run resumes from step-6 and trains 7..8 only.
    shutil.rmtree(dump / "checkpoint" / "step-3")
    out = torchrun(
        [*args[:-6], "--training.steps", "8", "--checkpoint.interval", "3", "--profiler.profile_freq", "3"],
        cwd=tmp_path,
    )
    assert "Training starts at step 7" in out
    assert sorted(titan_losses(out)) == [7, 8]
