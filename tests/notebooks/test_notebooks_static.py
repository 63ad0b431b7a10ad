"""The committed notebooks are the source (edited in JupyterLab): their structure is checked, not their text.

The rules are in notebook_structure.py (its docstring lists them); the parameters' defaults and the
shared cells live in cookbook/notebook_runner.py and each notebook must agree with them.
"""

from __future__ import annotations

import nbformat
import pytest
from notebook_structure import problems

from cookbook.notebook_runner import default_parameters, local_parameters, notebook_dir, notebook_name, notebooks

REQUIRED = [
    "00_setup",
    "01_plug_in_your_dataset",
    "02_llama3_3_70b_full_finetune",
    "03_llama3_3_70b_lora",
    "04_flux_schnell_pretraining",
    "05_profiling",
    "06_llama3_8b_c4_torchtitan",
]


def test_every_required_notebook_exists():
    assert set(REQUIRED) <= set(notebooks())
    assert not list(notebook_dir().glob("*.py")), "the .ipynb files are the source: no generator beside them"


@pytest.mark.parametrize("name", notebooks())
def test_structure(name):
    """Clean, prose first, one parameters cell agreeing with default_parameters, thin steps, shared cells."""
    assert problems(notebook_dir() / f"{name}.ipynb") == []


@pytest.mark.parametrize("name", notebooks())
def test_local_parameters_are_parameters_of_the_notebook(name, tiny_assets):
    """papermill passes local_parameters to the notebook: each name must be one its parameters cell sets."""
    local = local_parameters(name, tiny_assets)
    assert set(local) <= set(default_parameters(name))
    if "base_parameters" in local:  # the sweep passes them on to notebook 03
        assert set(local["base_parameters"]) <= set(default_parameters("03_llama3_3_70b_lora"))


def test_notebooks_are_named_not_numbered():
    assert notebook_name("03") == notebook_name("03_llama3_3_70b_lora.ipynb") == "03_llama3_3_70b_lora"
    with pytest.raises(ValueError, match="no walkthrough notebook '99_nope'"):
        local_parameters("99_nope")


def _set(source: str, new: str):
    """An edit: the first code cell reading ``source`` now reads ``new``."""

    def edit(nb):
        next(c for c in nb.cells if c.cell_type == "code" and c.source == source).source = new

    return edit


def _params(nb):
    return next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))


def _set_params(change):
    def edit(nb):
        _params(nb).source = change(_params(nb).source)

    return edit


BREAKS = {  # an edit of notebook 03 -> the problem it must be reported as
    "code first": (
        lambda nb: nb.cells.insert(0, nbformat.v4.new_code_cell("wt.check_job(spec)")),
        "prose first: cell 0 must be markdown",
    ),
    "two parameters cells": (lambda nb: nb.cells.insert(1, _params(nb).copy()), "2 cells are tagged `parameters`"),
    "a parameter removed": (
        _set_params(lambda src: src.replace("gpu = ", "# gpu = ")),
        "lacks `gpu` (default_parameters: 'H100')",
    ),
    "a computed parameter": (
        _set_params(lambda src: src + "\nn = nodes * 2"),
        "only `name = literal` lines belong there",
    ),
    "a function": (_set("job.plot()", "def show():\n    job.plot()"), "has FunctionDef: logic a reader would copy"),
    "a long cell": (_set("job.plot()", "job.plot()\n" * 7), "has 7 lines of code (at most 6)"),
    "a cell that calls nothing": (_set("job.plot()", "x = 1"), "calls nothing"),
    "widget state saved": (lambda nb: nb.metadata.update(widgets={"state": {}}), "widget state is saved"),
    "a shared cell rewritten": (_set("job.wait()", "job.wait(timeout=60)"), "the shared `wait` cell"),
}


@pytest.mark.parametrize("edit", BREAKS)
def test_each_rule_catches_its_break(edit, tmp_path):
    change, message = BREAKS[edit]
    path = tmp_path / "03_llama3_3_70b_lora.ipynb"
    nb = nbformat.read(str(notebook_dir() / path.name), as_version=4)
    change(nb)
    nbformat.write(nb, str(path))
    found = problems(path)
    assert any(message in p for p in found), found
