"""HTTP GET to a server on this machine, over TCP or a Unix socket (the private servers' transport), a free
port, stopping a server, and the ``ssh -N -L`` line that reaches either from a laptop (JupyterLab and
TensorBoard share them)."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a Unix socket (``Host: localhost``)."""

    def __init__(self, path: str | os.PathLike, timeout: float = 5):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:  # a failed connect leaves the socket to close()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def request(
    method: str,
    path: str,
    *,
    sock: str | os.PathLike | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 5,
) -> tuple[int, bytes]:
    """``METHOD path`` on the Unix socket ``sock`` or on ``host:port``; returns (status, body).
    Raises OSError when nothing answers (or the socket may not be opened)."""
    conn: http.client.HTTPConnection = (
        UnixHTTPConnection(sock, timeout)
        if sock is not None
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get(
    path: str,
    *,
    sock: str | os.PathLike | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    timeout: float = 5,
) -> tuple[int, bytes]:
    """``GET path``: see :func:`request`."""
    return request("GET", path, sock=sock, port=port, host=host, timeout=timeout)


def free_port(host: str = "127.0.0.1", start: int | None = None) -> int:
    """A TCP port nobody listens on right now: the first free one from ``start`` (e.g. Jupyter's usual
    8888) when given, else one the OS picks."""
    for port in range(start, start + 200) if start is not None else ():
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_on_ctrl_c_or_term() -> None:
    """A foreground server command (``cookbook lab``, ``cookbook profile view``) ends with its cleanup on Ctrl-C or
    TERM (a closed session): both raise KeyboardInterrupt, also when the shell that started it ignores SIGINT
    (``make lab &``, nohup, CI runners), where the server would otherwise outlive it with its private folder."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def stop_server(process: subprocess.Popen, private: Path | None, timeout: float = 10) -> None:
    """Terminate ``process`` (kill it after ``timeout`` seconds) and remove its ``private`` folder."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)


def _ssh_target(login_node: str, user: str | None) -> str:
    return f"{user}@{login_node}" if user else login_node


def ssh_tunnel_command(
    port: int, *, login_node: str = "LOGIN_NODE", user: str | None = None, node: str | None = None
) -> str:
    """What to run on the laptop to reach TCP ``port`` at ``localhost:port``. ``node``: the machine the
    server runs on, when it is not the login node (the tunnel then goes through the login node to it)."""
    return f"ssh -N -L {port}:{node or 'localhost'}:{port} {_ssh_target(login_node, user)}"


def socket_tunnel_command(
    sock: str | os.PathLike[str], *, local_port: int, login_node: str = "LOGIN_NODE", user: str | None = None
) -> str:
    """What to run on the laptop to reach the Unix socket ``sock`` on the login node at ``localhost:local_port``."""
    return f"ssh -N -L {local_port}:{os.fspath(sock)} {_ssh_target(login_node, user)}"
