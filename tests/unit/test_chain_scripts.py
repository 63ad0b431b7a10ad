"""Issue 19, item 7 without Slurm: `dependency` validated, the array script and the CPU data job rendered with the
same #SBATCH lines and checks (shellcheck-clean), and an array task's batch step requeuing that task only."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from batch_step import FakeSlurm

from cookbook.render import render_job, write_array, write_command_job
from cookbook.spec import JobSpec, SpecError, check_spec, make_spec
from cookbook_runtime import slurm


@pytest.mark.parametrize(
    "value", ["afterok:12", "afterok:12:13,afterany:14", "afternotok:7_3", "singleton", "after:5?afterok:6"]
)
def test_dependency_accepts_slurms_forms(value):
    spec = make_spec("llama3_3_70b_lora", "nebius", dependency=value)
    assert check_spec(spec) == []
    assert f"#SBATCH --dependency={value}" in render_job(spec).script.replace("'", "")


@pytest.mark.parametrize("value", ["afterok12", "afterok:", "ok:12", "afterok:12;rm -rf /", "afterok:x"])
def test_dependency_refuses_anything_else_in_one_line(value):
    (problem,) = check_spec(make_spec("llama3_3_70b_lora", "nebius", dependency=value))
    assert problem.startswith(f"dependency={value!r}: use Slurm's TYPE:JOBID")


def test_dependency_is_never_an_sbatch_arg():
    (problem,) = check_spec(make_spec("llama3_3_70b_lora", "nebius", sbatch_extra=["--dependency=afterok:3"]))
    assert "set dependency (--dependency) instead" in problem


def _specs(n: int = 2, **fields) -> list[JobSpec]:
    return [
        replace(
            make_spec("llama3_3_70b_lora", "nebius", overrides={"model.lora_rank": str(8 * (i + 1))}, **fields),
            job_name=f"sw-{i}",
        )
        for i in range(n)
    ]


def test_array_script_runs_each_task_script_with_a_limit(tmp_path):
    script = write_array(_specs(3, dependency="afterok:9"), tmp_path / "a", "sw", parallelism=2)
    text = script.read_text()
    assert (
        "#SBATCH --job-name=sw" in text and "#SBATCH --array=0-2%2" in text and "#SBATCH --dependency=afterok:9" in text
    )
    assert "#SBATCH --output=%x-%A_%a.out" in text and "#SBATCH --signal=B:USR1@120" in text
    assert 'exec bash "$ARRAY_DIR/task-${SLURM_ARRAY_TASK_ID}/job.sbatch"' in text
    for i in range(3):
        task = (tmp_path / "a" / f"task-{i}" / "job.sbatch").read_text()
        assert f"#SBATCH --job-name=sw-{i}" in task
    assert "--array" not in (tmp_path / "a" / "task-0" / "job.sbatch").read_text()
    assert "%" not in write_array(_specs(2), tmp_path / "b", "sw").read_text().split("--array=")[1].split("\n")[0]
    if shutil.which("shellcheck"):
        r = subprocess.run(
            ["shellcheck", str(script), str(tmp_path / "a/task-1/job.sbatch")], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout


def test_array_refuses_what_one_array_cannot_be(tmp_path):
    with pytest.raises(SpecError, match="parallelism=0"):
        write_array(_specs(), tmp_path / "a", "sw", parallelism=0)
    mixed = _specs()
    mixed[1] = replace(mixed[1], time="01:00:00")
    with pytest.raises(SpecError, match="share their Slurm settings; these differ: time"):
        write_array(mixed, tmp_path / "b", "sw")
    with pytest.raises(SpecError, match="no_such_key"):  # each task is validated as a job of its own
        write_array(_specs(1) + [replace(_specs(1)[0], overrides={"no_such_key": "1"})], tmp_path / "c", "sw")


ARRAY_TASK_0 = {"SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "41"}


def test_an_array_task_requeues_itself_not_the_array(tmp_path, monkeypatch):
    """Task 0 of array 41 runs as job 41 too, and `scontrol requeue 41` would requeue the whole array: every
    requeue of its batch step (after a stop-save, after a node exclusion) names 41_0. The array script runs for
    real (bash, the task script, the runtime it ships) against stand-in srun/scontrol that record their
    arguments."""
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    assert slurm.self_id() == "41"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert slurm.self_id() == "41_0"
    script = write_array(_specs(1), tmp_path / "a", "sw")
    saved = FakeSlurm(tmp_path / "saved").run_script(script, FAKE_SRUN="signal:USR1", **ARRAY_TASK_0)
    assert "cookbook: requeueing job 41 after the stop-save" in saved.out, saved.out
    assert [a for a in saved.argv("scontrol") if a[0] == "requeue"] == [["requeue", "41_0"]]
    room = {"FAKE_SINFO": "n1|idle|\nn2|idle|\nn3|idle|", "FAKE_JOB_RECORD": "JobId=41_0 Partition=debug"}
    hung = FakeSlurm(tmp_path / "hung").run_script(script, FAKE_SRUN="hang", **room, **ARRAY_TASK_0)
    assert "cookbook: excluding n2 (hang: rank 1 on n2" in hung.out, hung.out
    asked = [a for a in hung.argv("scontrol") if a[0] in ("requeuehold", "update", "release", "requeue")]
    assert asked == [
        ["requeuehold", "41_0"],
        ["update", "JobId=41_0", "ExcNodeList=n2", "StartTime=now+10"],
        ["release", "41_0"],
    ]
    assert not hung.argv("sbatch")


def test_cpu_job_runs_one_quoted_command(tmp_path):
    spec = JobSpec(
        recipe="data-c4",
        nodes=1,
        gpus_per_node=0,
        exclusive=False,
        requeue=False,
        time="00:05:00",
        dependency="afterok:4",
    )
    script = write_command_job(
        spec, ["python", "-m", "cookbook", "data", "c4", "my file.txt"], tmp_path / "j.sbatch", tmp_path, "data c4"
    )
    text = script.read_text()
    assert (
        "#SBATCH --dependency=afterok:4" in text and "#SBATCH --gpus-per-node" not in text and "--requeue" not in text
    )
    assert text.rstrip().endswith("python -m cookbook data c4 'my file.txt'")
    with pytest.raises(SpecError, match="1 node without GPUs"):
        write_command_job(replace(spec, nodes=2), ["true"], tmp_path / "k.sbatch", tmp_path, "x")
    with pytest.raises(SpecError, match="time="):
        write_command_job(replace(spec, time="soon"), ["true"], tmp_path / "k.sbatch", tmp_path, "x")
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(script)], capture_output=True).returncode == 0


def test_data_submit_flags_are_refused_in_one_line(capsys, tmp_path, monkeypatch):
    from cookbook.cli import main

    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("x\n")
    assert main(["data", "c4", "a.txt", "--output-dir", "o", "--submit", "--dependency", "afterok12"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid job: dependency='afterok12'") and err.count("\n") == 1


@pytest.mark.parametrize(
    "command",
    [
        ["data", "cc12m", "images", "--output-dir", "out dir", "--shard-size", "2"],
        ["data", "check", "chat.jsonl", "--style", "openai", "--model-dir", "m", "--max-seq-len", "512"],
        ["data", "layout", "cc12m", "out dir", "--output-size", "64"],
    ],
)
def test_data_submit_renders_the_same_command_as_a_cpu_job(capsys, tmp_path, monkeypatch, command):
    """`cookbook data ... --submit` (cc12m's layout, check's tokenizing, a layout check) with a stand-in sbatch that
    records its arguments: the job runs the command without the job flags, with the job's Slurm options."""
    from cookbook.cli import main

    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\necho 77\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    flags = ["--submit", "--partition", "cpu", "--time=00:20:00", "--dependency", "afterok:5", "--mem", "8G"]
    assert main([*command, *flags]) == 0
    out = capsys.readouterr().out
    assert f"submitted data-{command[1]} job 77" in out and "--dependency afterok:77" in out
    (call,) = (tmp_path / "calls").read_text().splitlines()
    script = Path(call.split()[-1])
    assert script.parent.parent == tmp_path / ".cookbook-jobs" and script.parent.name.startswith(f"data-{command[1]}-")
    text = script.read_text()
    for line in (
        "--partition=cpu",
        "--time=00:20:00",
        "--dependency=afterok:5",
        "--mem=8G",
        f"--job-name=data-{command[1]}",
    ):
        assert f"#SBATCH {line}" in text.replace("'", "")
    assert "#SBATCH --gpus-per-node" not in text and "--requeue" not in text
    last = text.rstrip().splitlines()[-1]
    assert last.endswith("-m cookbook " + " ".join(f"'{w}'" if " " in w else w for w in command)), last
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(script)], capture_output=True).returncode == 0
