"""Look at traces: TensorBoard on a free port (+ the ``ssh -N -L`` line), Perfetto, our own plots.

The PyTorch profiler TensorBoard plugin (torch-tb-profiler) is not used: its page loads its charts
from the internet, which compute nodes and many login nodes cannot reach, and it chokes on large
traces. https://ui.perfetto.dev opens a ``.pt.trace.json.gz`` in the laptop's browser (the file never
leaves the laptop), and :func:`cookbook.profiling.summarize.plot_summary` draws the numbers that
matter. TensorBoard still serves the run's scalars (loss, throughput) next to it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PERFETTO_URL = "https://ui.perfetto.dev"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class TensorBoardHandle:
    """A running TensorBoard; :meth:`stop` ends it (also on leaving a ``with`` block)."""

    process: subprocess.Popen
    port: int
    host: str
    logdir: Path

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/"

    def stop(self, timeout: float = 10) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "TensorBoardHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_tensorboard(logdir: str | Path, *, port: int | None = None, host: str = "127.0.0.1",
                      timeout: float = 60) -> TensorBoardHandle:
    """Start TensorBoard on ``logdir`` and wait until it answers HTTP. ``host`` 127.0.0.1 keeps it
    private to the machine (reach it through the ssh tunnel)."""
    logdir = Path(logdir)
    if not logdir.is_dir():
        raise FileNotFoundError(f"no such folder: {logdir}")
    port = port or free_port(host)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port), "--host", host],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    handle = TensorBoardHandle(proc, port, host, logdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"TensorBoard exited with code {proc.returncode}:\n{err[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/", timeout=2) as r:
                if r.status == 200:
                    return handle
        except OSError:
            time.sleep(0.3)
    handle.stop()
    raise TimeoutError(f"TensorBoard did not answer on port {port} within {timeout:.0f} s")


def ssh_tunnel_command(port: int, *, login_node: str = "LOGIN_NODE", user: str | None = None,
                       node: str | None = None) -> str:
    """The command to run on the laptop. ``node``: the machine TensorBoard runs on, when it is not
    the login node (the tunnel then goes through the login node to it)."""
    target = f"{user}@{login_node}" if user else login_node
    return f"ssh -N -L {port}:{node or 'localhost'}:{port} {target}"


def viewing_instructions(view_dir: str | Path, *, port: int | None = None, login_node: str = "LOGIN_NODE",
                         user: str | None = None) -> str:
    """What to tell the user: tunnel + TensorBoard URL, fetching traces, Perfetto, our plots."""
    view_dir = Path(view_dir).resolve()
    target = f"{user}@{login_node}" if user else login_node
    lines = []
    if port:
        lines += [f"TensorBoard: on your laptop run\n    {ssh_tunnel_command(port, login_node=login_node, user=user)}\n"
                  f"  then open http://localhost:{port}/"]
    traces = sorted(p.name for p in view_dir.glob("*.pt.trace.json*"))
    lines += [f"Traces ({len(traces)}): copy them to your laptop\n    scp -r {target}:{view_dir} .",
              f"  and open one in {PERFETTO_URL} (Open trace file; .json.gz is fine; it stays in your browser).",
              f"Summary and plot: cookbook profile summary {view_dir} --plot {view_dir / 'summary.png'}"]
    return "\n".join(lines)
