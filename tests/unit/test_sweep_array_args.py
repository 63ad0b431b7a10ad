"""sweep(array=True) reads the job notebook's recipe from its `RECIPE = ...` line and refuses what it cannot run."""

from __future__ import annotations

import pytest

from cookbook.notebook_runner import notebook_recipe, sweep


def test_the_recipe_comes_from_the_notebook():
    assert notebook_recipe("03") == "llama3_3_70b_lora"
    assert notebook_recipe("06_llama3_8b_c4_torchtitan.ipynb") == "llama3_8b_c4"
    with pytest.raises(ValueError, match="07_sweep_lora_rank is not a job notebook"):
        notebook_recipe("07")


def test_an_unknown_base_parameter_is_named_before_anything_is_submitted(tmp_path):
    with pytest.raises(ValueError, match=r"03_llama3_3_70b_lora has no parameter\(s\) lora_rank; its parameters: "):
        sweep("03", {"r8": {"model.lora_rank": 8}}, out_dir=tmp_path, base_parameters={"lora_rank": 8}, array=True)
    assert not list(tmp_path.iterdir())
