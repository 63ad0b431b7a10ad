"""Look at traces: TensorBoard only you can open (+ the ``ssh -N -L`` line), Perfetto, our own plots.

On a login node every user can connect to every ``127.0.0.1`` port, and TensorBoard has no
authentication, so by default it is served on a Unix socket in a fresh 0700 folder (``tb.sock``, mode
0600): TensorBoard's own WSGI app in a werkzeug server bound to the socket (werkzeug binds ``unix://``
addresses itself; TensorBoard's CLI cannot), started by ``python -m cookbook.profiling.view``, with
TensorBoard's Rust data server off (it would listen on a TCP port). The laptop reaches it with
``ssh -N -L 6006:/path/to/tb.sock you@login-node``. A TCP port (open to every user of the machine) only
with ``open_to_all_users=True`` (``cookbook profile view --open-to-all-users``).

The PyTorch profiler TensorBoard plugin (torch-tb-profiler) is not used: its page loads its charts
from the internet, which compute nodes and many login nodes cannot reach, and it chokes on large
traces. https://ui.perfetto.dev opens a ``.pt.trace.json.gz`` in the laptop's browser (the file never
leaves the laptop), and :func:`cookbook.profiling.summarize.plot_summary` draws the numbers that
matter. TensorBoard still serves the run's scalars (loss, throughput) next to it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cookbook import sockethttp
from cookbook.secure_files import private_dir
from cookbook.sockethttp import free_port, socket_tunnel_command, ssh_tunnel_command, stop_server

PERFETTO_URL = "https://ui.perfetto.dev"
OPEN_TO_ALL_USERS = (
    "TensorBoard on a TCP port has no authentication: every user of this machine can read your runs through it"
)


@dataclass
class TensorBoardHandle:
    """A running TensorBoard on the Unix socket ``sock`` (or, when opened to all, ``host:port``);
    :meth:`stop` ends it (also on leaving a ``with`` block) and removes its private folder."""

    process: subprocess.Popen
    port: int | None
    host: str
    logdir: Path
    sock: Path | None = None
    private: Path | None = None

    def get(self, path: str = "/", timeout: float = 5) -> tuple[int, bytes]:
        """``GET path`` on the server: (status, body)."""
        return sockethttp.get(path, sock=self.sock, port=self.port, host=self.host, timeout=timeout)

    def stop(self, timeout: float = 10) -> None:
        stop_server(self.process, self.private, timeout)

    def __enter__(self) -> TensorBoardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_tensorboard(
    logdir: str | Path,
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    open_to_all_users: bool = False,
    timeout: float = 60,
) -> TensorBoardHandle:
    """Start TensorBoard on ``logdir`` and wait until it answers HTTP.

    Default: on a Unix socket in a new 0700 folder (only you can open it). ``open_to_all_users``: on
    ``host:port`` instead, which every user of the machine can reach (``port`` without it is refused).
    """
    logdir = Path(logdir)
    if not logdir.is_dir():
        raise FileNotFoundError(f"no such folder: {logdir}")
    if port is not None and not open_to_all_users:
        raise PermissionError(
            f"{OPEN_TO_ALL_USERS}; serve it on a private Unix socket (no port) or say "
            f"open_to_all_users=True (--open-to-all-users)"
        )
    private = sock = None
    if open_to_all_users:
        port = port or free_port(host)
        cmd = [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir),
            "--port",
            str(port),
            "--host",
            host,
            "--load_fast=false",
        ]
    else:
        private = private_dir("cookbook-tb-")
        sock = private / "tb.sock"
        cmd = [sys.executable, "-m", "cookbook.profiling.view", "--logdir", str(logdir), "--sock", str(sock)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    handle = TensorBoardHandle(proc, port, host, logdir, sock, private)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            handle.stop()
            raise RuntimeError(f"TensorBoard exited with code {proc.returncode}:\n{err[-2000:]}")
        try:
            if handle.get("/", timeout=2)[0] == 200:
                return handle
        except OSError:
            time.sleep(0.3)
    handle.stop()
    raise TimeoutError(f"TensorBoard did not answer on {sock or port} within {timeout:.0f} s")


def serve_on_socket(logdir: str | Path, sock: str | Path) -> None:
    """Serve TensorBoard's own app for ``logdir`` on the Unix socket ``sock`` until SIGTERM/SIGINT
    (what ``python -m cookbook.profiling.view`` runs in the child process)."""
    os.umask(0o077)  # the socket itself 0600 too, not only its folder
    from tensorboard import program
    from werkzeug import serving

    class UnixSocketServer(serving.ThreadedWSGIServer, program.TensorBoardServer):
        daemon_threads = True

        def __init__(self, wsgi_app, flags):  # noqa: ARG002 - TensorBoardServer's signature
            super().__init__(f"unix://{sock}", 0, wsgi_app)

        def get_url(self) -> str:
            return f"unix://{sock}"

    tb = program.TensorBoard(server_class=UnixSocketServer)
    tb.configure(logdir=str(logdir), load_fast="false")  # no Rust data server (a TCP port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    tb.launch()
    stop.wait()
    Path(sock).unlink(missing_ok=True)


def viewing_instructions(
    view_dir: str | Path,
    *,
    port: int | None = None,
    login_node: str = "LOGIN_NODE",
    user: str | None = None,
    sock: str | Path | None = None,
    local_port: int = 6006,
) -> str:
    """What to tell the user: tunnel + TensorBoard URL (``sock``: its private Unix socket; ``port``: a
    TCP port open to every user), fetching traces, Perfetto, our plots."""
    view_dir = Path(view_dir).resolve()
    target = f"{user}@{login_node}" if user else login_node
    lines = []
    if sock:
        lines += [
            f"TensorBoard (only you can open its socket): on your laptop run\n"
            f"    {socket_tunnel_command(sock, local_port=local_port, login_node=login_node, user=user)}\n"
            f"  then open http://localhost:{local_port}/"
        ]
    elif port:
        lines += [
            f"TensorBoard (port {port} is open to every user of this machine): on your laptop run\n"
            f"    {ssh_tunnel_command(port, login_node=login_node, user=user)}\n"
            f"  then open http://localhost:{port}/"
        ]
    traces = sorted(p.name for p in view_dir.glob("*.pt.trace.json*"))
    lines += [
        f"Traces ({len(traces)}): copy them to your laptop\n    scp -r {target}:{view_dir} .",
        f"  and open one in {PERFETTO_URL} (Open trace file; .json.gz is fine; it stays in your browser).",
        f"Summary and plot: cookbook profile summary {view_dir} --plot {view_dir / 'summary.png'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cookbook.profiling.view",
        description="TensorBoard on a Unix socket (started by start_tensorboard)",
    )
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--sock", required=True)
    args = ap.parse_args(argv)
    serve_on_socket(args.logdir, args.sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
