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
    assert "must divide GPUs per node (8)" in _problems(
        recipe="llama3_3_70b_full", overrides={"tensor_parallel_dim": "3"}
    )


def test_torchtune_top_level_checkpoint_dir_suggests_checkpointer_key():
    text = _problems(recipe="llama3_3_70b_full", overrides={"checkpoint_dir": "/x"})
    assert "checkpointer.checkpoint_dir" in text


def test_torchtune_component_params_and_recipe_optional_keys_are_accepted():
    spec = JobSpec("llama3_3_70b_full", overrides={"dataset.source": "json", "tensor_parallel_dim": "8"})
    validate(spec)
    cfg = get_recipe("llama3_3_70b_full").config(spec)
    assert cfg.tensor_parallel_dim == 8 and cfg.tensor_parallel_plan._component_ and cfg.optimizer.fused is False


def test_torchtune_missing_local_path_and_bad_batch():
    text = _problems(
        recipe="llama3_3_70b_lora", overrides={"tokenizer.path": "/tmp/nope/tokenizer.model", "batch_size": "0"}
    )
    assert "tokenizer.path=/tmp/nope/tokenizer.model does not exist" in text and "batch_size=0" in text


def test_local_cpu_config_uses_tiny_asset_paths(monkeypatch):
    from pathlib import Path

    from cookbook.local.assets.tiny import TinyAssets

    cfg = get_recipe("llama3_3_70b_full").config(JobSpec("llama3_3_70b_full", profile="local-cpu", gpus_per_node=0))
    monkeypatch.setenv("TINY_DIR", "/t")
    assert cfg.tokenizer.path == str(TinyAssets(Path("/t")).tokenizer_model)


def test_torchtitan_overrides_checked_by_its_parser():
    validate(JobSpec("llama3_8b_c4", overrides={"training.steps": "5"}))
    assert "training.steps" in _problems(recipe="llama3_8b_c4", overrides={"steps": "5"})
    assert "must divide GPUs per node" in _problems(
        recipe="flux_schnell", overrides={"parallelism.tensor_parallel_degree": "3"}
    )
    text = _problems(recipe="llama3_8b_c4", overrides={"training.steps": "many"})
    assert "rejects" in text and "For full helptext" not in text
    assert "Error parsing --training.steps: invalid literal for int() with base 10: 'many'" in text
    assert "(expected: --training.steps INT)" in text
    text = _problems(recipe="flux_schnell", overrides={"parallelism.fsdp_reshard_after_forward": "sometimes"})
    assert "'sometimes'" in text and "--parallelism.fsdp_reshard_after_forward" in text
    assert "Expected one of ('default', 'always', 'never')" in text


def test_torchtitan_rejection_reason_read_from_a_coloured_utf8_box(monkeypatch):
    """On a terminal tyro draws colours and UTF-8 boxes; the reason is read all the same. The box is made in
    this process (the bench imports torchtitan through its triton stand-in); the engine's own parser runs in
    a child process and gives the same reason."""
    import contextlib
    import io

    import tyro._fmtlib

    from cookbook.recipes.torchtitan import _MODULE_FILE, CONFIG_MODULE, cli_args, parse_config, tyro_reason
    from cookbook_runtime.titan_import import import_torchtitan_without_triton

    import_torchtitan_without_triton()
    from torchtitan.config.manager import ConfigManager

    monkeypatch.syspath_prepend(str(_MODULE_FILE.parent))
    monkeypatch.setattr(tyro._fmtlib, "_FORCE_ANSI", True)  # as on a terminal
    monkeypatch.setattr(tyro._fmtlib, "_FORCE_UTF8_BOXES", True)
    overrides = {"training.mixed_precision_param": "fp8"}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
        ConfigManager().parse_args(["--module", CONFIG_MODULE, "--config", "llama3_8b_c4", *cli_args(overrides)])
    assert "\x1b[" in err.getvalue() and "\u2502" in err.getvalue()  # colours and box edges
    reason = (
        "invalid choice 'fp8' for argument '--training.mixed_precision_param'. Expected one of ('bfloat16', 'float32')."
    )
    assert tyro_reason(err.getvalue(), overrides) == reason
    cfg, child_err = parse_config("llama3_8b_c4", overrides)
    assert cfg is None and tyro_reason(child_err, overrides) == reason
    assert tyro_reason("ValueError: bad\nlast line") == "last line"  # not a box: its last line, as before


def test_torchtitan_missing_local_paths(tmp_path):
    missing = str(tmp_path / "nope")
    text = _problems(
        recipe="llama3_8b_c4",
        overrides={
            "hf_assets_path": missing,
            "dataloader.dataset_path": missing + "/c4",
            "checkpoint.initial_load_path": missing + "/step-10",
        },
    )
    assert f"hf_assets_path={missing} does not exist" in text
    assert f"dataloader.dataset_path={missing}/c4 does not exist" in text
    assert f"checkpoint.initial_load_path={missing}/step-10 does not exist" in text
    text = _problems(
        recipe="flux_schnell",
        overrides={
            "encoder.autoencoder_path": missing + "/ae.safetensors",
            "encoder.t5_encoder": missing + "/t5",
            "tokenizer.clip_tokenizer_path": missing + "/clip",
        },
    )
    for key in ("encoder.autoencoder_path", "encoder.t5_encoder", "tokenizer.clip_tokenizer_path"):
        assert f"{key}={missing}/" in text
    # as torchtune's check: existing paths, shell variables, ~, relative paths, Hub ids and paths on
    # filesystems not mounted here are left to the job
    for value in (str(tmp_path), "$TINY_DIR/c4", "${HOME}/c4", "~/c4", "assets/c4", "/not-mounted-here/c4"):
        validate(JobSpec("llama3_8b_c4", overrides={"dataloader.dataset_path": value}))
    validate(JobSpec("flux_schnell", overrides={"encoder.t5_encoder": "google/t5-v1_1-xxl"}))
    validate(
        JobSpec(
            "flux_schnell",
            profile="local-cpu",
            gpus_per_node=0,
            overrides={"encoder.autoencoder_path": "$TINY_DIR/flux/ae.safetensors"},
        )
    )


def test_torchtune_keys_under_an_optional_component_section_are_its_parameters():
    cosine = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"
    # tensor_parallel_plan is absent from the config: the cookbook writes torchtune's Llama TP plan there
    text = _problems(recipe="llama3_3_70b_full", overrides={"tensor_parallel_plan.bogus": "1"})
    assert "'tensor_parallel_plan.bogus' is not a parameter" in text and "base_llama_tp_plan" in text
    tp_plan = "torchtune.models.llama3.base_llama_tp_plan"
    validate(
        JobSpec(
            "llama3_3_70b_full", overrides={"tensor_parallel_dim": "8", "tensor_parallel_plan._component_": tp_plan}
        )
    )
    # lr_scheduler is optional for full_finetune_distributed: checked against the component the override names
    text = _problems(
        recipe="llama3_3_70b_full", overrides={"lr_scheduler._component_": cosine, "lr_scheduler.num_warmup_step": "10"}
    )
    assert "'lr_scheduler.num_warmup_step' is not a parameter" in text
    assert "did you mean lr_scheduler.num_warmup_steps" in text
    validate(
        JobSpec(
            "llama3_3_70b_full", overrides={"lr_scheduler._component_": cosine, "lr_scheduler.num_warmup_steps": "10"}
        )
    )
    # ... and for the LoRA config against the one it holds
    assert "'lr_scheduler.bogus' is not a parameter" in _problems(
        recipe="llama3_3_70b_lora", overrides={"lr_scheduler.bogus": "1"}
    )
    validate(JobSpec("llama3_3_70b_lora", overrides={"lr_scheduler.num_warmup_steps": "10"}))
    # a key of a section the full config does not have, without the section's _component_: torchtune could
    # not build it
    text = _problems(recipe="llama3_3_70b_full", overrides={"lr_scheduler.num_warmup_steps": "10"})
    assert "the config has no lr_scheduler section" in text and "lr_scheduler._component_" in text


def test_torchtitan_boolean_overrides_become_flags_its_parser_accepts():
    from cookbook.recipes.torchtitan import cli_args, parse_config

    assert cli_args({"profiler.enable_profiling": "True", "checkpoint.enable": "false", "training.steps": "3"}) == [
        "--profiler.enable_profiling",
        "--checkpoint.no-enable",
        "--training.steps",
        "3",
    ]
    cfg, err = parse_config("llama3_8b_c4_tiny", {"profiler.enable_profiling": "true", "checkpoint.enable": "False"})
    assert err == "" and cfg.profiler.enable_profiling is True and cfg.checkpoint.enable is False


def test_single_epoch_torchtune_jobs_without_step_checkpoints_warn_that_a_kill_starts_over():
    from cookbook.render import render_job
    from cookbook.spec import make_spec

    # a GPU job gets the planner's save_every_n_steps (cookbook/planner/recovery.py) unless the user turns it off
    sized = render_job(make_spec("llama3_3_70b_lora", profile="generic")).warnings
    assert not any(w.startswith("epochs=1:") for w in sized)
    one = render_job(make_spec("llama3_3_70b_lora", profile="generic", overrides={"save_every_n_steps": "0"})).warnings
    assert any(w.startswith("epochs=1:") and "save_every_n_steps" in w for w in one)
    split = render_job(
        make_spec("llama3_3_70b_lora", profile="generic", overrides={"epochs": "4", "max_steps_per_epoch": "250"})
    ).warnings
    assert not any(w.startswith("epochs=1:") for w in split)
    # the recipe subclass's own key is accepted like the recipe's optional keys, and silences the warning
    steps = render_job(make_spec("llama3_3_70b_lora", profile="generic", overrides={"save_every_n_steps": "500"}))
    assert not any(w.startswith("epochs=1:") for w in steps.warnings)
    assert "save_every_n_steps: 500" in next(iter(steps.files.values()))
