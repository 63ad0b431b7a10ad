"""The Python API (`cookbook.Executor` / `cookbook.Job`) on the real local cluster: the README's example runs
as it is written (as submitit tests its README), and `map_array` submits one real job per override set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_wait import OUTER_LIMIT_S

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The python block of the README's "Python API" section."""
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]  # type: ignore[index]


def test_the_readme_example_runs_as_written(slurm, tiny_assets, tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, **slurm.env},
        capture_output=True,
        text=True,
        timeout=OUTER_LIMIT_S,  # a loaded machine stretches the job: no tighter deadline
    )
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0].split()
    assert first[0].isdigit() and first[1] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED")
    steps = re.findall(r"(?m)^\s*(\d+)\s+(\d+\.\d+)\s*$", r.stdout)
    assert [int(s) for s, _ in steps] == [1, 2, 3, 4], r.stdout
    assert float(steps[-1][1]) < float(steps[0][1])  # it learns
    assert "goodput" in r.stdout and "allocated" in r.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "metrics.png").is_file() and (run / "job.json").is_file()


def test_map_array_submits_one_job_per_override_set_and_failures_name_their_cause(slurm, tiny_assets, tmp_path):
    from cookbook import Executor, load_job
    from cookbook.executor import JobFailed
    from cookbook.spec import SpecError

    executor = Executor(tmp_path / "sweep", profile="local-cpu", client=slurm)
    executor.update_parameters(nodes=1, time="00:10:00")
    jobs = executor.map_array("llama3_8b_c4", [{"training.steps": 2}, {"training.steps": 3}])
    assert len({j.job_id for j in jobs}) == 2 and len({j.script.parent for j in jobs}) == 2
    tables = [j.result(timeout=OUTER_LIMIT_S) for j in jobs]
    assert [list(t["step"]) for t in tables] == [[1, 2], [1, 2, 3]]
    again = load_job(jobs[1].script.parent, client=slurm)
    assert again.job_id == jobs[1].job_id and again.state == "COMPLETED" and again.done()
    assert "[rank0]:" in again.stdout() and again.stderr() == again.stdout()

    with pytest.raises(ValueError, match="unknown parameter"):
        executor.update_parameters(gpus=8)
    with pytest.raises(SpecError):
        executor.spec("llama3_8b_c4", **{"training.no_such_key": 1})
    # a dataset under a top folder this machine lacks is a warning at render (it may be the nodes' own mount); the
    # run fails on it
    bad = executor.submit("llama3_8b_c4", **{"training.steps": 2, "dataloader.dataset_path": "/no-such-mount/c4"})
    with pytest.raises(JobFailed, match=f"job {bad.job_id} ended FAILED"):
        bad.result(timeout=OUTER_LIMIT_S)
    findings = bad.diagnose()  # what the log says went wrong, each with what to do
    assert findings and all(f.hint and f.line in bad.stdout() for f in findings), findings
    # beyond what a job that trained also shows (the local cluster's c10d hostname warning): the failure
    assert {f.kind for f in findings} - {f.kind for f in jobs[0].diagnose()}, findings

    report = again.rehearse(timeout=300)  # the same script, a check on every node in the launcher's place
    assert report.job_id and report.job_id != again.job_id and len(report.nodes) == 1, report.table()
    assert report.ok, report.table()
