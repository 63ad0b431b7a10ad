"""File modes on a shared login node (issue 22): outputs follow the user's umask, secrets are 0600 in 0700.

Each test sets the process umask and puts it back: run these without threads writing files meanwhile
(pytest runs one test at a time per process).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import pytest

from cookbook.render import write_job
from cookbook.secure_files import is_private, make_executable, private_dir, write_private
from cookbook.spec import make_spec


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _script(tmp_path: Path) -> Path:
    return write_job(make_spec("llama3_3_70b_lora", profile="local-cpu"), tmp_path / "job" / "job.sbatch")


@pytest.mark.parametrize(("mask", "script_mode", "file_mode"), [(0o077, 0o700, 0o600), (0o022, 0o755, 0o644)])
def test_rendered_scripts_follow_the_umask(tmp_path, mask, script_mode, file_mode):
    with umask(mask):
        script = _script(tmp_path)
        plain = tmp_path / "plain"
        plain.write_text("x")
        assert mode(make_executable(plain)) == script_mode
    assert mode(script) == script_mode
    files = [p for p in script.parent.rglob("*") if p.is_file() and p != script]
    assert {mode(p) for p in files} <= {file_mode}  # its configs and the runtime: not executable


def test_secrets_are_private_whatever_the_umask(tmp_path):
    with umask(0o000):  # the widest umask: nothing may rely on it
        folder = private_dir("cookbook-test-")
        try:
            secret = write_private(folder / "token", "s3cret")
            assert mode(folder) == 0o700 and mode(secret) == 0o600
            assert is_private(folder) and is_private(secret) and secret.read_text() == "s3cret"
            with pytest.raises(FileExistsError):  # never over an existing file (or a planted link)
                write_private(secret, "other")
        finally:
            secret.unlink(missing_ok=True)
            folder.rmdir()
    with umask(0o022):
        assert mode(write_private(tmp_path / "t", "x")) == 0o600


def test_the_rehearsal_check_follows_the_umask(tmp_path, monkeypatch):
    import importlib

    rehearse = importlib.import_module("cookbook.rehearsal.rehearse")  # the module (the package exports a function)

    class FakeSlurm:  # sbatch answers a job id; nothing is submitted
        def __init__(self, env=None, timeout=60):
            self.env, self.timeout = dict(env or {}), timeout

        def submit(self, *args, **kwargs):
            return "1"

    monkeypatch.setattr(rehearse, "SlurmClient", FakeSlurm)
    with umask(0o077):
        r = rehearse.start_rehearsal(_script(tmp_path), folder=tmp_path / "rehearsal")
    assert mode(r.folder / "node-check") == 0o700


def test_the_lab_token_file_is_0600_in_a_0700_folder_and_gone_after_start(tmp_path, monkeypatch):
    """``start_lab`` without Jupyter: the fake server records its config file as the real one would read it."""
    import cookbook.lab as lab

    seen = {}

    class FakeServer:
        pid, returncode = 4242, None

        def __init__(self, cmd, **kwargs):
            config = Path(next(a for a in cmd if a.startswith("--config=")).split("=", 1)[1])
            seen.update(
                cmd=cmd,
                env=kwargs["env"],
                mode=mode(config),
                folder_mode=mode(config.parent),
                config=config,
                token=json.loads(config.read_text())["IdentityProvider"]["token"],
            )

        def poll(self):
            return self.returncode

        def terminate(self):
            self.returncode = 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(lab.subprocess, "Popen", FakeServer)
    monkeypatch.setattr(lab.LabServer, "wait_ready", lambda self, timeout=90: None)
    token = "tok" + "e" * 40
    with umask(0o022):
        server = lab.start_lab(root=tmp_path, token=token, log=tmp_path / "lab.log", unix_socket=True)
    try:
        assert seen["mode"] == 0o600 and seen["folder_mode"] == 0o700 and seen["token"] == token
        assert not any(token in a for a in seen["cmd"]) and not any(token in v for v in seen["env"].values())
        assert not seen["config"].exists()  # read by the server, then deleted
        assert server.sock == server.private / "lab.sock" and is_private(server.private)
    finally:
        server.stop()
    assert not server.private.exists()


def test_generated_recipes_follow_the_umask(tmp_path, monkeypatch):
    import cookbook.render as render

    monkeypatch.setattr(render, "generated_files", lambda: {"r/job.sbatch": "#!/bin/bash\n", "r/c.yaml": "a: 1\n"})
    with umask(0o077):
        render.generate_recipes(tmp_path)
    assert mode(tmp_path / "r" / "job.sbatch") == 0o700 and mode(tmp_path / "r" / "c.yaml") == 0o600
