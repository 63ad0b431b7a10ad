"""The committed notebooks: generated from notebooks/build_notebooks.py, no outputs, parameters tagged."""

from __future__ import annotations

import importlib.util
import json

import nbformat
import pytest

from cookbook.notebook_runner import notebook_dir, notebooks

REQUIRED = ["00_setup", "01_plug_in_your_dataset", "02_llama3_3_70b_full_finetune", "03_llama3_3_70b_lora",
            "04_flux_schnell_pretraining", "05_profiling", "06_llama3_8b_c4_torchtitan"]


def _source():
    spec = importlib.util.spec_from_file_location("build_notebooks", notebook_dir() / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_required_notebook_exists():
    assert set(REQUIRED) <= set(notebooks())


@pytest.mark.parametrize("name", notebooks())
def test_committed_without_outputs(name):
    nb = json.loads((notebook_dir() / f"{name}.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{name}: a cell has outputs; clear them before committing"
            assert cell["execution_count"] is None, f"{name}: a cell has an execution count"


@pytest.mark.parametrize("name", notebooks())
def test_matches_its_source(name):
    """`python notebooks/build_notebooks.py` regenerates every notebook; the committed file must match."""
    assert (notebook_dir() / f"{name}.ipynb").read_text() == _source().text(name), \
        f"{name}.ipynb drifted from notebooks/build_notebooks.py: edit the source and regenerate"


@pytest.mark.parametrize("name", notebooks())
def test_shape(name):
    nb = nbformat.read(str(notebook_dir() / f"{name}.ipynb"), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "prose first: a title"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    code = [c for c in nb.cells if c.cell_type == "code" and c is not tagged[0]]
    assert all(len(c.source.splitlines()) <= 6 for c in code), "thin steps: a code cell is a few lines"
    assert nb.cells[-1].cell_type == "markdown" or "outputs" in nb.cells[-1].source
    assert any("What to look at" in c.source for c in nb.cells if c.cell_type == "markdown")
