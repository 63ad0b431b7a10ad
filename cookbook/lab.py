"""``python -m cookbook.lab`` (``make lab``): JupyterLab on the login node, reached through an SSH tunnel.

JupyterLab listens on 127.0.0.1 only; the command printed for your laptop forwards a local port to it
(``ssh -N -L PORT:localhost:PORT you@login-node``), and the URL carries Jupyter's own one-time token
(random per start, printed once, nothing else secret is ever printed). The notebooks' kernels inherit
this environment: ``SLURM_CONF`` of the embedded local cluster when it is up and none is set, and no
``MPLBACKEND`` (which would keep plots out of the notebooks).
"""

from __future__ import annotations

import argparse
import getpass
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cookbook.paths import output_dir, project_root


def free_port(host: str = "127.0.0.1", start: int = 8888) -> int:
    """The first free TCP port from ``start`` (Jupyter's usual 8888 when it is free)."""
    for port in range(start, start + 200):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tunnel_command(port: int, login_node: str | None = None, user: str | None = None) -> str:
    """What to run on the laptop to reach ``port`` on this machine."""
    host = login_node or socket.getfqdn() or "LOGIN_NODE"
    user = user or getpass.getuser()
    return f"ssh -N -L {port}:localhost:{port} {user}@{host}"


def lab_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's (and so the kernels') environment."""
    env = dict(os.environ if base is None else base)
    env.pop("MPLBACKEND", None)
    if "SLURM_CONF" not in env:
        try:
            from cookbook.local.cluster import LocalCluster

            cluster = LocalCluster()
            if cluster.status().up:
                env.update(cluster.env())
        except Exception:  # noqa: BLE001 - no local cluster here: a real login node
            pass
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


@dataclass
class LabServer:
    """A running JupyterLab."""

    process: subprocess.Popen
    port: int
    token: str
    root: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lab_url(self, path: str = "") -> str:
        return f"http://localhost:{self.port}/lab{'/tree/' + path if path else ''}?token={self.token}"

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2)
                return
            except Exception:  # noqa: BLE001 - not up yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; its log:\n{self.log.read_text()[-3000:]}")
                time.sleep(0.3)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def start_lab(root: str | os.PathLike | None = None, port: int | None = None, token: str | None = None,
              log: str | os.PathLike | None = None, env: dict[str, str] | None = None,
              ip: str = "127.0.0.1") -> LabServer:
    """Start JupyterLab serving ``root`` (default: the notebooks folder) and wait until it answers."""
    root = Path(root) if root is not None else project_root() / "notebooks"
    port = port or free_port(ip)
    token = token or secrets.token_hex(24)
    env = lab_environment(env)
    env.setdefault("JUPYTER_RUNTIME_DIR", str(output_dir() / "lab" / "runtime"))   # out/ is git-ignored
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", f"--ip={ip}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = Path(log) if log is not None else output_dir() / "lab" / "jupyterlab.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(root))
    server = LabServer(proc, port, token, Path(root), log_path)
    server.wait_ready()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cookbook.lab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=None, help="port on this machine (default: first free from 8888)")
    ap.add_argument("--root", default=None, help="folder JupyterLab serves (default: notebooks/)")
    ap.add_argument("--login-node", default=None, help="name of this login node as your laptop reaches it")
    ap.add_argument("--user", default=None, help="your user name on the login node")
    args = ap.parse_args(argv)
    if shutil.which("jupyter", path=lab_environment().get("PATH")) is None:
        print("jupyterlab is not installed: make setup", file=sys.stderr)
        return 1
    server = start_lab(args.root, args.port)
    print(f"JupyterLab is running on this machine, port {server.port} (log: {server.log}).\n"
          f"1. On your laptop, open the tunnel (leave it running):\n"
          f"     {tunnel_command(server.port, args.login_node, args.user)}\n"
          f"2. Open in your browser (the token is this server's one-time password; do not share it):\n"
          f"     {server.lab_url('00_setup.ipynb')}\n"
          f"Stop with Ctrl-C.", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        print("\nstopping JupyterLab")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
