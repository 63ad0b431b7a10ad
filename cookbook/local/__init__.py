"""The local CPU bench: the embedded Slurm cluster (``cluster``), the CPU shims for torchtune/torchtitan
(``compat``), the tiny models and datasets (``assets``) and ``make demo`` (``demo``).

It depends on the engine; the engine never imports it (tests/unit/test_import_graph.py). A ``local-cpu``
job reaches the shims only through what its rendered script runs (``python -m cookbook.local.compat.cpu``).
"""

from __future__ import annotations

import importlib.util
import os

#: torchtitan imports triton (a GPU-only wheel this bench does not have): the stand-in that lets it import.
TRITON_STANDIN = "cookbook.local.compat.triton_standin:import_torchtitan_without_triton"


def preload_value() -> str:
    """What ``COOKBOOK_PRELOAD`` should hold here: the stand-in when triton is missing, else what it holds."""
    if os.environ.get("COOKBOOK_PRELOAD") or importlib.util.find_spec("triton") is not None:
        return os.environ.get("COOKBOOK_PRELOAD", "")
    return TRITON_STANDIN


def use_triton_standin_if_needed() -> None:
    """Export ``COOKBOOK_PRELOAD`` for the child parsers and jobs this process starts (bench entry points only)."""
    if value := preload_value():
        os.environ["COOKBOOK_PRELOAD"] = value
