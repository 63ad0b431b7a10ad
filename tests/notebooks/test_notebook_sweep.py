"""The sweep (07): notebook 03's job once per LoRA rank, results overlaid on one plot. Notebook 07 runs it as
ONE Slurm array (its default, `array=True`); `sweep(array=False)` runs notebook 03 once per rank with papermill."""

from __future__ import annotations

import re

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
    from notebook_checks import check_quiet

    check_quiet(executed)
    nb = nbformat.read(str(executed), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    table_html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "rank 4" in table_html and "rank 16" in table_html

    # the runs were ONE Slurm array (%2 = parallel), every task COMPLETED, each with its own rank and losses
    from cookbook.notebook_runner import SweepResult, SweepRun, jobs_in

    jobs = jobs_in(tmp_path)
    array_id = jobs[0].job_id.split("_")[0]
    assert sorted(j.job_id for j in jobs) == [f"{array_id}_0", f"{array_id}_1"], "one array, no other job"
    shown = slurm.run("scontrol", "show", "job", array_id).stdout
    tasks = re.findall(r"(?m)^JobId=\d+ ArrayJobId=(\d+) ArrayTaskId=(\d+)", shown)
    assert sorted(tasks) == [(array_id, "0"), (array_id, "1")], shown
    assert "ArrayTaskThrottle=2" in shown, shown
    assert [j.info().state for j in jobs] == ["COMPLETED", "COMPLETED"]
    assert "#SBATCH --array=0-1%2" in (jobs[0].script.parent.parent / "job.sbatch").read_text()
    runs = [SweepRun(f"rank {r}", {}, None, j.script.parent) for r, j in zip((4, 16), jobs, strict=True)]
    table = SweepResult(runs).table()
    assert list(table["run"]) == ["rank 4", "rank 16"] and (table["steps"] > 0).all()
    assert table["first loss"].notna().all() and table["last loss"].notna().all()
    for r, j in zip((4, 16), jobs, strict=True):
        assert f"lora_rank: {r}" in (j.script.parent / "job.yaml").read_text()


def test_sweep_function_records_each_run(slurm, tiny_assets, kernel_dirs, tmp_path):
    import os

    here = os.getcwd()
    runs = {"r2": {"model.lora_rank": 2}, "r8": {"model.lora_rank": 8}}  # two at once: papermill's chdir race
    lora = "03_llama3_3_70b_lora"
    base = {**local_parameters(lora), "try_preemption": False}  # the notebooks' own test preempts; a sweep need not
    result = sweep(lora, runs, out_dir=tmp_path, base_parameters=base, parallel=2, array=False)
    assert os.getcwd() == here
    table = result.table()
    assert list(table["run"]) == ["r2", "r8"]
    assert table["job"].nunique() == 2, "each run submitted its own job into its own folder"
    assert table["error"].isna().all()
    assert (table["steps"] > 0).all()
    # the adapter really had the rank asked for
    for run in result.runs:
        assert run.job.script.is_relative_to(run.work)
        cfg = (run.job.script.parent / "job.yaml").read_text()
        assert f"lora_rank: {run.overrides['model.lora_rank']}" in cfg
    fig = result.plot(out=tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 0
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [t.split(":")[0] for t in legend] == ["r2", "r2", "r8", "r8"], legend  # each run: final loss, smoothed
