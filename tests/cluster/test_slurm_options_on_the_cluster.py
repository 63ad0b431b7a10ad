"""Slurm options against the real local cluster (nodes n1 and n2, partition debug): `sbatch --test-only` accepts
valid ones and its own refusal reaches the user; a job rendered with --exclude n1 runs on n2 only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cookbook.cli import main
from cookbook.render import test_only as slurm_test_only
from cookbook.spec import SpecError, make_spec

pytestmark = pytest.mark.cluster

RECIPE = "llama3_8b_c4"


def test_test_only_accepts_valid_options_and_shows_slurms_own_refusal(slurm):
    spec = make_spec(
        RECIPE,
        "local-cpu",
        nodes=1,
        partition="debug",
        exclude="n1",
        mem="0",
        sbatch_extra=["--comment=cookbook slurm options", "--hint=nomultithread"],
    )
    answer = slurm_test_only(spec, slurm)
    assert "to start at" in answer and "on nodes n2 " in answer, answer
    for change, said in (
        ({"reservation": "nope"}, "Requested reservation is invalid"),
        ({"exclude": "n[1-2]"}, "Requested node configuration is not available"),
        ({"constraint": "nosuchfeature"}, "Invalid feature specification"),
        ({"gres": "gpu:1"}, "Invalid generic resource (gres) specification"),
    ):
        with pytest.raises(SpecError) as e:
            slurm_test_only(replace(spec, **change), slurm)
        assert e.value.problems == [
            f"Slurm refuses the job (sbatch --test-only): {e.value.problems[0].split(': ', 1)[1]}"
        ]
        assert said in str(e.value) and "\n" not in str(e.value)


def test_cli_render_test_only(slurm, tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    base = ["render", RECIPE, "--profile", "local-cpu", "--nodes", "1", "--exclude", "n1", "--test-only"]
    assert main([*base, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "sbatch --test-only: " in err and "on nodes n2 " in err, err
    assert "#SBATCH --exclude=n1" in out.read_text().splitlines()
    bad = tmp_path / "bad.sbatch"
    assert main([*base, "--reservation", "nope", "-o", str(bad)]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning: ")]
    assert errors == [
        "error: invalid job: Slurm refuses the job (sbatch --test-only): "
        "allocation failure: Requested reservation is invalid"
    ]
    assert not bad.exists() and not (tmp_path / "bad.toml").exists()  # nothing written when Slurm refuses


@pytest.mark.slow
def test_a_job_rendered_with_exclude_runs_on_the_other_node_only(slurm, tiny_assets, tmp_path):
    from cookbook import Executor

    executor = Executor(tmp_path / "runs", profile="local-cpu", client=slurm)
    executor.update_parameters(
        nodes=1, partition="debug", exclude="n1", mem="0", sbatch_extra=["--comment=cookbook-exclude-test"]
    )
    assert "on nodes n2 " in executor.test_only(RECIPE)
    job = executor.submit(RECIPE, **{"training.steps": 2})
    assert list(job.result(timeout=600)["step"]) == [1, 2]
    assert job.info().nodes == "n2"
    assert "1 node(s) [n2]" in job.stdout()
    shown = slurm.show_job(job.job_id)
    assert shown.get("ExcNodeList") == "n1" and shown.get("Comment") == "cookbook-exclude-test", shown
