"""Bring your own (issue 19 item 5): any torchtune built-in config or YAML file, any torchtitan config module,
one's own torchrun script; validated like the named recipes, bad input in one line with exit 2.
(They run for real on the local cluster in tests/cluster/test_bring_your_own_cluster.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from batch_step import runtime_args

from cookbook.cli import main
from cookbook.render import render_job, validate, write_job
from cookbook.spec import SpecError, make_spec

ROOT = Path(__file__).resolve().parents[2]
TITAN_MODULE = """
import os


def tiny():
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    cfg = llama3_debugmodel()
    cfg.hf_assets_path = os.environ.get("TINY_DIR", ".") + "/hf_tokenizer"
    cfg.training.steps = 3
    return cfg
"""


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_a_torchtune_builtin_is_validated_against_its_config_and_written_merged(tmp_path):
    spec = make_spec("tune:llama3_1/8B_lora", nodes=2, overrides={"batch_size": "4", "model.lora_rank": "16"})
    recipe = validate(spec)
    assert recipe.recipe_file == "lora_finetune_distributed"  # torchtune's registry: `tune ls`
    script = write_job(spec, tmp_path / "lora8b.sbatch")
    text = script.read_text()
    launcher = runtime_args(text).launcher  # what the script's last line hands the runtime after --
    assert launcher[:2] == ["tune", "run"] and "lora_finetune_distributed" in launcher
    yaml = (tmp_path / "lora8b.yaml").read_text()
    assert "batch_size: 4" in yaml and "lora_rank: 16" in yaml and "tune:llama3_1/8B_lora" in yaml
    assert "#SBATCH --job-name=tune-llama3-1-8B-lora" in text  # no ':' or '/' in names and log files
    with pytest.raises(SpecError, match="did you mean batch_size"):
        validate(make_spec("tune:llama3_1/8B_lora", overrides={"batch_sise": "4"}))
    with pytest.raises(SpecError, match="not a parameter of model's _component_"):
        validate(make_spec("tune:llama3_1/8B_lora", overrides={"model.lora_rnak": "4"}))


def test_a_full_finetune_builtin_with_listed_shards_warns_that_a_requeue_starts_over():
    spec = make_spec("tune:llama3_1/8B_full", nodes=2)
    job = render_job(spec)
    assert any("starts over" in w for w in job.warnings)
    assert "resume_from_checkpoint=True" not in job.script


def test_a_torchtune_yaml_of_ones_own_with_its_recipe(tmp_path):
    own = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "cookbook" / "recipes" / "configs" / "tiny_full.yaml", own)
    spec = make_spec(f"tune:full_finetune_distributed:{own}", "local-cpu", overrides={"epochs": "2"})
    text = write_job(spec, tmp_path / "out" / "mine.sbatch").read_text()
    assert (
        "-m cookbook.local.compat.cpu torchtune cookbook_runtime.programs.cookbook_tune full_finetune_distributed"
        in " ".join(text.split(" \\\n  "))
    )
    assert "epochs: 2" in (tmp_path / "out" / "mine.yaml").read_text()
    with pytest.raises(SpecError, match="not in the config"):
        validate(make_spec(f"tune:full_finetune_distributed:{own}", "local-cpu", overrides={"epoch": "2"}))


@pytest.mark.parametrize(
    ("recipe", "says"),
    [
        ("tune:llama3_1/8B_lorra", "did you mean llama3_1/8B_lora"),
        ("tune:missing.yaml", "no such config file"),
        ("tune:/etc/hostname.yaml", "no such config file"),
        ("tune:llama3_1/8B_lora_single_device", "single-device recipe"),
        ("tune:lora_finetune_distributd:llama3_1/8B_lora", "did you mean lora_finetune_distributed"),
        ("titan:llama3", "use titan:MODULE:CONFIG"),
        ("titan:missing.py:tiny", "no such config module"),
        ("script:missing.py", "no such program"),
        ("script:train.sh", "give a Python program"),
        ("nope", "bring your own: tune:CONFIG"),
    ],
)
def test_bad_bring_your_own_names_say_what_to_change_in_one_line(capsys, tmp_path, recipe, says):
    err = _one_line_error(capsys, ["render", recipe, "-o", str(tmp_path / "x.sbatch")])
    assert says in err
    assert not (tmp_path / "x.sbatch").exists()


def test_a_torchtune_file_without_its_recipe_or_not_a_mapping(capsys, tmp_path):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert "name the torchtune recipe" in _one_line_error(capsys, ["render", f"tune:{tmp_path}/list.yaml", "-o", "x"])
    err = _one_line_error(capsys, ["render", f"tune:full_finetune_distributed:{tmp_path}/list.yaml", "-o", "x"])
    assert "not a YAML mapping" in err


def test_a_torchtitan_module_by_name_and_a_module_file_of_ones_own(tmp_path, capsys):
    validate(make_spec("titan:llama3:llama3_debugmodel", nodes=1, overrides={"training.steps": "5"}))
    with pytest.raises(SpecError, match="Config function 'nope' not found"):
        validate(make_spec("titan:llama3:nope", nodes=1))
    module = tmp_path / "my_titan.py"
    module.write_text(TITAN_MODULE)
    spec = make_spec(f"titan:{module}:tiny", "local-cpu", overrides={"training.steps": "2"})
    text = write_job(spec, tmp_path / "out" / "t.sbatch").read_text()
    assert (tmp_path / "out" / "my_titan.py").read_text() == TITAN_MODULE  # the job runs the copy
    words = runtime_args(text).launcher
    assert words[words.index("--module") :][:4] == ["--module", "my_titan", "--config", "tiny"]
    err = _one_line_error(capsys, ["render", f"titan:{module}:tiny", "--set", "training.stepz=2", "-o", "x"])
    assert "did you mean training.steps" in err
    err = _one_line_error(capsys, ["render", f"titan:{module}:tiny", "--set", "training.steps=many", "-o", "x"])
    assert "torchtitan rejects the overrides" in err


def test_the_script_recipe_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("import torch.distributed as dist\ndist.init_process_group()\nprint('loss 1.0')\n")
    argv = ["render", "script", "train.py", "--nodes", "2", "--profile", "local-cpu", "-o", "job/t.sbatch"]
    assert main([*argv, "--", "--lr", "0.1", "--out", "$RUN_DIR/x", "two words", "$(touch PWNED)"]) == 0
    text = Path("job/t.sbatch").read_text()
    assert Path("job/train.py").read_text() == Path("train.py").read_text()
    assert "# script:train.py (script), profile local-cpu" in text
    args = runtime_args(text, {"RECIPE_DIR": "/jobs/t", "RUN_DIR": "/runs/t"})
    named = runtime_args(render_job(make_spec("fsdp_llama3_1_8b", "local-cpu")).script)
    assert args.requeue and args.gate and args.launcher[0] == "torchrun"  # the runtime of the named recipes
    assert (args.port_span, args.interface, args.max_retries) == (named.port_span, named.interface, named.max_retries)
    # every word reaches the program as given, with the script's own folders expanded and nothing else
    assert args.launcher[1:] == ["/jobs/t/train.py", "--lr", "0.1", "--out", "/runs/t/x", "two words", "$(touch PWNED)"]
    assert "'$(touch PWNED)'" in text.split("-- torchrun", 1)[1]
    subprocess.run(["bash", "-n", "job/t.sbatch"], check=True)
    assert "no such program" in _one_line_error(capsys, ["render", "script", "nope.py", "-o", "x"])
    assert "name the program" in _one_line_error(capsys, ["render", "script", "-o", "x"])
    assert "takes --set" in _one_line_error(capsys, ["render", "llama3_3_70b_lora", "-o", "x", "--", "--lr", "1"])
    assert "only the script recipe" in _one_line_error(capsys, ["render", "llama3_3_70b_lora", "train.py", "-o", "x"])
    assert "no config to --set" in _one_line_error(capsys, ["render", "script", "train.py", "--set", "a=1", "-o", "x"])
    Path("bad.py").write_text("def f(:\n")
    assert "bad.py line 1" in _one_line_error(capsys, ["render", "script", "bad.py", "-o", "x"])
    assert not Path("x").exists()
