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
