"""Issue 15, problem 12: every job notebook's default model path is on the shared filesystem.

The notebook's own parameters cell and spec cell are executed (``wt.job_spec`` stubbed: it would validate the
paths), then the script variables of the recipe's start paths are resolved as the job would see them in the
fresh per-submission folder ``wt.submit`` renders into: none may be under ``/tmp`` (node-local) or inside that
folder (the model is never there).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from cookbook import walkthrough
from cookbook.notebook_runner import cluster_parameters, default_parameters, notebooks
from cookbook.paths import project_root
from cookbook.recipes import get_recipe
from cookbook.render import resolve_here
from cookbook.spec import make_spec

JOB_NOTEBOOKS = [n for n in notebooks() if set(cluster_parameters()) <= set(default_parameters(n))]


def spec_as_the_notebook_builds_it(name: str):
    nb = nbformat.read(str(project_root() / "notebooks" / f"{name}.ipynb"), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    spec_cell = next(src for src in code if "wt.job_spec(" in src)
    ns: dict = {}
    exec(compile(ast.parse(params), "parameters", "exec"), ns)
    built: dict = {}
    fake = SimpleNamespace(
        **{
            **vars(walkthrough),
            "job_spec": lambda recipe, **kw: (
                built.update(recipe=recipe, **kw) or SimpleNamespace(**kw, describe=lambda: "")
            ),
        }
    )
    exec(compile(ast.parse(spec_cell), "spec", "exec"), {**ns, "wt": fake})
    return make_spec(built["recipe"], ns["profile"], overrides=built["overrides"], nodes=ns["nodes"]), ns


def test_every_job_notebook_is_checked():
    assert {"02_llama3_3_70b_full_finetune", "04_flux_schnell_pretraining", "06_llama3_8b_c4_torchtitan"} <= set(
        JOB_NOTEBOOKS
    )


@pytest.mark.parametrize("name", JOB_NOTEBOOKS)
def test_default_model_path_is_shared_not_tmp_nor_the_run_folder(name, monkeypatch):
    monkeypatch.chdir(project_root() / "notebooks")  # where JupyterLab starts the kernel
    spec, ns = spec_as_the_notebook_builds_it(name)
    recipe = get_recipe(spec.recipe)
    job_folder = (Path(ns["run_root"]) / f"{spec.name}-20260101-000000-000").resolve()  # as wt.submit makes it
    spec = replace(spec, recipe_dir=str(job_folder))
    variables = recipe.start_variables(spec)
    models = Path(ns["run_root"]).resolve().parent / "models"
    checked = 0
    for sp in recipe.start_paths(spec):
        value = resolve_here(spec.overrides.get(sp.key, sp.default), spec, variables)
        if sp.hub_ok and value and not value.startswith("/"):
            continue  # a Hub id
        assert value and value.startswith("/"), (name, sp.key, value)
        # node-local scratch, unless the checkout itself is there (a CI clone under /tmp)
        local = value.startswith(("/tmp/", "/dev/shm/")) and not Path(value).is_relative_to(project_root())
        assert not local, (name, sp.key, value)
        assert not Path(value).is_relative_to(job_folder), f"{name}: {sp.key}={value} is inside the job's own folder"
        assert Path(value).is_relative_to(models), (name, sp.key, value)
        checked += 1
    assert checked, f"{name}: {spec.recipe} has no start path to check"
    assert "model_dir" in ns and recipe.model_folder
