"""Memory timeline from a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot`` pickle).

torchtune writes ``rank0_memory_snapshot.pickle`` next to the traces when ``profiler.profile_memory``
is on (rank 0 only); torchtitan writes ``profiling/memory_snapshot/step_N/{rank:06d}_step_N.pickle``
with ``--profiler.enable_memory_snapshot``. Both need CUDA: a CPU run has no snapshot (the CPU
allocator records no history), so on the local CPU cluster there is nothing to plot.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

CPU_NOTE = (
    "No memory snapshot here: snapshots (torch.cuda.memory._record_memory_history) exist only for GPU "
    "runs profiled with the recipe's profiling_overrides(..., memory=True); "
    "a CPU run cannot record one."
)


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a snapshot pickle (a dict with ``segments`` and ``device_traces``)."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    if not isinstance(snap, dict) or "device_traces" not in snap or "segments" not in snap:
        raise ValueError(f"{path}: not a torch.cuda memory snapshot (no 'segments'/'device_traces')")
    return snap


def memory_timeline(snapshot: dict[str, Any], device: int = 0) -> pd.DataFrame:
    """Allocated bytes after each recorded event of ``device``: ``time_us, action, size, allocated_bytes``.

    Blocks allocated before recording started have no ``alloc`` event; they are the baseline,
    computed so that the last point equals what the snapshot's segments hold at dump time."""
    trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    sign = {"alloc": 1, "free_completed": -1}
    rows = [
        (e.get("time_us", i), e["action"], int(e.get("size", 0)) * sign[e["action"]])
        for i, e in enumerate(trace)
        if e.get("action") in sign
    ]
    df = pd.DataFrame(rows, columns=["time_us", "action", "delta"])
    at_dump = sum(
        b["size"]
        for seg in snapshot["segments"]
        if seg.get("device", 0) == device
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    )
    baseline = at_dump - int(df["delta"].sum())
    df["allocated_bytes"] = baseline + df["delta"].cumsum()
    df["size"] = df["delta"].abs()
    return df[["time_us", "action", "size", "allocated_bytes"]]


def plot_memory_timeline(timeline: pd.DataFrame, title: str = "Allocated GPU memory") -> Figure:
    """Allocated GiB over time (seconds since the first recorded event)."""
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.subplots()
    t = (timeline["time_us"] - timeline["time_us"].min()) / 1e6 if len(timeline) else timeline["time_us"]
    ax.step(t, timeline["allocated_bytes"] / 2**30, where="post")
    ax.set(title=title, xlabel="s", ylabel="GiB allocated")
    return fig
