"""Secrets never reach Slurm's record of a job (issue 40): every Slurm command the engine runs gets the environment
minus ``SECRET_NAMES`` (sbatch's default ``--export=ALL`` would copy them into slurmctld's state), and a secret
that no file on the node gives the job is named at submit in one warning line, never its value.

A stand-in ``sbatch`` on PATH writes the environment it was started with; the client and the CLI are the real ones.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, withheld_secrets_warning
from cookbook.spec import SECRET_NAMES, make_spec

SECRETS = {name: f"{name.lower()}-VALUE-7f3a9c" for name in SECRET_NAMES}
FAKE_SBATCH = '#!/bin/sh\nenv -0 > "$SBATCH_ENV_DUMP"\necho "4242;cluster"\n'


def fake_sbatch(tmp_path: Path) -> dict[str, str]:
    """A PATH whose ``sbatch`` dumps its environment to ``SBATCH_ENV_DUMP``; a bare HOME (no token files)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    home = tmp_path / "home"
    home.mkdir()
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "SBATCH_ENV_DUMP": str(tmp_path / "sbatch.env"),
    }


def sbatch_env(tmp_path: Path) -> dict[str, str]:
    """The environment the stand-in sbatch was started with."""
    entries = (tmp_path / "sbatch.env").read_text().split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def script(tmp_path: Path) -> Path:
    return write_job(make_spec("llama3_8b_c4", profile="local-cpu"), tmp_path / "job" / "job.sbatch")


def test_sbatch_gets_no_secret_and_everything_else(tmp_path, capsys):
    env = {**fake_sbatch(tmp_path), **SECRETS, "HF_HOME": str(tmp_path / "hf"), "MY_SETTING": "kept"}
    client = SlurmClient(env)
    assert client.submit(script(tmp_path), cwd=tmp_path) == "4242"
    seen = sbatch_env(tmp_path)
    assert not set(SECRET_NAMES) & set(seen), sorted(set(SECRET_NAMES) & set(seen))
    assert seen["MY_SETTING"] == "kept" and seen["HF_HOME"] == str(tmp_path / "hf") and seen["HOME"] == env["HOME"]
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), err
    assert all(name in err for name in SECRET_NAMES) and "record of the job" in err
    assert "hf auth login" in err and "wandb login" in err and "~/.mlflow/credentials" in err
    assert not any(value in err for value in SECRETS.values())
    client.submit(script(tmp_path), cwd=tmp_path)  # the same line is said once per client
    assert capsys.readouterr().err == ""


def test_cookbook_submit_gives_sbatch_no_hf_token(tmp_path, monkeypatch, capsys):
    for k, v in {**fake_sbatch(tmp_path), "HF_TOKEN": SECRETS["HF_TOKEN"]}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    assert main(["submit", str(script(tmp_path))]) == 0
    assert "HF_TOKEN" not in sbatch_env(tmp_path)
    out, err = capsys.readouterr()
    assert out.strip() == "4242"
    assert err.count("\n") == 1 and "HF_TOKEN" in err and "hf auth login" in err
    assert SECRETS["HF_TOKEN"] not in out + err


def test_no_warning_where_the_node_reads_each_secret_from_its_file(tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".mlflow").mkdir()
    env = {"HOME": str(home), "HF_TOKEN": "x", "HUGGING_FACE_HUB_TOKEN": "x", "WANDB_API_KEY": "x"}
    env["MLFLOW_TRACKING_PASSWORD"] = "x"
    assert withheld_secrets_warning(env) is not None
    (home / ".cache" / "huggingface" / "token").write_text("hf_file")
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k3y\n")
    (home / ".mlflow" / "credentials").write_text(
        "[mlflow]\nmlflow_tracking_username = u\nmlflow_tracking_password = p\n"
    )
    assert withheld_secrets_warning(env) is None
    assert withheld_secrets_warning({"HOME": str(home)}) is None  # no secret exported: nothing to say


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"HF_HOME": "/nonexistent/hf"}, "HF_TOKEN"),  # the job reads HF_HOME/token, not ~/.cache's
        ({"HF_TOKEN_PATH": "/nonexistent/token"}, "HF_TOKEN"),
        ({"WANDB_BASE_URL": "https://wandb.example.org"}, "WANDB_API_KEY"),  # ~/.netrc has api.wandb.ai only
        ({"NETRC": "/nonexistent/netrc"}, "WANDB_API_KEY"),
        ({"MLFLOW_TRACKING_TOKEN": "t"}, "MLFLOW_TRACKING_TOKEN"),  # MLflow reads no token from a file
    ],
)
def test_the_file_looked_for_is_the_one_the_job_reads(tmp_path, extra, named):
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_file")
    (home / ".netrc").write_text("machine api.wandb.ai login user password k3y\n")
    env = {"HOME": str(home), "HF_TOKEN": "x", "WANDB_API_KEY": "x", **extra}
    warning = withheld_secrets_warning(env)
    assert warning is not None and named in warning, warning
    others = {"HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN"} - {named}
    assert not any(f"{name} " in warning or f"{name}," in warning for name in others), warning
