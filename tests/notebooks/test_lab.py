"""`python -m cookbook.lab` (make lab): JupyterLab on this machine, the ssh -L line and the tokened URL.

Both modes as a user starts them: the default (a Unix socket in a 0700 folder, forwarded with
``ssh -N -L 8888:/path/lab.sock``) and the TCP fallback (``--port``); in both the token is on no
command line of the server or its children, and the server refuses requests without it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from cookbook import sockethttp
from cookbook.sockethttp import free_port


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the CLI and read its output up to the line after the tokened URL."""
    env = dict(
        os.environ, COOKBOOK_OUT=str(tmp_path / "out"), HF_TOKEN="hf_secretvalue_never_printed", PYTHONUNBUFFERED="1"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cookbook.lab",
            "--root",
            str(tmp_path),
            "--login-node",
            "login1",
            "--user",
            "alice",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while not any("token=" in ln for ln in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
    lines.append(proc.stdout.readline())
    out = "".join(lines)
    assert "hf_secretvalue" not in out
    return proc, out


def _tree_argv(pid: int) -> list[bytes]:
    """The command lines of ``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes())
            todo += [int(k) for k in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
    return out


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_lab_on_a_private_socket_by_default(tmp_path):
    proc, out = _start([], tmp_path)
    try:
        m = re.search(r"ssh -N -L 8888:(/\S+/lab\.sock) alice@login1", out)
        assert m, out
        sock = Path(m.group(1))
        token = re.search(r"http://localhost:8888/lab/tree/00_setup\.ipynb\?token=([0-9a-f]+)", out).group(1)
        assert len(token) >= 32
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700 and stat.S_ISSOCK(sock.stat().st_mode)
        assert sockethttp.get(f"/api/status?token={token}", sock=sock)[0] == 200
        assert sockethttp.get("/api/contents", sock=sock)[0] == 403  # the token is still required
        argv = _tree_argv(proc.pid)
        assert len(argv) >= 2 and not any(token.encode() in a for a in argv)  # the CLI and JupyterLab
        assert not list(sock.parent.glob("*config*.json")), "the token's config file outlived the start"
    finally:
        _stop(proc)
    assert proc.returncode == 0
    assert not sock.parent.exists(), "the private folder (socket, runtime files with the token) was left behind"


def test_lab_tcp_fallback_prints_tunnel_and_tokened_url(tmp_path):
    port = free_port(start=18888)
    proc, out = _start(["--port", str(port)], tmp_path)
    try:
        assert f"ssh -N -L {port}:localhost:{port} alice@login1" in out
        token = re.search(r"token=([0-9a-f]+)", out).group(1)
        assert len(token) >= 32
        assert sockethttp.get(f"/api/status?token={token}", port=port)[0] == 200
        assert sockethttp.get("/api/contents", port=port)[0] == 403
        assert not any(token.encode() in a for a in _tree_argv(proc.pid))
    finally:
        _stop(proc)
    assert proc.returncode == 0


def test_lab_kernels_start_whatever_the_callers_runtime_folder(tmp_path):
    """The kernels' ipc sockets go in the lab's short private folder: a long JUPYTER_RUNTIME_DIR (a pytest
    worker's, a scratch folder's) would push them past the 107 characters of a socket address (HTTP 500)."""
    from cookbook.lab import start_lab

    long_runtime = tmp_path / ("r" * 70)
    server = start_lab(
        tmp_path,
        unix_socket=True,
        log=tmp_path / "lab.log",
        env=dict(os.environ, JUPYTER_RUNTIME_DIR=str(long_runtime)),
    )
    try:
        status, body = sockethttp.request(
            "POST",
            "/api/kernels",
            sock=server.sock,
            body=b"{}",
            timeout=60,
            headers={"Authorization": f"token {server.token}"},
        )
        assert status == 201, f"{body!r}\n{server.log.read_text()[-3000:]}"
        assert (server.private / "runtime" / f"kernel-{json.loads(body)['id']}.json").exists()
    finally:
        server.stop()
