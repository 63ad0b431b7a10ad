"""A run's GPU and NIC telemetry (what :mod:`cookbook_runtime.telemetry` wrote on every node): one table, a line
per node, the findings that name a throttled GPU, an XID, ECC errors or an erroring NIC, and a plot per node.

    df = read_telemetry(run_dir)        # every start's samples: node, start, time, device, clocks, power...
    node_lines(df)                      # "n2: 8 GPUs, SM 1410-1980 MHz, max 71 C, GPU 4 hw_slowdown 100%"
    findings(df)                        # [TelemetryFinding(...)], most time lost first
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cookbook_runtime import files
from cookbook_runtime.telemetry import COLUMNS, FAULT_MASK, fault_names

if TYPE_CHECKING:
    import pandas as pd


def telemetry_from_log(log: str | os.PathLike[str]) -> pd.DataFrame:
    """The run's telemetry, found from its log: the batch step names the folder at each start
    (``files.TELEMETRY_LINE``), every start under the same run folder, so the first line found is enough and the
    rest of a long log is not read (``watch`` and the notebook monitor ask again while the job runs)."""
    from pathlib import Path

    try:
        with Path(log).open(errors="replace") as f:
            found = next((m for line in f if (m := files.TELEMETRY_LINE.search(line))), None)
    except OSError:
        found = None
    return read_telemetry(Path(found.group(2)).parents[2] if found else Path(os.devnull))


NOTHING_FOUND = "no throttle, XID or error"  # a node line's end when its GPUs and NICs showed no fault


def read_telemetry(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Every node's samples of every start of the run (``start`` = ``<job>-<restart>``); empty when none."""
    import pandas as pd

    frames = []
    for csv in sorted((files.state_dir(run_dir) / files.TELEMETRY).glob("*/*.csv")):
        try:
            df = pd.read_csv(csv, dtype={"device": str, "xid": str}, on_bad_lines="skip")
        except (pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
        frames.append(df.assign(node=csv.stem, start=csv.parent.name))
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, "node", "start"])
    return pd.concat(frames, ignore_index=True)


def gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The GPU rows (``device`` a GPU index), with ``gpu`` as an int and ``faults`` the fault bits of ``throttle``."""
    g = df[df["device"].astype(str).str.fullmatch(r"\d+")].copy()
    g["gpu"] = g["device"].astype(int)
    g["faults"] = g["throttle"].fillna(0).astype(int) & FAULT_MASK
    return g


@dataclass(frozen=True)
class TelemetryFinding:
    """A GPU or NIC fault seen on a node: what, where, the share of the run it lasted, how to fix it."""

    kind: str  # throttle, xid, ecc, nic
    node: str
    device: str
    share: float  # of the node's samples (throttle), 1.0 for an error counted at all
    finding: str
    fix: str


def findings(df: pd.DataFrame) -> list[TelemetryFinding]:
    """Throttled GPUs (fault reasons only, by the share of the run and the clock lost), XIDs, uncorrected ECC
    errors and NIC error counters that rose during the run; most costly first."""
    out: list[TelemetryFinding] = []
    g = gpu_rows(df)
    for (node, gpu), rows in g.groupby(["node", "gpu"]):
        faulty = rows[rows["faults"] > 0]
        if len(faulty):
            share = len(faulty) / len(rows)
            bits = _or(faulty["faults"])
            clock = faulty["sm_mhz"].median()
            peers = g[(g["node"] != node) | (g["gpu"] != gpu)]["sm_mhz"].median()
            at = f" at {clock:,.0f} MHz" + (f" (its peers {peers:,.0f})" if peers == peers else "")
            out.append(TelemetryFinding(
                "throttle", str(node), str(gpu), share,
                f"{node} GPU {gpu} spent {100 * share:.0f}% of the run throttled by {'+'.join(fault_names(bits))}{at}",
                "hardware or thermal slowdown: check its cooling and power (`nvidia-smi -q -d PERFORMANCE`), "
                "then drain it (`scontrol update nodename=NODE state=drain reason=throttle`)",
            ))  # fmt: skip
        xids = [x for v in rows["xid"].dropna() for x in str(v).split(";") if x]
        if xids:
            out.append(TelemetryFinding(
                "xid", str(node), str(gpu), 1.0, f"{node} GPU {gpu} reported XID {', '.join(sorted(set(xids)))}",
                "an XID is a driver-reported GPU fault: read `dmesg | grep -i xid` on the node; drain it for a reset",
            ))  # fmt: skip
        ecc = rows["ecc_uncorrected"].dropna()
        if len(ecc) and ecc.max() > 0:
            out.append(TelemetryFinding(
                "ecc", str(node), str(gpu), 1.0, f"{node} GPU {gpu} has {int(ecc.max())} uncorrected ECC errors",
                "uncorrected ECC errors corrupt results: drain the node for a GPU reset or replacement",
            ))  # fmt: skip
    nics = df[df["device"].astype(str).str.contains(":")]
    for (node, dev), rows in nics.groupby(["node", "device"]):
        errors = rows["nic_errors"].dropna()
        rose = errors.max() - errors.min() if len(errors) else 0
        if rose > 0:
            out.append(TelemetryFinding(
                "nic", str(node), str(dev), 1.0,
                f"{node}'s {dev} counted {_count(rose)} link errors during the run ({_count(errors.max())} since boot)",
                "a NIC or cable with errors slows every collective: `ibstat`, `perfquery -x` on the node; "
                "reseat or replace the cable",
            ))  # fmt: skip
    return sorted(out, key=lambda f: ({"xid": 0, "ecc": 0, "throttle": 1, "nic": 2}[f.kind], -f.share))


def _or(values: Any) -> int:
    bits = 0
    for v in values:
        bits |= int(v)
    return bits


def _count(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n:.0f}"


def node_lines(df: pd.DataFrame) -> list[str]:
    """One line per node: GPUs, SM clock range, hottest GPU, any fault throttle, XID, ECC or NIC error."""
    g = gpu_rows(df)
    bad: dict[str, list[str]] = {}
    for f in findings(df):
        bad.setdefault(f.node, []).append(f.finding.split(" ", 1)[1])
    out = []
    for node in sorted(set(df["node"])):
        rows = g[g["node"] == node]
        if rows.empty:
            host = df[(df["node"] == node) & (df["device"] == "host")]
            out.append(f"{node}: no GPU readings (host load {host['load'].max():.1f})" if len(host) else node)
            continue
        head = (
            f"{node}: {rows['gpu'].nunique()} GPUs, SM {rows['sm_mhz'].min():,.0f}-{rows['sm_mhz'].max():,.0f} MHz, "
            f"max {rows['temp_c'].max():.0f} C, {rows['power_w'].mean():.0f} W mean"
        )
        out.append("; ".join([head, *bad.get(node, [NOTHING_FOUND])]))
    return out


def energy_kwh(df: pd.DataFrame) -> float | None:
    """The GPUs' energy over the run: each GPU's power integrated over its samples (None without readings)."""
    g = gpu_rows(df).dropna(subset=["power_w"]).sort_values("time")
    if g.empty:
        return None
    joules = 0.0
    for _, rows in g.groupby(["node", "start", "gpu"]):
        t, p = rows["time"].to_numpy(), rows["power_w"].to_numpy()
        joules += float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum())
    return joules / 3.6e6


def join_telemetry(steps: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """``steps`` (a metrics table with its ``time`` column) with what the GPUs did at each step: on every node the
    newest sample at or before it (each node samples on its own clock), then across the nodes: ``gpu_min_sm_mhz``,
    ``gpu_max_temp_c``, ``gpu_power_w`` (summed), ``gpu_faults`` (``node:gpu`` held by a fault reason). Rows
    without a time, or before the first sample, get empty cells; without telemetry ``steps`` comes back as it is."""
    import pandas as pd

    g = gpu_rows(df)
    if g.empty or "time" not in steps or steps["time"].isna().all():
        return steps
    g = g.assign(held=[f"{n}:{i}" if f else "" for n, i, f in zip(g["node"], g["gpu"], g["faults"], strict=True)])
    # the log's clock is the nodes' local time, the samples' unix time: the same instant in the login's zone
    g["sampled"] = (
        pd.to_datetime(g["time"], unit="s", utc=True).dt.tz_convert(_local_zone()).dt.tz_localize(None)
    ).astype("datetime64[ns]")
    order = steps.assign(_i=range(len(steps)))
    timed = order.dropna(subset=["time"]).assign(_t=lambda d: d["time"].astype("datetime64[ns]")).sort_values("_t")
    parts = []
    for _, rows in g.groupby("node"):
        per = rows.groupby("sampled").agg(
            mhz=("sm_mhz", "min"), temp=("temp_c", "max"), power=("power_w", "sum"),
            held=("held", lambda h: ",".join(x for x in h if x)),
        ).reset_index()  # fmt: skip
        at = pd.merge_asof(timed[["_i", "_t"]], per, left_on="_t", right_on="sampled", direction="backward")
        parts.append(at.drop(columns=["_t", "sampled"]))
    each = pd.concat(parts)
    across = each.groupby("_i").agg(
        gpu_min_sm_mhz=("mhz", "min"), gpu_max_temp_c=("temp", "max"),
        gpu_power_w=("power", lambda p: p.sum(min_count=1)),
        gpu_faults=("held", lambda h: ",".join(x for x in h.dropna() if x)),
    )  # fmt: skip
    out = order.merge(across, left_on="_i", right_index=True, how="left").sort_values("_i")
    return out.drop(columns=["_i"]).reset_index(drop=True)


def _local_zone() -> Any:
    import datetime

    return datetime.datetime.now().astimezone().tzinfo


def gpu_summary(df: pd.DataFrame) -> dict[str, float] | None:
    """What the GPUs did over the run, for the goodput ledger: how many, mean SM clock, mean power, energy (kWh);
    None without GPU readings."""
    g = gpu_rows(df)
    energy = energy_kwh(df)
    if g.empty or energy is None:
        return None
    gpus = float(len(g.groupby(["node", "gpu"])))
    return {"gpus": gpus, "mean_sm_mhz": float(g["sm_mhz"].mean()), "mean_power_w": float(g["power_w"].mean()),
            "energy_kwh": energy}  # fmt: skip


def plot_nodes(df: pd.DataFrame) -> Any:
    """SM clock and temperature per GPU over time, one row of panels per node (a figure)."""
    import matplotlib.pyplot as plt

    g = gpu_rows(df)
    nodes = sorted(set(g["node"])) or ["(no GPU readings)"]
    fig, axes = plt.subplots(len(nodes), 2, figsize=(10, 2.2 * len(nodes) + 0.5), squeeze=False)
    t0 = g["time"].min() if len(g) else 0
    found: dict[str, list[TelemetryFinding]] = {}
    for f in findings(df):
        found.setdefault(f.node, []).append(f)
    for row, node in zip(axes, nodes, strict=True):
        for gpu, rows in g[g["node"] == node].groupby("gpu"):
            minutes = (rows["time"] - t0) / 60
            row[0].plot(minutes, rows["sm_mhz"], label=f"GPU {gpu}", lw=1)
            row[1].plot(minutes, rows["temp_c"], lw=1)
            for t in rows[rows["xid"].notna() & (rows["xid"] != "")]["time"]:  # when the XID came
                row[0].axvline((t - t0) / 60, color="red", lw=0.8)
        row[0].set(ylabel=f"{node}\nSM MHz")
        row[1].set(ylabel="C")
        short = [f.finding.split(" ", 1)[1].split(" (")[0] for f in found.get(node, [])]  # without the node
        row[0].set_title("; ".join(short) or NOTHING_FOUND, fontsize=7, loc="left",
                         color="red" if short else "black")  # fmt: skip
    axes[-1][0].set(xlabel="minutes")
    axes[-1][1].set(xlabel="minutes")
    if len(g):
        axes[0][0].legend(fontsize=6, ncol=4)
    fig.tight_layout()
    return fig
