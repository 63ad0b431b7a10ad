"""Read one PyTorch profiler (Kineto) trace: ``*.pt.trace.json[.gz]`` or torchtitan's ``rank{R}_trace.json.gz``.

Only complete events (``"ph": "X"``) are kept, as a DataFrame with ``name, cat, pid, tid, ts, dur, end``
(microseconds). CPU-side events are ``cat`` ``cpu_op`` / ``user_annotation`` / ``python_function``;
GPU work is ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (on ``pid`` = device, ``tid`` = stream).
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})
STEP_PREFIX = "ProfilerStep#"


@dataclass
class Trace:
    """One rank's trace of one profiling cycle."""

    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def rank(self) -> int | None:
        return (self.meta.get("distributedInfo") or {}).get("rank")

    @property
    def world_size(self) -> int | None:
        return (self.meta.get("distributedInfo") or {}).get("world_size")

    @property
    def backend(self) -> str | None:
        return (self.meta.get("distributedInfo") or {}).get("backend")

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds GPU kernels (a CPU-only run has none)."""
        return bool(self.events["cat"].isin(GPU_CATS).any())

    @property
    def step_events(self) -> pd.DataFrame:
        """The host-side ``ProfilerStep#N`` spans (one per profiled step)."""
        ev = self.events
        host = ~ev["cat"].isin(GPU_CATS) & (ev["cat"] != "gpu_user_annotation")
        return ev[ev["name"].str.startswith(STEP_PREFIX) & host].sort_values("ts")

    @property
    def main_thread(self) -> tuple[Any, Any] | None:
        """``(pid, tid)`` of the training loop's thread (the one running the ProfilerStep spans)."""
        steps = self.step_events
        if steps.empty:
            return None
        row = steps.iloc[0]
        return row["pid"], row["tid"]


def trace_from_dict(data: dict[str, Any], path: Path | None = None) -> Trace:
    """A :class:`Trace` from an already-parsed trace JSON."""
    rows = [
        (e.get("name", ""), e.get("cat", ""), e.get("pid"), e.get("tid"), float(e["ts"]), float(e.get("dur", 0.0)))
        for e in data.get("traceEvents", [])
        if e.get("ph") == "X" and "ts" in e
    ]
    events = pd.DataFrame(rows, columns=["name", "cat", "pid", "tid", "ts", "dur"])
    events["end"] = events["ts"] + events["dur"]
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return Trace(events=events, meta=meta, path=path)


def open_binary(path: Path) -> io.BufferedIOBase:
    """A trace file opened for reading bytes, gunzipped when it ends in ``.gz``."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def load_trace(path: str | Path) -> Trace:
    """Read a trace file (gzipped or not)."""
    path = Path(path)
    try:
        with open_binary(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable profiler trace ({e})") from e
    if "traceEvents" not in data:
        raise ValueError(f"{path}: no 'traceEvents' (not a PyTorch profiler trace)")
    return trace_from_dict(data, path)
