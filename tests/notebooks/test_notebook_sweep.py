"""The papermill sweep (07): notebook 03 run once per LoRA rank, results overlaid on one plot."""

from __future__ import annotations

import pytest

from cookbook.notebook_runner import NotebookStopped, local_parameters, run_notebook, sweep

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_sweep_notebook_compares_ranks(slurm, tiny_assets, kernel_dirs, artifacts, tmp_path):
    try:
        name = "07_sweep_lora_rank"
        executed = run_notebook(name, artifacts, local_parameters(name), cwd=tmp_path, name=f"{name}.local")
    except NotebookStopped as e:
        pytest.fail(f"{e} (see {e.path})")
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    table_html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "rank 4" in table_html and "rank 16" in table_html


def test_sweep_function_records_each_run(slurm, tiny_assets, kernel_dirs, tmp_path):
    import os

    here = os.getcwd()
    runs = {"r2": {"model.lora_rank": 2}, "r8": {"model.lora_rank": 8}, "r32": {"model.lora_rank": 32}}
    lora = "03_llama3_3_70b_lora"
    result = sweep(lora, runs, out_dir=tmp_path, base_parameters=local_parameters(lora), parallel=2)
    assert os.getcwd() == here
    table = result.table()
    assert list(table["run"]) == ["r2", "r8", "r32"]
    assert table["job"].nunique() == 3, "each run submitted its own job into its own folder"
    assert table["error"].isna().all()
    assert (table["steps"] > 0).all()
    # the adapter really had the rank asked for
    for run in result.runs:
        assert run.job.script.is_relative_to(run.work)
        cfg = (run.job.script.parent / "job.yaml").read_text()
        assert f"lora_rank: {run.overrides['model.lora_rank']}" in cfg
    fig = result.plot(out=tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 0
    assert len(fig.axes[0].get_legend().get_texts()) == 3
