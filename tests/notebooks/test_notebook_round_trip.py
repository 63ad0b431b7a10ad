"""Editing a notebook in JupyterLab and saving it keeps the suite green: a real Jupyter server (the venv's
jupyter_server, on a unix socket: no port to race for) loads a copy of notebooks/ through the contents
API, a cell is edited and saved as JupyterLab saves it (PUT /api/contents/PATH with the notebook as
JSON), and the structure checks run on the file the server wrote."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from notebook_structure import problems

from cookbook.notebook_runner import notebook_dir

NOTEBOOK = "03_llama3_3_70b_lora.ipynb"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


@dataclass
class Contents:
    """The contents API of a Jupyter server on a unix socket; paths are relative to ``folder``."""

    sock: str
    token: str
    folder: str = ""

    def request(self, method: str, path: str, body: Any = None, query: str = "") -> tuple[int, Any]:
        conn = _UnixConnection(self.sock)
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
        try:
            conn.request(
                method,
                f"/api/contents/{quote(f'{self.folder}/{path}'.strip('/'))}{query}",
                body=None if body is None else json.dumps(body),
                headers=headers,
            )
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def load(self, path: str) -> dict:
        status, model = self.request("GET", path, query="?type=notebook&content=1")
        assert status == 200, model
        return model["content"]

    def save(self, path: str, notebook: dict) -> None:
        """What JupyterLab's document context sends on Ctrl+S."""
        status, model = self.request("PUT", path, {"type": "notebook", "format": "json", "content": notebook})
        assert status == 200, model


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[Contents, Path]]:
    """A Jupyter server over a temporary folder; yields its contents API and the folder."""
    tmp_path = tmp_path_factory.mktemp("jupyter")
    root = tmp_path / "root"
    root.mkdir()
    sockdir = Path(tempfile.mkdtemp(prefix="nb-", dir="/tmp"))  # a unix socket path is short
    sock, token = str(sockdir / "jupyter.sock"), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    cmd = [
        sys.executable,
        "-m",
        "jupyter_server",
        f"--ServerApp.sock={sock}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    api = Contents(sock, token)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if api.request("GET", "")[0] == 200:
                    break
            except OSError:  # not listening yet
                pass
            assert time.monotonic() < deadline, "the Jupyter server did not answer in 120 s"
            time.sleep(0.2)
        yield api, root
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.fixture
def jupyter(server, request) -> tuple[Contents, Path]:
    """The server, seen from this test's own copy of notebooks/ (a folder of its root), and that copy."""
    api, root = server
    folder = root / re.sub(r"\W+", "-", request.node.name).strip("-")
    shutil.copytree(notebook_dir(), folder)
    return replace(api, folder=folder.name), folder


def _cell(nb: dict, source: str) -> dict:
    return next(c for c in nb["cells"] if c["cell_type"] == "code" and c["source"] == source)


def test_saving_unchanged_rewrites_the_same_bytes(jupyter):
    """The committed file is what JupyterLab writes, so a save without edits leaves no diff."""
    api, root = jupyter
    before = (root / NOTEBOOK).read_bytes()
    api.save(NOTEBOOK, api.load(NOTEBOOK))
    assert (root / NOTEBOOK).read_bytes() == before


def test_a_cell_edited_and_saved_in_jupyterlab_passes_the_checks(jupyter):
    api, root = jupyter
    nb = api.load(NOTEBOOK)
    edited = "# checked again after changing the batch size\nwt.check_job(spec)"
    _cell(nb, "wt.check_job(spec)")["source"] = edited
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    params["source"] = params["source"].replace('time_limit = "04:00:00"', 'time_limit = "04:00:00"  # 4 h')
    api.save(NOTEBOOK, nb)
    text = (root / NOTEBOOK).read_text()
    assert "# checked again after changing the batch size" in text and "# 4 h" in text
    assert problems(root / NOTEBOOK) == []


@pytest.mark.parametrize(
    "edit, message",
    [
        ("output", "has outputs: clear them"),
        ("default", "nodes = 4, but cookbook.notebook_runner.default_parameters says 2"),
        ("loop", "has For: logic a reader would copy belongs in the package"),
        ("shared", "the shared `rehearse` cell (cookbook.notebook_runner.SHARED_CELLS) is missing"),
    ],
    ids=["output", "default", "loop", "shared"],
)
def test_an_edit_that_breaks_a_rule_is_caught(jupyter, edit, message):
    api, root = jupyter
    nb = api.load(NOTEBOOK)
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    if edit == "output":  # run a cell and save without clearing its output
        cell = _cell(nb, "wt.check_job(spec)")
        cell.update(execution_count=3, outputs=[{"output_type": "stream", "name": "stdout", "text": "ok\n"}])
    elif edit == "default":
        params["source"] = params["source"].replace("nodes = 2", "nodes = 4")
    elif edit == "loop":
        loop = 'for g in ("H100", "H200"):\n    print(wt.plan_for(spec, g))'
        _cell(nb, "print(wt.plan_for(spec, gpu))")["source"] = loop
    else:
        _cell(nb, "wt.rehearse_job(spec, run_root)")["source"] = "wt.rehearse_job(spec, run_root, nodes=1)"
    api.save(NOTEBOOK, nb)
    found = problems(root / NOTEBOOK)
    assert found and all(p.startswith(f"{NOTEBOOK}: ") for p in found), found
    assert any(message in p for p in found), found
