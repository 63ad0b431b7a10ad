"""Fixtures for running the walkthrough notebooks with papermill against the real local cluster.

Each pytest-xdist worker gets its own IPYTHONDIR and JUPYTER_RUNTIME_DIR (kernels of two workers
must not share connection files or IPython's history database); each test its own working folder.
Executed notebooks are kept under out/test-notebooks/ as artifacts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cookbook.paths import output_dir


@pytest.fixture(scope="session")
def kernel_dirs(tmp_path_factory, worker_id: str) -> dict[str, str]:
    """Per-worker IPython and Jupyter runtime folders, exported for the kernels papermill starts."""
    base = tmp_path_factory.getbasetemp() / f"kernel-{worker_id}"
    dirs = {"IPYTHONDIR": str(base / "ipython"), "JUPYTER_RUNTIME_DIR": str(base / "runtime")}
    for d in dirs.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    os.environ.update(dirs)
    os.environ.pop("MPLBACKEND", None)
    return dirs


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where executed notebooks are kept (git-ignored)."""
    path = output_dir() / "test-notebooks"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def known_hf_token(tmp_path_factory) -> str:
    """A recognisable HF_TOKEN in the environment of every kernel and, through its token file (Slurm is never
    given it), of every job's ranks (tests prove it never lands anywhere)."""
    import secrets

    token = f"hf_cookbookNEVERWRITTEN{secrets.token_hex(8)}"
    path = tmp_path_factory.mktemp("hf-token") / "token"  # outside every test's folder, which is searched for it
    path.write_text(token)
    os.environ.update(HF_TOKEN=token, HF_TOKEN_PATH=str(path))
    return token
