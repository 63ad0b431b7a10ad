"""HTTP GET to a server on this machine, over TCP or a Unix socket (the private servers' transport)."""

from __future__ import annotations

import http.client
import os
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a Unix socket (``Host: localhost``)."""

    def __init__(self, path: str | os.PathLike, timeout: float = 5):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


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
    conn: http.client.HTTPConnection
    conn = (
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
