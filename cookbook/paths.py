"""Where the project's own folders are (state, outputs, caches)."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout the package runs from (``COOKBOOK_HOME`` overrides it)."""
    if env := os.environ.get("COOKBOOK_HOME"):
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Git-ignored folder for generated assets (tiny models, datasets)."""
    return Path(os.environ.get("COOKBOOK_CACHE", project_root() / ".cache"))


def output_dir() -> Path:
    """Git-ignored folder for runs, executed notebooks and plots."""
    return Path(os.environ.get("COOKBOOK_OUT", project_root() / "out"))


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file: readers never see half a file (a cache other
    processes read). A failure to write is ignored: a cache only saves time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass
