"""Stragglers: ranks (and their hosts) that are persistently slower than the others.

Input is ``parse_starts(path, ranks="all")`` (or ``parse_log``): one row per (rank, step) with ``rank``
(global rank), ``time`` (when the log has timestamps) or ``seconds_per_step``, and ``start`` (the start of
a requeued job that logged it: times are compared within a start). In synchronous data-parallel training
every rank waits for the slowest at each collective, so all ranks show the same step *time*; the slow
rank shows up as the one that *reaches* each step last (its log line comes after the others') and,
where the log prints a per-rank step time (compute only), as the one whose step takes longest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from cookbook.slurm.client import SlurmClient

SLOW_RATIO = 1.10  # a rank's step time this far above the median of the ranks counts as slow for the step
MIN_LAG_S = 0.05  # reaching a step this much after the first rank counts as late
PERSISTENT = 0.5  # slow/late in at least this share of the steps compared


@dataclass(frozen=True)
class Straggler:
    """A rank that was slow (or late) in most steps."""

    rank: int
    host: str | None
    steps_compared: int
    slow_share: float  # share of steps where it was slow or late
    median_lag_s: float  # how long after the first rank it reached a step (median)
    median_ratio: float  # its step time / the median rank's (1.0 when only arrival times are known)
    gpu: int | None = None  # its local rank on the host: the GPU it ran on (one process per GPU)
    why: str = ""  # what the host's telemetry saw there (:func:`with_telemetry`)

    def __str__(self) -> str:
        where = f" on {self.host}" if self.host else ""
        where += f" GPU {self.gpu}" if self.host and self.gpu is not None else ""
        how = (
            f"reaches each step {self.median_lag_s:.2f} s after the first rank"
            if self.median_lag_s > 0
            else f"steps take x{self.median_ratio:.2f} the median rank's"
        )
        said = f"rank {self.rank}{where} is slow in {100 * self.slow_share:.0f}% of {self.steps_compared} steps: {how}"
        return said + (f"; {self.why}" if self.why else "")


def rank_step_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per (start, step, rank): ``lag_s`` (arrival after the first rank) and ``step_s`` (its own step time).

    ``step_s`` is the log's ``seconds_per_step`` where printed, else the time since the rank's previous
    step line of the same start: ``start`` (:func:`cookbook.analysis.starts.parse_starts`; 0 without it)
    keeps a requeue's gap, and a step a resumed start logs again, apart. Train rows only; steps logged by
    a single rank are dropped (nothing to compare).
    """
    import pandas as pd

    from cookbook.analysis.starts import start_of, step_seconds

    columns = ["start", "step", "rank", "lag_s", "step_s"]
    if "rank" not in df or df["rank"].isna().all():
        return pd.DataFrame(columns=columns)
    d = df[df["split"] == "train"] if "split" in df else df
    d = d.dropna(subset=["rank"]).assign(start=start_of(df))
    d["rank"] = d["rank"].astype(int)
    d = d.sort_values(["start", "rank", "step"], kind="stable")
    step = [d["start"], d["step"]]
    if "time" in d and d["time"].notna().any():
        t = pd.to_datetime(d["time"])
        d["lag_s"] = (t - t.groupby(step).transform("min")).dt.total_seconds()
        step_s = step_seconds(d, by=("rank",))
    else:
        d["lag_s"] = 0.0
        step_s = pd.Series(float("nan"), index=d.index)
    if "seconds_per_step" in d and d["seconds_per_step"].notna().any():
        step_s = d["seconds_per_step"].astype(float)
    d["step_s"] = step_s
    counts = d.groupby(step)["rank"].transform("nunique")
    return d.loc[counts > 1, columns].reset_index(drop=True)


def stragglers(
    df: pd.DataFrame, hosts: Sequence[str] | None = None, procs_per_node: int | None = None, skip_first: int = 1
) -> list[Straggler]:
    """Ranks slow or late in at least ``PERSISTENT`` of the steps, slowest first.

    ``hosts`` (the job's node list in order) with ``procs_per_node`` names each rank's host
    (rank r runs on hosts[r // procs_per_node], as torchrun numbers them with one launcher per node);
    ``procs_per_node`` None: the ranks in the log divided by the hosts.
    The first ``skip_first`` steps of each start of the job (warm-up, compilation) are left out.
    """
    t = rank_step_times(df)
    if t.empty:
        return []
    if procs_per_node is None:
        ranks = int(t["rank"].max()) + 1
        procs_per_node = ranks // len(hosts) if hosts and ranks % len(hosts) == 0 else 1
    t = t[t["step"] >= t.groupby("start")["step"].transform("min") + skip_first]
    if t.empty:
        return []
    step = t.groupby(["start", "step"])
    ratio = t["step_s"] / step["step_s"].transform("median")
    slow = (ratio > SLOW_RATIO) | (t["lag_s"] > MIN_LAG_S)
    # "late" is relative: with several late ranks, the latest one is the straggler
    late_rank = t.loc[step["lag_s"].idxmax()]
    found = []
    for rank, rows in t.groupby("rank"):
        n = len(rows.drop_duplicates(["start", "step"]))
        share = float(slow[rows.index].mean())
        latest = float((late_rank["rank"] == rank).mean())
        if share < PERSISTENT or (rows["lag_s"].median() > MIN_LAG_S and latest < PERSISTENT):
            continue
        i = int(rank) // max(1, procs_per_node)
        host = hosts[i] if hosts and i < len(hosts) else None
        r = ratio[rows.index].median()
        gpu = int(rank) % procs_per_node if procs_per_node > 1 else None  # one process a node: not told
        lag, r = float(rows["lag_s"].median()), float(r) if r == r else 1.0
        found.append(Straggler(int(rank), host, n, share, lag, r, gpu))
    return sorted(found, key=lambda s: (-s.median_lag_s, -s.median_ratio))


def stragglers_plot(df: pd.DataFrame) -> tuple[pd.DataFrame, object]:
    """Per-rank median lag and step time as a table, and a bar chart of the lag (for a notebook cell)."""
    import matplotlib.pyplot as plt

    t = rank_step_times(df)
    table = (
        t.groupby("rank")
        .agg(median_lag_s=("lag_s", "median"), median_step_s=("step_s", "median"), steps=("step", "nunique"))
        .reset_index()
    )
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(table["rank"].astype(str), table["median_lag_s"])
    ax.set(xlabel="rank", ylabel="median seconds after the first rank", title="time to reach each step, by rank")
    fig.tight_layout()
    return table, fig


def with_telemetry(found: list[Straggler], telemetry: pd.DataFrame | None) -> list[Straggler]:
    """Each straggler with what its host's telemetry saw: its GPU's throttle, XID or ECC errors, the host's NIC
    errors ("rank 12 is on n7 GPU 4 ...; n7 GPU 4 spent 31% of the run throttled by hw_thermal at 1,410 MHz")."""
    if telemetry is None or telemetry.empty or not found:
        return found
    from dataclasses import replace

    from cookbook.metrics.telemetry import findings

    seen = findings(telemetry)
    out = []
    for s in found:
        mine = [f.finding for f in seen if f.node == s.host and (f.kind == "nic" or f.device == str(s.gpu or 0))]
        out.append(replace(s, why="; ".join(mine)) if mine else s)
    return out


def straggler_lines(log: str, hosts: Sequence[str] | None = None, procs_per_node: int | None = None) -> list[str]:
    """``straggler: ...`` lines for a log with 2+ ranks (what ``cookbook watch`` prints at the end), with what the
    nodes' telemetry saw on the straggler's GPU."""
    from cookbook.analysis.starts import parse_starts
    from cookbook.metrics.telemetry import telemetry_from_log

    try:
        df = parse_starts(log, ranks="all")
    except (OSError, ValueError):
        return []
    found = with_telemetry(stragglers(df, hosts, procs_per_node), telemetry_from_log(log))
    return [f"straggler: {s}" for s in found]


def log_nodelist(log: str | Path) -> str | None:
    """The node list (Slurm's compressed form) the log's last start of the script printed, if any."""
    from cookbook.analysis.starts import START_LINE

    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    found = [m.group(3) for m in START_LINE.finditer(text)]
    return found[-1] if found and found[-1] else None


def job_hosts(
    log: str | Path, job_id: str | None = None, client: SlurmClient | None = None, nodelist: str | None = None
) -> list[str] | None:
    """The job's hosts in order, to name a straggler's host: from ``nodelist``, else the node list the
    log's script printed, else Slurm's record of ``job_id`` (sacct); expanded by ``scontrol show hostnames``.
    None when unknown or when Slurm's tools are not at hand (a log read on a laptop)."""
    from cookbook.slurm.client import SlurmClient, SlurmError

    nodelist = nodelist or log_nodelist(log)
    try:
        if nodelist is None and job_id:
            nodelist = (client or SlurmClient()).state(job_id).nodes
        if not nodelist or "(" in nodelist or nodelist.lower().startswith("none"):  # pending: no nodes yet
            return None
        if "[" not in nodelist:
            return nodelist.split(",")
        return (client or SlurmClient()).hostnames(nodelist) or None
    except (SlurmError, OSError):
        return None
