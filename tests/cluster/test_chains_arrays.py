"""Issue 19, items 4 and 7 on the real local cluster: a data-preparation CPU job (`cookbook data c4 --submit`), a
sweep that waits on it (`--dependency=afterok:ID`) as ONE Slurm array with a concurrency limit (`%1`), under a
site profile from the user's own profile file; a task told to requeue (USR1) requeues itself, not the array."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SITE = """
cpusite:
  extends: local-cpu
  description: a site profile from the user's own file
  env:
    COOKBOOK_SITE_MARK: {value: from-the-site-file, source: tests/cluster/test_chains_arrays.py}
"""


def test_data_job_then_a_sweep_array_that_waits_on_it(slurm, tiny_assets, tmp_path, monkeypatch):
    from cookbook import Executor

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config/cookbook/profiles").mkdir(parents=True)
    (tmp_path / "config/cookbook/profiles/site.yaml").write_text(SITE)
    (tmp_path / "a.txt").write_text("the first document of the corpus\n")
    (tmp_path / "b.txt").write_text("and a second one\n")

    # 1. the data job: the command a user types, with --submit
    r = subprocess.run(
        [sys.executable, "-m", "cookbook", "data", "c4", "a.txt", "b.txt", "--output-dir", "c4", "--submit"]
        + ["--time", "00:05:00"],
        cwd=tmp_path,
        env={**os.environ, **slurm.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data_id = re.search(r"submitted data-c4 job (\d+) ", r.stdout)[1]  # type: ignore[index]
    assert f"--dependency afterok:{data_id}" in r.stdout

    # 2. the sweep: one array, one task at a time, after the data job, under the user's profile
    executor = Executor(tmp_path / "sweep", profile="cpusite", client=slurm)
    executor.update_parameters(nodes=1, time="00:10:00", dependency=f"afterok:{data_id}")
    jobs = executor.map_array("llama3_8b_c4", [{"training.steps": 3}, {"training.steps": 4}], parallelism=1)
    array_id = jobs[0].job_id.split("_")[0]
    assert [j.job_id for j in jobs] == [f"{array_id}_0", f"{array_id}_1"]
    array_script = (jobs[0].script.parent.parent / "job.sbatch").read_text()
    assert "#SBATCH --array=0-1%1" in array_script and f"#SBATCH --dependency=afterok:{data_id}" in array_script
    task_script = jobs[0].script.read_text()
    assert "profile cpusite" in task_script and "export COOKBOOK_SITE_MARK=from-the-site-file" in task_script
    shown = slurm.run("scontrol", "show", "job", array_id).stdout
    assert "ArrayTaskThrottle=1" in shown, shown

    # 3. the last task holds the array's own job id (Slurm gives it to the task that starts last): told to requeue,
    # as Slurm does before the time limit, it requeues itself only (`scontrol requeue $SLURM_JOB_ID` would be all)
    last = jobs[1]
    deadline = time.time() + 600
    while time.time() < deadline and "[rank0]:" not in (last.stdout() if last.log.exists() else ""):
        time.sleep(0.5)
    assert f"job {array_id}: 1 node(s)" in last.stdout(), last.stdout()
    slurm.run("scancel", "--batch", "--signal=USR1", last.job_id)
    slurm.release_requeued(last.job_id)  # Slurm holds a requeued job back (BeginTime, ~2 min); skip the wait
    infos = [j.wait(timeout=900, poll=2) for j in jobs]
    assert [i.state for i in infos] == ["COMPLETED", "COMPLETED"], [j.tail(30) for j in jobs]
    starts = [re.findall(r"(?m)^job \d+: 1 node\(s\)", j.stdout()) for j in jobs]
    assert len(starts[0]) == 1 and "got USR1" not in jobs[0].stdout()  # task 0 ran once, never requeued
    # the stop-save (issue 16): the ranks save at their next step boundary, then the task requeues itself
    assert len(starts[1]) == 2 and f"cookbook: requeueing job {array_id} after the stop-save" in last.stdout()
    assert list(jobs[0].metrics()["step"]) == [1, 2, 3]
    assert list(last.metrics()["step"])[-1] == 4

    # 4. the chain: the data job ended COMPLETED before the first task started; its output is there
    def show(job_id: str) -> dict[str, str]:
        text = slurm.run("scontrol", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    data = show(data_id)
    assert data["JobState"] == "COMPLETED" and (tmp_path / "c4" / "en").is_dir()
    assert show(jobs[0].job_id)["StartTime"] >= data["EndTime"], (data, show(jobs[0].job_id))
