"""What a trace says: step times, top operators by self time, compute / communication / idle.

Definitions (per profiled step, the window of its ``ProfilerStep#N`` span):

- GPU trace: *compute* = time any non-communication kernel / memcpy / memset runs; *communication*
  = time a collective kernel (``nccl*``) runs while no compute kernel does (exposed communication;
  ``comm_overlapped_ms`` is the part hidden under compute); *idle* = the rest of the step.
- CPU trace (gloo): the "device" is the training thread. *compute* = time it spends in ATen operators
  (outside collective calls); *communication* = time in collective calls (``c10d::*``,
  ``_c10d_functional::*``, ``record_param_comms``) or while gloo's worker threads run a collective
  (``gloo:*``) and the training thread computes nothing; *idle* = the rest (Python, data loading).

``ProfilerStep#N`` covers training step ``N + 1`` as the logs count it (both torchtune and
torchtitan call ``profiler.step()`` after the step, and the counter starts at the resume step, 0).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cookbook.profiling import intervals
from cookbook.profiling.trace import GPU_CATS, HOST_CATS, STEP_PREFIX, Trace, load_trace

COMM_RE = re.compile(r"nccl|^gloo:|^c10d::|^_?c10d_functional::|record_param_comms|^mpi:", re.IGNORECASE)


def is_comm(name: str) -> bool:
    """Whether an event name is a collective / point-to-point communication."""
    return COMM_RE.search(name) is not None


def step_times(trace: Trace) -> pd.DataFrame:
    """One row per profiled step: ``profiler_step``, ``training_step`` (1-based, as logged),
    ``start_us``, ``step_ms``."""
    st = trace.step_events
    prof_step = st["name"].str.slice(len(STEP_PREFIX)).astype(int)
    return pd.DataFrame(
        {
            "profiler_step": prof_step.to_numpy(),
            "training_step": prof_step.to_numpy() + 1,
            "start_us": st["ts"].to_numpy(),
            "step_ms": st["dur"].to_numpy() / 1e3,
        }
    )


def self_times(trace: Trace) -> pd.DataFrame:
    """Host events with their self time (``dur`` minus the time of events nested in them on the same
    thread), in microseconds, as column ``self``."""
    ev = trace.events[trace.events["cat"].isin(HOST_CATS)].copy()
    # parents before children: by start, longer first; the stack below is kept per thread
    ev = ev.sort_values(["ts", "dur"], ascending=[True, False], kind="stable")
    child = np.zeros(len(ev))
    ts, end, dur = ev["ts"].to_numpy(), ev["end"].to_numpy(), ev["dur"].to_numpy()
    stacks: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(ev["pid"].to_numpy(), ev["tid"].to_numpy())):
        stack = stacks.setdefault(key, [])
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            child[stack[-1]] += dur[i]
        stack.append(i)
    ev["self"] = np.maximum(dur - child, 0.0)
    return ev


def top_operators(trace: Trace, n: int = 15) -> pd.DataFrame:
    """Operators (``cpu_op``) with the most self time: ``name, calls, self_ms, total_ms, self_pct``."""
    ev = self_times(trace)
    ops = ev[ev["cat"] == "cpu_op"]
    g = ops.groupby("name").agg(calls=("dur", "size"), self_ms=("self", "sum"), total_ms=("dur", "sum"))
    g[["self_ms", "total_ms"]] /= 1e3
    g["self_pct"] = 100 * g["self_ms"] / g["self_ms"].sum() if len(g) else 0.0
    return g.sort_values("self_ms", ascending=False).head(n).reset_index()


def top_kernels(trace: Trace, n: int = 15) -> pd.DataFrame:
    """GPU kernels with the most time: ``name, calls, total_ms, pct`` (empty on CPU traces)."""
    k = trace.events[trace.events["cat"].isin(GPU_CATS)]
    g = k.groupby("name").agg(calls=("dur", "size"), total_ms=("dur", "sum"))
    g["total_ms"] /= 1e3
    g["pct"] = 100 * g["total_ms"] / g["total_ms"].sum() if len(g) else 0.0
    return g.sort_values("total_ms", ascending=False).head(n).reset_index()


def _iv(df: pd.DataFrame) -> np.ndarray:
    return df[["ts", "end"]].to_numpy(dtype=float)


def time_breakdown(trace: Trace) -> pd.DataFrame:
    """Per profiled step: ``step_ms, compute_ms, comm_ms`` (exposed), ``comm_overlapped_ms, idle_ms``
    and the three shares (compute + comm + idle = 1). See the module docstring for definitions."""
    ev = trace.events
    comm_mask = ev["name"].map(is_comm)
    if trace.has_gpu:
        dev = ev["cat"].isin(GPU_CATS)
        comp_all, comm_all = _iv(ev[dev & ~comm_mask]), _iv(ev[dev & comm_mask])
        comm_host = intervals.EMPTY
    else:
        pid, tid = trace.main_thread or (None, None)
        main = (ev["pid"] == pid) & (ev["tid"] == tid)
        comp_all = _iv(ev[main & (ev["cat"] == "cpu_op") & ev["name"].str.startswith("aten::")])
        comm_host = _iv(ev[main & comm_mask & ev["cat"].isin(HOST_CATS)])
        comm_all = _iv(ev[comm_mask & ev["cat"].isin(HOST_CATS)])
    rows = []
    for _, st in step_times(trace).iterrows():
        lo, hi = st["start_us"], st["start_us"] + st["step_ms"] * 1e3
        comp = intervals.subtract(intervals.clip(comp_all, lo, hi), intervals.clip(comm_host, lo, hi))
        comm = intervals.clip(comm_all, lo, hi)
        compute = intervals.total(comp)
        exposed = intervals.total(intervals.subtract(comm, comp))
        step_us = hi - lo
        rows.append(
            {
                "training_step": int(st["training_step"]),
                "step_ms": step_us / 1e3,
                "compute_ms": compute / 1e3,
                "comm_ms": exposed / 1e3,
                "comm_overlapped_ms": (intervals.total(comm) - exposed) / 1e3,
                "idle_ms": max(step_us - compute - exposed, 0.0) / 1e3,
            }
        )
    df = pd.DataFrame(
        rows, columns=["training_step", "step_ms", "compute_ms", "comm_ms", "comm_overlapped_ms", "idle_ms"]
    )
    for part in ("compute", "comm", "idle"):
        df[f"{part}_share"] = df[f"{part}_ms"] / df["step_ms"]
    return df


@dataclass
class RunSummary:
    """Summary of the traces of several ranks (one profiling cycle)."""

    per_rank: pd.DataFrame  # rank, device, steps, mean/max step ms, compute/comm/idle share
    steps: pd.DataFrame  # rank, training_step, step_ms, compute_ms, comm_ms, ..., shares
    top_ops: pd.DataFrame  # top operators (self time) of the slowest rank
    top_kernels: pd.DataFrame  # top GPU kernels of the slowest rank (empty on CPU)
    slowest_rank: int | None

    @property
    def straggler_rank(self) -> int | None:
        """The rank the others wait for: least exposed communication (it arrives last at each
        collective). Only meaningful with 2+ ranks."""
        if len(self.per_rank) < 2:
            return None
        return int(self.per_rank.sort_values("comm_share").iloc[0]["rank"])

    def render(self) -> str:
        """Plain-text report."""
        pr = self.per_rank.copy()
        for c in ("compute_share", "comm_share", "idle_share"):
            pr[c] = (100 * pr[c]).round(1).astype(str) + "%"
        lines = [
            "Per rank (mean over profiled steps):",
            pr.round(2).to_string(index=False),
            "",
            f"Slowest rank: {self.slowest_rank}",
        ]
        if self.straggler_rank is not None:
            lines.append(f"Least waiting on communication (others wait for it): rank {self.straggler_rank}")
        lines += ["", f"Top operators by self time (rank {self.slowest_rank}):", _table(self.top_ops)]
        if not self.top_kernels.empty:
            lines += ["", f"Top GPU kernels (rank {self.slowest_rank}):", _table(self.top_kernels)]
        else:
            lines += ["", "No GPU kernels in these traces (CPU run): shares are of the training thread's time."]
        return "\n".join(lines)


def _table(df: pd.DataFrame, width: int = 70) -> str:
    df = df.copy()
    df["name"] = [n if len(n) <= width else n[: width - 3] + "..." for n in df["name"]]
    return df.round(2).to_string(index=False)


def _label(trace: Trace, i: int) -> int:
    return trace.rank if trace.rank is not None else i


def summarize(traces: Sequence[Trace | str | Path], n_top: int = 15) -> RunSummary:
    """Summarize the traces of one profiling cycle (one per rank, or any subset of ranks)."""
    loaded = [t if isinstance(t, Trace) else load_trace(t) for t in traces]
    if not loaded:
        raise ValueError("no traces to summarize")
    per_rank, steps = [], []
    for i, tr in enumerate(loaded):
        bd = time_breakdown(tr)
        if bd.empty:
            raise ValueError(
                f"{tr.path or 'trace'}: no ProfilerStep spans (an empty trace, e.g. written when a "
                "run ended during the profiler's wait phase)"
            )
        rank = _label(tr, i)
        steps.append(bd.assign(rank=rank))
        per_rank.append(
            {
                "rank": rank,
                "device": "gpu" if tr.has_gpu else "cpu",
                "steps": len(bd),
                "mean_step_ms": bd["step_ms"].mean(),
                "max_step_ms": bd["step_ms"].max(),
                **{f"{p}_share": bd[f"{p}_ms"].sum() / bd["step_ms"].sum() for p in ("compute", "comm", "idle")},
            }
        )
    pr = pd.DataFrame(per_rank).sort_values("rank").reset_index(drop=True)
    slowest = int(pr.loc[pr["mean_step_ms"].idxmax(), "rank"])
    slow_trace = next(t for i, t in enumerate(loaded) if _label(t, i) == slowest)
    st = pd.concat(steps, ignore_index=True)
    st = st[["rank"] + [c for c in st.columns if c != "rank"]]
    return RunSummary(
        per_rank=pr,
        steps=st,
        top_ops=top_operators(slow_trace, n_top),
        top_kernels=top_kernels(slow_trace, n_top),
        slowest_rank=slowest,
    )


def plot_summary(summary: RunSummary) -> Figure:
    """Three panels: step time per rank, compute / communication / idle share per rank, top operators."""
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.4]})
    for rank, g in summary.steps.groupby("rank"):
        ax1.plot(g["training_step"], g["step_ms"], marker="o", label=f"rank {rank}")
    ax1.set(title="Step time (profiled steps)", xlabel="training step", ylabel="ms")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.legend(fontsize="small")
    pr = summary.per_rank
    left = np.zeros(len(pr))
    labels = [f"rank {r}" for r in pr["rank"]]
    for part, color in (("compute", "tab:blue"), ("comm", "tab:orange"), ("idle", "tab:gray")):
        vals = 100 * pr[f"{part}_share"].to_numpy()
        ax2.barh(labels, vals, left=left, color=color, label=part)
        left += vals
    ax2.set(title="Share of step time", xlabel="%", xlim=(0, 100))
    ax2.invert_yaxis()
    ax2.legend(fontsize="small", loc="lower right")
    top, col, what = (
        (summary.top_kernels, "total_ms", "GPU kernels")
        if not summary.top_kernels.empty
        else (summary.top_ops, "self_ms", "operators by self time")
    )
    top = top.head(10).iloc[::-1]
    ypos = np.arange(len(top))  # positions, not names: two long names may shorten alike
    ax3.barh(ypos, top[col], color="tab:blue")
    ax3.set_yticks(ypos, [n if len(n) <= 40 else n[:37] + "..." for n in top["name"]])
    ax3.set(title=f"Top {what} (rank {summary.slowest_rank})", xlabel="ms (all profiled steps)")
    ax3.tick_params(axis="y", labelsize=7)
    return fig
