"""Why is MFU low: measured MFU against the planner's expectation, and evidence checks ranked by cost.

Each check reads the job's log (and, when given, the job's script, its 1-node baseline log, profiler
traces) and returns :class:`Evidence` with an estimated cost (share of throughput it takes) and a fix:

- NCCL on TCP sockets (``NCCL INFO ... NET/Socket``, ``Using network Socket``) where the profile has
  InfiniBand/EFA, and the fabric plugin not loaded (``NET/Plugin : No plugin found``);
- fewer GPUs per node than the node has; every rank of a node bound to one CPU core;
- data-loader stalls: step-time spikes within a start of the job (a requeue's gap is no step, nor a
  checkpoint save's time);
- activation checkpointing heavier than needed (the planner says a lighter mode fits);
- a straggler rank (rank-tagged logs, or profiler traces: the rank the others wait for);
- scaling efficiency against the 1-node run of the same recipe;
- from the nodes' telemetry (``RUN_DIR/.cookbook/telemetry``): a GPU throttled by a hardware, thermal or
  power-brake slowdown (its share of the run x the clock it lost), an XID, uncorrected ECC errors, a NIC whose
  error counters rose during the run (faults: listed first, with no throughput estimate);
- the recoveries inside the allocation (``RUN_DIR/.cookbook/recoveries.tsv``): each node fault with what it cost
  (detection, stop/decide, relaunch + restore, steps redone), a fault too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    import pandas as pd

    from cookbook.analysis.goodput import Attempt
    from cookbook_runtime.decide import Incident

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NCCL_SOCKET = re.compile(r"NCCL INFO (?:Using network Socket|.*via NET/Socket|NET/Socket : Using)")
NCCL_FABRIC = re.compile(
    r"NCCL INFO (?:Using network (?:IB|AWS Libfabric|OFI)|.*via NET/(?:IB|OFI|AWS Libfabric)|"
    r"NET/OFI Selected [Pp]rovider is efa|NET/IB : Using \[)"
)
NCCL_NO_PLUGIN = re.compile(r"NCCL INFO NET/Plugin ?: (?:No plugin found|Plugin load returned|Could not find)")
NCCL_IB_NONE = re.compile(r"NCCL INFO NET/IB : No device found")
AC_APPLIED = re.compile(r"Applied (full|selective|SelectiveAC|FullAC)\w* activation checkpointing", re.I)

STALL_FACTOR = 2.0  # a step this many times the median step counts as a stall
SOCKET_COST = 0.5  # multi-node FSDP on TCP sockets instead of IB/EFA: typically half the throughput or worse


@dataclass(frozen=True)
class Evidence:
    """One finding: what was seen, what it likely costs (share of throughput), how to fix it."""

    kind: str
    cost: float  # estimated share of throughput lost, 0..1 (ranking only)
    finding: str
    fix: str
    fault: bool = False  # a hardware fault seen (XID, ECC, NIC errors): first, whatever its cost

    def __str__(self) -> str:
        what = "a fault" if self.fault and not self.cost else f"~{100 * self.cost:.0f}% of throughput"
        return f"[{self.kind}, {what}] {self.finding}\n    fix: {self.fix}"


@dataclass
class Explanation:
    """Measured vs expected MFU and the evidence, most costly first."""

    measured_mfu: float | None
    expected_mfu: float | None
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def causes(self) -> list[str]:
        return [e.kind for e in self.evidence]

    def render(self) -> str:
        def pct(x: float | None) -> str:
            return "unknown" if x is None else f"{100 * x:.1f}%"

        head = f"MFU measured {pct(self.measured_mfu)}, planner expects {pct(self.expected_mfu)}"
        if self.measured_mfu and self.expected_mfu:
            head += f" ({self.measured_mfu / self.expected_mfu:.2f} of expected)"
        body = [str(e) for e in self.evidence] or ["no evidence of a known cause in the log"]
        return "\n".join([head, *body, *(f"note: {n}" for n in self.notes)])

    def table(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            [
                {"cause": e.kind, "cost_pct": round(100 * e.cost, 1), "finding": e.finding, "fix": e.fix}
                for e in self.evidence
            ],
            columns=["cause", "cost_pct", "finding", "fix"],
        )


def expects_fabric(profile: str | None, on_gpus: bool = True) -> bool:
    """Whether NCCL should find InfiniBand/EFA: the run's profile says (``Profile.fabric``; ``generic`` and
    ``local-cpu`` name none); a run of no known profile is expected to have one when it runs on GPUs."""
    from cookbook.spec import profiles

    known = profiles()
    if profile in known:
        return known[profile].fabric is not None
    return on_gpus


# ------------------------------------------------------------------------------------------ checks
def check_nccl(text: str, nodes: int | None, expects_fabric: bool) -> list[Evidence]:
    """NCCL's transport from its ``NCCL_DEBUG=INFO`` lines."""
    out = []
    socket = NCCL_SOCKET.search(text)
    fabric = NCCL_FABRIC.search(text)
    multi = nodes is None or nodes > 1
    if socket and not fabric and multi and expects_fabric:
        line = next(ln for ln in text.split("\n") if NCCL_SOCKET.search(ln))
        out.append(
            Evidence(
                "nccl_socket",
                SOCKET_COST,
                f"NCCL runs over TCP sockets, not InfiniBand/EFA: `{line.strip()}`",
                "load the fabric: on AWS (EFA) install aws-ofi-nccl and set FI_PROVIDER=efa (the aws-efa "
                "profile); on InfiniBand check `ibstat`, NCCL_IB_HCA and that /dev/infiniband is in the "
                "container; set NCCL_SOCKET_IFNAME only for the bootstrap interface",
            )
        )
    if NCCL_NO_PLUGIN.search(text) and not fabric and multi and expects_fabric:
        out.append(
            Evidence(
                "nccl_plugin_missing",
                SOCKET_COST * 0.9,
                "NCCL found no network plugin (libnccl-net.so): the EFA/OFI plugin is not loaded"
                + (" and no InfiniBand device was found" if NCCL_IB_NONE.search(text) else ""),
                "put aws-ofi-nccl's lib folder on LD_LIBRARY_PATH (or NCCL_NET_PLUGIN) on every node",
            )
        )
    return out


def check_stalls(steps: pd.DataFrame, saves: Sequence[Sequence[tuple[datetime, float]]] = ()) -> list[Evidence]:
    """Data-loader stalls: steps far above the median step. Step times are taken within one start of the job
    (``start``, :mod:`cookbook.analysis.starts`): the gap of a requeue is no step, nor is a start's start-up,
    nor a step whose time holds a checkpoint save (``saves``: each start's, from
    :func:`cookbook.analysis.goodput.saves_by_start`; the goodput ledger counts that time as checkpointing)."""
    if "time" not in steps or steps["time"].isna().all():
        return []
    from cookbook.analysis.starts import after_startup, step_seconds

    s = steps.sort_values(["start", "step"] if "start" in steps else "step", kind="stable")
    # not each start's first two steps (warm-up, compilation), nor a step that waited for a save
    steady = after_startup(s, 2) & ~_holds_a_save(s, saves)
    dt = step_seconds(s)[steady].dropna()
    med = dt.median()
    spikes = dt[dt > STALL_FACTOR * med]
    if len(dt) < 3 or med <= 0 or len(spikes) == 0:
        return []
    cv = float(dt.std() / dt.mean()) if dt.mean() else 0.0
    return [
        Evidence(
            "dataloader_stall",
            float((spikes - med).sum() / dt.sum()),
            f"{len(spikes)} of {len(dt)} steps took over {STALL_FACTOR:g}x the median step ({med:.2f} s; "
            f"longest {spikes.max():.2f} s; step-time variation {100 * cv:.0f}%): the GPUs waited for data",
            "raise the data loader's workers (num_workers) and prefetch, give each task more CPUs "
            "(--cpus-per-task), pre-tokenize/pack the dataset onto local or shared fast storage",
        )
    ]


def _holds_a_save(steps: pd.DataFrame, saves: Sequence[Sequence[tuple[datetime, float]]]) -> pd.Series:
    """For each row of ``steps`` (sorted by start and step): whether a save of its start finished between the
    previous step line of that start and its own."""
    import numpy as np
    import pandas as pd

    from cookbook.analysis.starts import start_of

    held = pd.Series(False, index=steps.index)
    t = pd.to_datetime(steps["time"])
    start = start_of(steps)
    for i, logged in enumerate(saves):
        rows = start == i
        if not logged or not rows.any():
            continue
        at = np.sort(pd.to_datetime([when for when, _ in logged]).to_numpy())
        end, begin = t[rows].to_numpy(), t[rows].shift(1).to_numpy()
        after_end = np.searchsorted(at, end, side="right")  # saves finished by this step line
        before = np.where(pd.isna(begin), 0, np.searchsorted(at, begin, side="right"))
        held[rows] = ((after_end - before) > 0) & ~pd.isna(end)
    return held


def check_gpus_per_node(gpus_per_node: int | None, node_gpus: int | None) -> list[Evidence]:
    if not gpus_per_node or not node_gpus or gpus_per_node >= node_gpus:
        return []
    return [
        Evidence(
            "gpus_per_node",
            1 - gpus_per_node / node_gpus,
            f"the job uses {gpus_per_node} of the node's {node_gpus} GPUs",
            f"--gpus-per-node={node_gpus} (same nodes, more GPUs), or fewer nodes with all GPUs each",
        )
    ]


def check_cpu_binding(script_text: str | None, procs_per_node: int | None) -> list[Evidence]:
    """All ranks of a node on one core: no --cpus-per-task with several processes per node."""
    if not script_text or not procs_per_node or procs_per_node < 2:
        return []
    if re.search(r"^#SBATCH --cpus-per-task=\d+", script_text, flags=re.M):
        return []
    return [
        Evidence(
            "cpu_binding",
            0.2,
            f"{procs_per_node} processes per node share the CPUs of a task without --cpus-per-task "
            "(Slurm may bind them all to one core): data loading and kernel launches starve",
            "#SBATCH --cpus-per-task=<cores per node> (the generated scripts set it from the profile)",
        )
    ]


def check_checkpointing(
    text: str, recipe: str | None, gpu: str | None, nodes: int | None, gpus_per_node: int | None, mode: str | None
) -> list[Evidence]:
    """Full activation checkpointing where the planner says selective (or none) fits with 10% to spare."""
    if mode is None and (m := AC_APPLIED.search(text)):  # else the log does not say
        mode = "selective" if "select" in m.group(1).lower() else "full"
    if mode != "full" or not (recipe and gpu and nodes and gpus_per_node):
        return []
    from cookbook.planner import plan
    from cookbook.planner.estimate import Settings, recompute_factor

    try:
        lighter = [plan(recipe, nodes, gpus_per_node, gpu, checkpointing=m) for m in ("none", "selective")]
    except (KeyError, ValueError):
        return []
    fits = [p for p in lighter if p.margin_fraction >= 0.10]
    if not fits:
        return []
    best = fits[0].settings.checkpointing
    gain = 1 - recompute_factor(Settings(checkpointing="full")) / recompute_factor(Settings(checkpointing=best))
    return [
        Evidence(
            "activation_checkpointing",
            gain,
            f"full activation checkpointing recomputes the whole forward; the planner says "
            f"AC={best} fits ({fits[0].peak_gib:.0f} of {fits[0].capacity_gib:.0f} GiB)",
            f"set activation checkpointing to {best} (torchtitan activation_checkpoint.mode={best}; "
            "torchtune has only on/off)",
        )
    ]


def check_stragglers(
    log: Path, hosts: Sequence[str] | None, procs_per_node: int | None, telemetry: pd.DataFrame | None = None
) -> list[Evidence]:
    from cookbook.analysis.starts import parse_starts
    from cookbook.analysis.stragglers import stragglers, with_telemetry

    found = with_telemetry(stragglers(parse_starts(log, ranks="all"), hosts, procs_per_node), telemetry)
    return [
        Evidence(
            "straggler",
            max(0.0, min(0.9, s.median_ratio - 1)) if s.median_lag_s <= 0 else 0.1,  # late ranks: a fixed 10%
            str(s),
            "check that node (nvidia-smi -q for clocks/throttling/ECC, `dmesg`), exclude it "
            "(--exclude=HOST) and compare; a rank with a slower data shard points at the data",
        )
        for s in found[:2]
    ]


def check_trace_stragglers(traces: Sequence[str | Path]) -> list[Evidence]:
    """From profiler traces: the rank that waits least in collectives is the one the others wait for."""
    from cookbook.profiling.summarize import summarize

    s = summarize(list(traces))
    if len(s.per_rank) < 2:
        return []
    comm = s.per_rank.set_index("rank")["comm_share"]
    spread = float(comm.max() - comm.min())
    if spread < 0.10:
        return []
    rank = s.straggler_rank
    return [
        Evidence(
            "straggler",
            spread,
            f"rank {rank} waits {100 * comm[rank]:.0f}% of its step in collectives, the others up to "
            f"{100 * comm.max():.0f}%: they wait for rank {rank}",
            "profile that rank's host (clocks, thermal throttling, a noisy neighbour) and exclude it",
        )
    ]


def check_telemetry(telemetry: pd.DataFrame | None) -> list[Evidence]:
    """The nodes' GPU/NIC findings (:mod:`cookbook.metrics.telemetry`). A synchronous job runs at its slowest
    GPU's pace: a throttled GPU costs its share of the run times the clock it lost against its peers."""
    if telemetry is None or telemetry.empty:
        return []
    from cookbook.metrics.telemetry import findings, gpu_rows

    g = gpu_rows(telemetry)
    out = []
    for f in findings(telemetry):
        cost = 0.0
        if f.kind == "throttle":
            mine = g[(g["node"] == f.node) & (g["gpu"] == int(f.device)) & (g["faults"] > 0)]["sm_mhz"].median()
            peers = g[g["faults"] == 0]["sm_mhz"].median()
            cost = f.share * max(0.0, 1 - mine / peers) if peers == peers and peers > 0 else f.share
        out.append(Evidence(f"gpu_{f.kind}", cost, f.finding, f.fix, fault=f.kind != "throttle"))
    return out


def check_recoveries(
    log: str | Path, incidents: Sequence[Incident] | None, attempts: Sequence[Attempt] = ()
) -> list[Evidence]:
    """One fault per recovery of the run, with its parts (:func:`cookbook.analysis.goodput.incident_costs`); the
    spares' standing-by time needs Slurm's record of the starts (``attempts``)."""
    if not incidents:
        return []
    from cookbook.analysis.goodput import incident_costs, log_segments

    fixes = {
        "spare": "a spare took its place: check the node (`sinfo -R`, `scontrol show node`) before it serves "
        "again; more --spare-nodes if faults recur",
        "requeue-excluding": "the job was requeued without the node: check it before it serves again",
        "requeue-later": "the recovery budget was spent, so the job was requeued to start by itself once the window "
        "allows a recovery again (`scontrol update JobId=JOB StartTime=now` starts it at once): check the node, and "
        "raise COOKBOOK_MAX_RETRIES (recoveries per hour) if such faults are routine here",
    }
    return [
        Evidence("node_fault", 0.0, c.line("node"), fixes.get(c.incident.action, "check the node"), fault=True)
        for c in incident_costs(incidents, log_segments(log), attempts)
        if c.incident.action != "train-on-gate"  # logged, but it cost the job nothing
    ]


def check_scaling(measured_tps: float | None, baseline_tps: float | None, nodes: int | None) -> list[Evidence]:
    if not measured_tps or not baseline_tps or not nodes or nodes < 2:
        return []
    eff = measured_tps / baseline_tps
    if eff >= 0.9:
        return []
    return [
        Evidence(
            "scaling",
            1 - eff,
            f"{nodes} nodes give {eff:.2f} of the 1-node run's tokens/s per GPU "
            f"({measured_tps:,.0f} vs {baseline_tps:,.0f}): communication between nodes dominates",
            "check the NCCL transport (above), raise the per-GPU batch, use HSDP "
            "(shard within a node, replicate across nodes)",
        )
    ]


# ------------------------------------------------------------------------------------------ the report
def _median_after_warmup(df: pd.DataFrame, column: str) -> float | None:
    """The median of ``column`` without the first two steps of each start (warm-up), where 3+ steps remain."""
    if column not in df or df[column].dropna().empty:
        return None
    from cookbook.analysis.starts import after_startup

    d = df.dropna(subset=[column]).sort_values(["start", "step"] if "start" in df else "step", kind="stable")
    steady = d.loc[after_startup(d, 2), column]
    v = float((steady if len(steady) > 2 else d[column]).median())
    return v if v > 0 else None


def explain_log(
    log: str | Path,
    *,
    recipe: str | None = None,
    gpu: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    node_gpus: int | None = None,
    expects_fabric: bool = True,
    script: str | Path | None = None,
    procs_per_node: int | None = None,
    checkpointing: str | None = None,
    baseline_log: str | Path | None = None,
    hosts: Sequence[str] | None = None,
    traces: Sequence[str | Path] | None = None,
    telemetry: pd.DataFrame | None = None,
    incidents: Sequence[Incident] | None = None,
    attempts: Sequence[Attempt] = (),
) -> Explanation:
    """Explain a run's efficiency from its log (plus whatever else is known about it)."""
    from cookbook.analysis.goodput import saves_by_start
    from cookbook.analysis.starts import parse_starts
    from cookbook.metrics import parse_log

    log = Path(log)
    text = _ANSI.sub("", log.read_text(errors="replace"))
    df = parse_starts(log)  # the rows of each start of the job apart
    train = df[df["split"] == "train"] if "split" in df and len(df) else df
    notes: list[str] = []
    measured = _median_after_warmup(train, "mfu_pct")
    measured = None if measured is None else measured / 100
    tps = _median_after_warmup(train, "tokens_per_second_per_gpu")
    expected = None
    if recipe and gpu and nodes and gpus_per_node:
        expected, measured = _planned_mfu(recipe, gpu, nodes, gpus_per_node, checkpointing, measured, tps, notes)
    script_text = Path(script).read_text() if script and Path(script).exists() else None
    evidence = [
        *check_nccl(text, nodes, expects_fabric),
        *check_stalls(train, saves_by_start(text)),
        *check_gpus_per_node(gpus_per_node, node_gpus),
        *check_cpu_binding(script_text, procs_per_node),
        *check_checkpointing(text, recipe, gpu, nodes, gpus_per_node, checkpointing),
        *check_stragglers(log, hosts, procs_per_node or None, telemetry),
    ]
    evidence += check_telemetry(telemetry) + check_recoveries(log, incidents, attempts)
    if traces:
        evidence += check_trace_stragglers(traces)
    if baseline_log is not None:
        base_tps = _median_after_warmup(parse_log(baseline_log), "tokens_per_second_per_gpu")
        evidence += check_scaling(tps, base_tps, nodes)
    return Explanation(measured, expected, sorted(evidence, key=lambda e: (not e.fault, -e.cost)), notes)


def _planned_mfu(
    recipe: str,
    gpu: str,
    nodes: int,
    gpus_per_node: int,
    checkpointing: str | None,
    measured: float | None,
    tps: float | None,
    notes: list[str],
) -> tuple[float | None, float | None]:
    """The planner's MFU for the job, and the measured one (from tokens/s when the log has no MFU); notes why not."""
    from cookbook.planner import plan

    expected = None
    try:
        settings: dict[str, Any] = {"checkpointing": checkpointing} if checkpointing else {}
        p = plan(recipe, nodes, gpus_per_node, gpu, **settings)
        expected = p.mfu
        if measured is None and tps:
            from cookbook.planner.estimate import flops_per_token

            measured = tps * flops_per_token(p.model, p.settings) / (p.gpu.peak_bf16_tflops * 1e12)
            notes.append("measured MFU from the log's tokens/s and the planner's FLOPs per token")
    except (KeyError, ValueError) as e:
        notes.append(f"no planner expectation: {e}")
    return expected, measured


def explain_plot(explanation: Explanation) -> Any:
    """Bar chart of the evidence by estimated cost (for a notebook cell); returns the figure."""
    import matplotlib.pyplot as plt

    t = explanation.table()
    fig, ax = plt.subplots(figsize=(6, 0.4 * max(1, len(t)) + 1))
    ax.barh(t["cause"], t["cost_pct"], color="tab:red")
    ax.invert_yaxis()
    m, e = explanation.measured_mfu, explanation.expected_mfu
    ax.set(
        xlabel="estimated % of throughput lost",
        title="MFU " + (f"{100 * m:.1f}%" if m else "?") + " vs planner " + (f"{100 * e:.1f}%" if e else "?"),
    )
    fig.tight_layout()
    return fig
