"""``python -m cookbook.lab`` (``make lab``): JupyterLab on the login node, reachable only by you.

On a login node every user can read every process's command line and connect to every ``127.0.0.1``
port, so the server's token is never on a command line: it goes to JupyterLab in a 0600 config file
inside a 0700 folder (removed again once the server has read it). By default JupyterLab listens on a
Unix socket in that folder, which no other user can open; your laptop reaches it with
``ssh -N -L 8888:/path/to/lab.sock you@login-node`` (OpenSSH forwards a local port to a remote socket).
``--tcp`` (or ``--port``) is the fallback for sites whose sshd forbids socket forwarding: JupyterLab then
listens on ``127.0.0.1:PORT`` and the token, still off every command line, is what keeps others out.
Kernels talk to the server over Unix sockets in the same private folder (``KernelManager.transport=ipc``):
the server's ``JUPYTER_RUNTIME_DIR`` is always that folder, whatever the caller's says (a long one would
push the kernels' socket paths past the 107 characters a Unix socket address holds).

The URL printed carries the token (random per start, printed once, nothing else secret is ever
printed). The notebooks' kernels inherit this environment: ``SLURM_CONF`` of the embedded local cluster
when it is up and none is set, and no ``MPLBACKEND`` (which would keep plots out of the notebooks).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cookbook import sockethttp
from cookbook.paths import output_dir, project_root
from cookbook.secure_files import SOCKET_PATH_MAX, private_dir, write_private
from cookbook.sockethttp import (
    free_port,
    socket_tunnel_command,
    ssh_tunnel_command,
    stop_on_ctrl_c_or_term,
    stop_server,
)

# what Jupyter appends to its runtime folder for a kernel's ipc socket: /kernel-<uuid>-ipc-<n>
_KERNEL_SOCKET_NAME = len("/kernel-00000000-0000-0000-0000-000000000000-ipc-99")


def lab_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's (and so the kernels') environment."""
    env = dict(os.environ if base is None else base)
    env.pop("MPLBACKEND", None)
    if "SLURM_CONF" not in env:
        with contextlib.suppress(Exception):  # no local cluster here: a real login node
            from cookbook.local.cluster import LocalCluster

            cluster = LocalCluster()
            if cluster.status().up:
                env.update(cluster.env())
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


@dataclass
class LabServer:
    """A running JupyterLab: on the Unix socket ``sock`` or on ``127.0.0.1:port`` (``port`` 0 until the
    server has said which port the OS gave it)."""

    process: subprocess.Popen
    port: int | None
    token: str
    root: Path
    log: Path
    sock: Path | None = None
    private: Path | None = None

    def lab_url(self, path: str = "", local_port: int = 8888) -> str:
        """The URL to open in the browser (through the tunnel: ``local_port`` on the laptop in socket mode)."""
        port = self.port if self.port is not None else local_port
        return f"http://localhost:{port}/lab{'/tree/' + path if path else ''}?token={self.token}"

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        """``GET path`` on the server (no token added): (status, body)."""
        return sockethttp.get(path, sock=self.sock, port=self.port, timeout=timeout)

    def server_info(self) -> dict | None:
        """Jupyter's own record of this server (``jpserver-PID.json`` in the private runtime folder:
        its real port, its URL), or None before the server has written it."""
        if self.private is None:
            return None
        try:
            return json.loads((self.private / "runtime" / f"jpserver-{self.process.pid}.json").read_text())
        except (OSError, ValueError):
            return None

    def wait_ready(self, timeout: float = 90) -> None:
        """Until ``/api/status`` answers 200 with the token (the server has loaded its extensions by then)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.port == 0 and (info := self.server_info()) is not None:
                self.port = int(info["port"])  # the port the OS picked (no race with other servers)
            with contextlib.suppress(OSError):
                if self.port != 0 and self.get(f"/api/status?token={self.token}", timeout=2)[0] == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start; its log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        stop_server(self.process, self.private, timeout=15)


def start_lab(
    root: str | os.PathLike | None = None,
    port: int | None = None,
    token: str | None = None,
    log: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    ip: str = "127.0.0.1",
    unix_socket: bool = False,
) -> LabServer:
    """Start JupyterLab serving ``root`` (default: the notebooks folder) and wait until it answers.

    ``unix_socket``: listen on ``lab.sock`` in a new 0700 folder instead of ``ip:port``. Either way the
    token reaches the server through a 0600 config file in that folder, never through its command line,
    and the kernels' sockets and Jupyter's runtime files (``jpserver-*.json`` holds the token) live there.
    ``port`` None: one the OS picks (read back from the server, so two servers starting at once never
    pick the same one).
    """
    root = Path(root) if root is not None else project_root() / "notebooks"
    token = token or secrets.token_hex(24)
    private = private_dir("cookbook-lab-")
    runtime = private / "runtime"
    if len(str(runtime)) + _KERNEL_SOCKET_NAME > SOCKET_PATH_MAX:
        shutil.rmtree(private, ignore_errors=True)
        raise RuntimeError(
            f"{runtime} is too long a folder for the kernels' Unix sockets "
            f"({SOCKET_PATH_MAX} characters at most): set TMPDIR to a short folder such as /tmp"
        )
    env = lab_environment(env)
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)  # always ours: the kernels' ipc sockets go there
    server_app: dict[str, object] = {"root_dir": str(root), "open_browser": False}
    if unix_socket:
        sock: Path | None = private / "lab.sock"
        server_app.update(sock=str(sock), sock_mode="0600")
        port = None
    else:
        sock = None
        port = port or 0
        server_app.update(ip=ip, port=port, port_retries=0)
    config = {"IdentityProvider": {"token": token}, "ServerApp": server_app, "KernelManager": {"transport": "ipc"}}
    config_file = write_private(private / "jupyter_server_config.json", json.dumps(config))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--config={config_file}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = Path(log) if log is not None else output_dir() / "lab" / "jupyterlab.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(root))
    server = LabServer(proc, port, token, Path(root), log_path, sock=sock, private=private)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    config_file.unlink()  # the server has read it; the token now lives only in its memory
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cookbook.lab", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tcp",
        action="store_true",
        help="listen on a TCP port of 127.0.0.1 instead of a private Unix socket (for sites whose "
        "sshd forbids forwarding to sockets; the token still keeps other users out)",
    )
    ap.add_argument("--port", type=int, default=None, help="TCP port on this machine (implies --tcp)")
    ap.add_argument("--local-port", type=int, default=8888, help="port on your laptop in the ssh line (socket mode)")
    ap.add_argument("--root", default=None, help="folder JupyterLab serves (default: notebooks/)")
    ap.add_argument("--login-node", default=None, help="name of this login node as your laptop reaches it")
    ap.add_argument("--user", default=None, help="your user name on the login node")
    args = ap.parse_args(argv)
    stop_on_ctrl_c_or_term()
    if shutil.which("jupyter", path=lab_environment().get("PATH")) is None:
        print("jupyterlab is not installed: make setup", file=sys.stderr)
        return 1
    tcp = args.tcp or args.port is not None
    port = args.port if args.port is not None else (free_port(start=8888) if tcp else None)  # 8888 when free
    server = start_lab(args.root, port, unix_socket=not tcp)
    login_node = args.login_node or socket.getfqdn() or "LOGIN_NODE"
    user = args.user or getpass.getuser()
    if server.port is not None:
        where = f"port {server.port} of 127.0.0.1 (every user here can reach the port; the token keeps them out)"
        tunnel = ssh_tunnel_command(server.port, login_node=login_node, user=user)
    else:
        assert server.sock is not None
        where = f"the Unix socket {server.sock} (only you can open it)"
        tunnel = socket_tunnel_command(server.sock, local_port=args.local_port, login_node=login_node, user=user)
    print(
        f"JupyterLab is running on this machine, on {where} (log: {server.log}).\n"
        f"1. On your laptop, open the tunnel (leave it running):\n"
        f"     {tunnel}\n"
        f"2. Open in your browser (the token is this server's one-time password; do not share it):\n"
        f"     {server.lab_url('00_setup.ipynb', args.local_port)}\n"
        f"Stop with Ctrl-C.",
        flush=True,
    )
    try:
        server.process.wait()
    except KeyboardInterrupt:
        print("\nstopping JupyterLab")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
