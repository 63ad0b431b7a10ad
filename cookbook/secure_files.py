"""File modes on a shared machine: ordinary outputs follow the user's umask; secrets stay private.

Run folders, rendered scripts, logs, checkpoints, executed notebooks and caches are created with the
user's umask (nothing here widens them: :func:`make_executable` adds execute bits only where the umask
lets read bits through). Anything holding a secret or a server credential (a Jupyter token, a server's
Unix socket) goes in a folder from :func:`private_dir` (0700) as a file from :func:`write_private` (0600).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def current_umask() -> int:
    """This process's umask (read from /proc where it can be, so no other thread sees it change)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def make_executable(path: str | os.PathLike) -> Path:
    """``chmod +x`` as the shell does it: execute bits for whoever the umask lets read the file."""
    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    path.chmod(mode | ((mode & 0o444) >> 2 & ~current_umask() & 0o111))
    return path


# A Unix socket's address (sockaddr_un.sun_path) holds 107 characters and a terminating NUL.
SOCKET_PATH_MAX = 107
# Private folders hold sockets named up to ~50 characters deep (a kernel's ipc socket), so their base
# must stay short: a long TMPDIR (a scratch folder of a cluster) falls back to /tmp.
_BASE_MAX = 40


def _private_base() -> Path:
    """A short folder for private folders: ``$XDG_RUNTIME_DIR`` when it is ours and 0700, else the
    temporary folder, else ``/tmp`` (whichever first is short enough for the sockets inside)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    with contextlib.suppress(OSError):
        if runtime and len(runtime) <= _BASE_MAX and is_private(runtime):
            return Path(runtime)
    tmp = tempfile.gettempdir()
    return Path(tmp if len(tmp) <= _BASE_MAX else "/tmp")


def private_dir(prefix: str) -> Path:
    """A new folder only this user can enter (0700, whatever the umask), for credentials and sockets."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=_private_base()))
    path.chmod(0o700)
    return path


def write_private(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a new file only this user can read (0600 from its creation on, never wider)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)
    return path


def is_private(path: str | os.PathLike) -> bool:
    """Whether ``path`` is ours and closed to group and others (a file 0600 or a folder 0700 or tighter)."""
    st = os.stat(path)
    return st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
