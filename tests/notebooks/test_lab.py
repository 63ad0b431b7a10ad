"""`python -m cookbook.lab` (make lab): JupyterLab on this machine, the ssh -L line and the tokened URL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from cookbook.lab import free_port


def test_lab_prints_tunnel_and_tokened_url(tmp_path):
    port = free_port(start=18888)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), HF_TOKEN="hf_secretvalue_never_printed")
    proc = subprocess.Popen([sys.executable, "-m", "cookbook.lab", "--port", str(port), "--root", str(tmp_path),
                             "--login-node", "login1", "--user", "alice"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not any("token=" in ln for ln in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        lines.append(proc.stdout.readline())
        out = "".join(lines)
        assert f"ssh -N -L {port}:localhost:{port} alice@login1" in out
        token = re.search(r"token=([0-9a-f]+)", out).group(1)
        assert len(token) >= 32
        assert "hf_secretvalue" not in out
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5).status == 200
        try:                                      # the token is required
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5)
            raise AssertionError("JupyterLab answered without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 403
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
