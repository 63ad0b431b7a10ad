"""Recipes: registry, override keys checked against the real torchtune/torchtitan configs, parallel rules."""

import pytest

from cookbook.recipes import get_recipe, list_recipes
from cookbook.render import validate
from cookbook.spec import JobSpec, SpecError

NAMES = {"llama3_3_70b_full", "llama3_3_70b_lora", "llama3_8b_c4", "flux_schnell"}


def test_registry_has_the_seed_recipes():
    assert NAMES <= {r.name for r in list_recipes()}
    with pytest.raises(KeyError, match="known:"):
        get_recipe("nope")


def _problems(**kw) -> str:
    with pytest.raises(SpecError) as e:
        validate(JobSpec(**kw))
    return str(e.value)


def test_torchtune_tp_must_divide_gpus_per_node():
    assert "must divide GPUs per node (8)" in _problems(recipe="llama3_3_70b_full",
                                                         overrides={"tensor_parallel_dim": "3"})


def test_torchtune_top_level_checkpoint_dir_suggests_checkpointer_key():
    text = _problems(recipe="llama3_3_70b_full", overrides={"checkpoint_dir": "/x"})
    assert "checkpointer.checkpoint_dir" in text


def test_torchtune_component_params_and_recipe_optional_keys_are_accepted():
    spec = JobSpec("llama3_3_70b_full", overrides={"dataset.source": "json", "tensor_parallel_dim": "8"})
    validate(spec)
    cfg = get_recipe("llama3_3_70b_full").config(spec)
    assert cfg.tensor_parallel_dim == 8 and cfg.tensor_parallel_plan._component_ and cfg.optimizer.fused is False


def test_torchtune_missing_local_path_and_bad_batch():
    text = _problems(recipe="llama3_3_70b_lora", overrides={"tokenizer.path": "/tmp/nope/tokenizer.model",
                                                            "batch_size": "0"})
    assert "tokenizer.path=/tmp/nope/tokenizer.model does not exist" in text and "batch_size=0" in text


def test_local_cpu_config_uses_tiny_asset_paths(monkeypatch):
    from cookbook.assets.tiny import TinyAssets
    from pathlib import Path

    cfg = get_recipe("llama3_3_70b_full").config(JobSpec("llama3_3_70b_full", profile="local-cpu", gpus_per_node=0))
    monkeypatch.setenv("TINY_DIR", "/t")
    assert cfg.tokenizer.path == str(TinyAssets(Path("/t")).tokenizer_model)


def test_torchtitan_overrides_checked_by_its_parser():
    validate(JobSpec("llama3_8b_c4", overrides={"training.steps": "5"}))
    assert "training.steps" in _problems(recipe="llama3_8b_c4", overrides={"steps": "5"})
    assert "must divide GPUs per node" in _problems(recipe="flux_schnell",
                                                    overrides={"parallelism.tensor_parallel_degree": "3"})
    assert "rejects" in _problems(recipe="llama3_8b_c4", overrides={"training.steps": "many"})


def test_torchtitan_boolean_overrides_become_flags_its_parser_accepts():
    from cookbook.recipes.torchtitan import cli_args, parse_config

    assert cli_args({"profiler.enable_profiling": "True", "checkpoint.enable": "false", "training.steps": "3"}) == [
        "--profiler.enable_profiling", "--checkpoint.no-enable", "--training.steps", "3"]
    cfg, err = parse_config("llama3_8b_c4_tiny", {"profiler.enable_profiling": "true", "checkpoint.enable": "False"})
    assert err == "" and cfg.profiler.enable_profiling is True and cfg.checkpoint.enable is False
