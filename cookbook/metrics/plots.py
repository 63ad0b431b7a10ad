"""Loss (raw + smoothed), throughput, memory and MFU against step, for one run or several overlaid.

Returns a matplotlib ``Figure`` (no pyplot state), so a notebook cell shows it inline and scripts can
save it: ``plot_runs({"bs8": "a.log", "bs16": "b.log"}, out="cmp.png")``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cookbook.metrics.parse import parse_log

Run: TypeAlias = pd.DataFrame | str | os.PathLike[str]

# panel title -> candidate columns (first present wins)
# fmt: off
PANELS: dict[str, tuple[str, ...]] = {
    "loss": ("loss",), "throughput": ("tokens_per_second_per_gpu", "samples_per_second"), "memory": ("memory_gib",),
    "mfu": ("mfu_pct",)}
# printed as 0 when a framework cannot compute them (torchtitan's mfu on CPU or FLUX): all zeros = unknown, no panel
_ZERO_IS_UNKNOWN = {"mfu_pct", "tflops"}
_LABELS = {
    "tokens_per_second_per_gpu": "tokens/s/GPU", "samples_per_second": "samples/s", "memory_gib": "memory (GiB)",
    "mfu_pct": "MFU (%)", "loss": "loss",
}
# fmt: on


def smooth(values: pd.Series, alpha: float = 0.1) -> pd.Series:
    """Exponential moving average (TensorBoard-style, debiased) of a series."""
    return values.ewm(alpha=alpha, adjust=True, ignore_na=True).mean()


def _as_runs(runs: Run | Sequence[Run] | Mapping[str, Run]) -> dict[str, pd.DataFrame]:
    items = [(None, runs)] if isinstance(runs, (pd.DataFrame, str, os.PathLike)) else [(None, r) for r in runs]
    items = list(runs.items()) if isinstance(runs, Mapping) else items
    out: dict[str, pd.DataFrame] = {}
    for i, (name, run) in enumerate(items):
        df = run if isinstance(run, pd.DataFrame) else parse_log(run)
        source = df.attrs.get("source", f"run {i + 1}") if isinstance(run, pd.DataFrame) else str(run)
        out[name or Path(source).name] = df
    return out


def _has_values(df: pd.DataFrame, col: str) -> bool:
    values = df[col].dropna() if col in df else pd.Series(dtype=float)
    return bool(len(values)) and not (col in _ZERO_IS_UNKNOWN and bool((values == 0).all()))


def _loss_lines(ax: Axes, train: pd.DataFrame, color: str, label: str, alpha: float) -> None:
    """The raw loss with its last value marked and named in the legend and beside the point (the final loss), and
    its moving average, labelled as such: the average trails a falling loss, so its end is not the final loss."""
    step, last = train["step"].iloc[-1], float(train["loss"].iloc[-1])
    ax.plot(train["step"], train["loss"], color=color, alpha=0.45, linewidth=1, marker="o", markevery=[len(train) - 1],
            label=f"{label}: final loss {last:.4g} (step {step:g})")  # fmt: skip
    ax.annotate(f"{last:.4g}", (step, last), textcoords="offset points", xytext=(4, 4), color=color, fontsize="small")
    ax.plot(
        train["step"],
        smooth(train["loss"], alpha),
        color=color,
        linewidth=2,
        label=f"{label}: smoothed (EMA {alpha:g})",
    )


def plot_runs(runs: Run | Sequence[Run] | Mapping[str, Run], out: str | os.PathLike[str] | None = None,
              panels: Sequence[str] | None = None, alpha: float = 0.1) -> Figure:  # fmt: skip
    """One panel per metric present in any run (loss, throughput, memory, MFU); runs overlaid.

    Loss is drawn raw (faint) and smoothed; validation rows are drawn as markers. ``out`` saves a PNG."""
    frames = _as_runs(runs)
    chosen: list[tuple[str, str]] = []
    for title in list(panels or PANELS):
        for col in PANELS[title]:
            if any(_has_values(df, col) for df in frames.values()):
                chosen.append((title, col))
                break
    chosen = chosen or [("loss", "loss")]
    fig = Figure(figsize=(6.0 * min(len(chosen), 2), 3.6 * ((len(chosen) + 1) // 2)), layout="constrained")
    axes = fig.subplots((len(chosen) + 1) // 2, min(len(chosen), 2), squeeze=False).ravel()
    for ax in axes[len(chosen) :]:
        ax.set_visible(False)
    for ax, (title, col) in zip(axes, chosen, strict=False):  # axes: rounded up to a full grid
        for i, (label, df) in enumerate(frames.items()):
            if col not in df or df.empty:
                continue
            color = f"C{i}"
            split = df["split"] if "split" in df else pd.Series("train", index=df.index)
            train = df[split.eq("train")].dropna(subset=[col])
            if col == "loss" and len(train):
                _loss_lines(ax, train, color, label, alpha)
                val = df[~split.eq("train")].dropna(subset=[col])
                if len(val):
                    ax.plot(val["step"], val[col], "o--", color=color, markersize=4, label=f"{label} (validation)")
            else:
                ax.plot(train["step"], train[col], color=color, linewidth=1.5, label=label)
        ax.set(title=title, xlabel="step", ylabel=_LABELS.get(col, col))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(frames) > 1 or col == "loss":
            ax.legend(fontsize="small")
    if out is not None:
        fig.savefig(out, dpi=100)
    return fig
