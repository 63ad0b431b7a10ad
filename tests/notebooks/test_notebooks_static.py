"""The committed notebooks are the source (edited in JupyterLab): their structure is checked, not their text.

The rules are in notebook_structure.py (its docstring lists them); the parameters' defaults and the
shared cells live in cookbook/notebook_runner.py and each notebook must agree with them.
"""

from __future__ import annotations

import pytest
from notebook_structure import problems

from cookbook.notebook_runner import (
    default_parameters,
    local_parameters,
    notebook_dir,
    notebook_name,
    notebooks,
)

REQUIRED = ["00_setup", "01_plug_in_your_dataset", "02_llama3_3_70b_full_finetune", "03_llama3_3_70b_lora",
            "04_flux_schnell_pretraining", "05_profiling", "06_llama3_8b_c4_torchtitan"]


def test_every_required_notebook_exists():
    assert set(REQUIRED) <= set(notebooks())
    assert not list(notebook_dir().glob("*.py")), "the .ipynb files are the source: no generator beside them"


@pytest.mark.parametrize("name", notebooks())
def test_structure(name):
    """Clean, prose first, one parameters cell agreeing with default_parameters, thin steps, shared cells."""
    assert problems(notebook_dir() / f"{name}.ipynb") == []


@pytest.mark.parametrize("name", notebooks())
def test_local_parameters_are_parameters_of_the_notebook(name, tmp_path):
    """papermill passes local_parameters to the notebook: each name must be one its parameters cell sets."""
    assets = type("Assets", (), {"llama_dir": tmp_path, "chat_sharegpt": tmp_path / "chat.json"})()
    local = local_parameters(name, assets)
    assert set(local) <= set(default_parameters(name))
    if "base_parameters" in local:             # the sweep passes them on to notebook 03
        assert set(local["base_parameters"]) <= set(default_parameters("03_llama3_3_70b_lora"))


def test_notebooks_are_named_not_numbered():
    assert notebook_name("03") == notebook_name("03_llama3_3_70b_lora.ipynb") == "03_llama3_3_70b_lora"
    with pytest.raises(ValueError, match="no walkthrough notebook '99_nope'"):
        local_parameters("99_nope")

