"""`cookbook render` asks the planner whether the job fits before anything is queued."""

from __future__ import annotations

from cookbook.cli import main


def test_render_warns_when_the_plan_does_not_fit(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    assert (
        main(
            ["render", "llama3_3_70b_full", "--nodes", "1", "--gpus-per-node", "8", "--gpu", "a100-40", "-o", str(out)]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "planner: llama3_3_70b_full does not fit on A100 40GB" in err
    assert out.is_file()


def test_render_is_quiet_about_memory_when_it_fits(tmp_path, capsys):
    assert (
        main(
            [
                "render",
                "llama3_3_70b_full",
                "--nodes",
                "2",
                "--gpus-per-node",
                "8",
                "--gpu",
                "h100",
                "-o",
                str(tmp_path / "job.sbatch"),
            ]
        )
        == 0
    )
    assert "planner:" not in capsys.readouterr().err
