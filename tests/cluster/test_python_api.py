"""The Python API (`cookbook.Executor` / `cookbook.Job`) on the real local cluster: the README's example runs
as it is written (as submitit tests its README), and `map_array` submits one real job per override set."""

from __future__ import annotations

import os
import re
import secrets
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


def slurm_record(slurm, cluster, job_id: str) -> tuple[str, bytes, list[bytes]]:
    """What Slurm keeps of a live job: ``scontrol show job -dd``, its environment file in the controller's state
    folder (StateSaveLocation/hash.N/job.ID/environment), every environment file there."""
    shown = slurm.run("scontrol", "show", "job", "-dd", job_id).stdout
    state = cluster.cfg.root / "state"
    own = state / f"hash.{int(job_id) % 10}" / f"job.{job_id}" / "environment"
    return shown, own.read_bytes(), [p.read_bytes() for p in state.rglob("environment")]


def test_the_readme_example_runs_as_written(slurm, local_cluster, tiny_assets, tmp_path):
    """... with HF_TOKEN exported (issue 40): Slurm's record of the job holds no secret, and the job reads the
    token from the token file of its HF_HOME."""
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    exported, in_file = f"hf_EXPORTED{secrets.token_hex(12)}", f"hf_INFILE{secrets.token_hex(12)}"
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir(mode=0o700)
    (hf_home / "token").write_text(in_file)
    env = {**os.environ, **slurm.env, "HF_TOKEN": exported, "HF_HOME": str(hf_home), "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        first_line = p.stdout.readline() if p.stdout else ""
        record = slurm_record(slurm, local_cluster, first_line.split()[0]) if first_line[:1].isdigit() else None
        try:
            rest, err = p.communicate(timeout=OUTER_LIMIT_S)  # a loaded machine stretches the job: no tighter deadline
        finally:
            p.kill()
    stdout = first_line + rest
    assert p.returncode == 0, stdout + err
    first = stdout.splitlines()[0].split()
    assert first[0].isdigit() and first[1] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED")
    steps = re.findall(r"(?m)^\s*(\d+)\s+(\d+\.\d+)\s*$", stdout)
    assert [int(s) for s, _ in steps] == [1, 2, 3, 4], stdout
    assert float(steps[-1][1]) < float(steps[0][1])  # it learns
    assert "goodput" in stdout and "allocated" in stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "metrics.png").is_file() and (run / "job.json").is_file()
    # no secret in Slurm's record of the job (its own environment file holds the rest of ours); the job has the token
    assert record is not None
    shown, own, every = record
    assert f"HF_HOME={hf_home}".encode() in own and b"HF_TOKEN" not in own
    assert exported not in shown and not any(exported.encode() in e or in_file.encode() in e for e in every)
    assert "warning:" not in err  # the token file is there: nothing to say
    (log,) = run.rglob("*.out")
    assert "HF token: present" in log.read_text() and exported not in log.read_text()


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
