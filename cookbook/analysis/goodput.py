"""Goodput ledger: where the allocated GPU-hours of a run went, across all its requeues.

Inputs: Slurm accounting (``sacct -D``, or the job-completion log with ``sacct -c`` where there is no
slurmdbd: one record per start of the job, a requeued job keeping its id) and the job's log, split at
each start of the batch script (the generated scripts print ``job ID: N node(s) ...`` first; one
definition of a start: :mod:`cookbook.analysis.starts`). Inside each allocation window the log's
timestamps split the time into:

- ``preflight``: allocation start to the first framework log line (script, srun, torchrun, imports);
- ``startup``: first log line to "Training starts" (model build, data loader), less ``restore``;
- ``restore``: loading the checkpoint (the framework's own "Finished loading ... in X seconds");
- ``productive``: steps run for the first time; ``redone``: steps run again after a resume;
- ``checkpoint``: checkpoint saves ("Finished saving the checkpoint in X seconds");
- ``lost``: after the last finished step of an interrupted start (partial step, kill): failure downtime;
- ``shutdown``: after the last step of the final start (teardown);
- ``untimed``: a start whose log has no timestamps (torchtune's progress bar) -- counted, not split;
- ``spare``: the nodes of the allocation that do not train (``--spare-nodes``: the spares standing by, then
  the node a spare replaced); its wall time overlaps the other parts', its GPU-hours do not.

A recovery inside the allocation (issue #40: a spare swapped in, the ranks relaunched in the same job) is a
new start in the log within the same Slurm start: the window is cut at the runtime's decision (the rows of
``RUN_DIR/.cookbook/recoveries.tsv``, :class:`cookbook_runtime.decide.Incident`), so the time from the fault to
the decision is ``lost`` and the relaunch is the next start's ``preflight``/``startup``/``restore``. Each
incident is also one line of its own (:class:`IncidentCost`): detection, stop/decide, relaunch + restore, the
steps redone and how long its spares stood by.

``queue`` (waiting before each start) is wall time but not allocated: it costs no GPU-hours.
The parts of each window add up to the window by construction; Slurm's times have 1 s resolution.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cookbook_runtime.decide import Incident

if TYPE_CHECKING:
    import pandas as pd

    from cookbook.slurm.client import SlurmClient

ALLOCATED_PARTS: tuple[str, ...] = (
    "preflight",
    "startup",
    "restore",
    "productive",
    "redone",
    "checkpoint",
    "lost",
    "shutdown",
    "untimed",
    "spare",
)
RELAUNCHES = ("spare", "train-on")  # recoveries that launch the ranks again in the same Slurm start
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_TIME = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - \S+ - \w+ - (.*)$")
_TRAIN_START = re.compile(r"Training starts at step (\d+)")
_SAVED = re.compile(r"Finished saving the checkpoint in ([\d.]+) ?s|Last step checkpoint completed in ([\d.]+) ?s")
_LOADED = re.compile(r"Finished loading the checkpoint in ([\d.]+) ?s")


def price_per_gpu_hour(gpu: str | None, override: float | None = None, profile: str | None = None) -> float:
    """The price used for costs: ``override`` if given, else the run's profile's price (its own, or the list
    price of ``gpu`` or of the profile's GPU kind, :meth:`cookbook.spec.Profile.gpu_hour_price`), else the
    list price of ``gpu`` (:data:`cookbook.gpus.LIST_PRICE_PER_GPU_HOUR`); 0 if none is known."""
    if override is not None:
        return float(override)
    from cookbook.spec import profiles

    known = profiles()
    if profile in known:
        price = known[profile].gpu_hour_price(gpu)
    else:
        from cookbook.gpus import list_price_per_gpu_hour

        price = list_price_per_gpu_hour(gpu) if gpu else None
    return price or 0.0


@dataclass(frozen=True)
class Attempt:
    """One start of a Slurm job (a requeued job has several, all with the same job id)."""

    start: datetime
    end: datetime
    state: str
    nodes: int
    gpus: int = 0  # accelerators in the allocation (0: none, e.g. the local CPU cluster)
    submit: datetime | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def units(self) -> int:
        """What the allocation is billed in: GPUs, or nodes when it has none."""
        return self.gpus or self.nodes


def _slurm_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        return None  # Unknown, None, empty


def _gpus_from_tres(tres: str, nodes: int) -> int:
    m = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", tres)
    return int(m.group(1)) if m else 0


def parse_accounting(text: str, job_id: str, now: datetime | None = None) -> list[Attempt]:
    """``sacct -D -P -n -o JobID,State,Submit,Start,End,NNodes,AllocTRES`` text -> one Attempt per start."""
    out = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < 6 or cols[0] != job_id:
            continue
        start = _slurm_time(cols[3])
        if start is None or cols[5] == "0":
            continue  # never started, or the job-completion log's record (0 nodes) of a requeue of a finished job
        end = _slurm_time(cols[4]) or now or datetime.now()
        nodes = int(cols[5]) if cols[5].isdigit() else 1
        tres = cols[6] if len(cols) > 6 else ""
        out.append(Attempt(start, end, cols[1].split()[0], nodes, _gpus_from_tres(tres, nodes), _slurm_time(cols[2])))
    return sorted(out, key=lambda a: a.start)


def slurm_attempts(client: SlurmClient, job_id: str) -> list[Attempt]:
    """Every start of ``job_id`` from sacct (slurmdbd), else from the job-completion log (``sacct -c``)."""
    fields = "JobID,State,Submit,Start,End,NNodes,AllocTRES"
    for flags in (["-X"], ["-c"]):
        try:
            r = client.run("sacct", *flags, "-D", "-P", "-n", "-j", job_id, "-o", fields, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        attempts = parse_accounting(r.stdout, job_id) if r.returncode == 0 else []
        if attempts:
            return attempts
    return []


# ------------------------------------------------------------------------------------------ the log
@dataclass
class Segment:
    """The log of one start of the batch script."""

    job_id: str | None
    text: str
    nodes: int | None = None  # the nodes that train (the start line's count; the rest of the allocation stands by)
    first_time: datetime | None = None
    train_start: datetime | None = None
    restore_s: float = 0.0
    steps: list[tuple[int, datetime | None]] = field(default_factory=list)  # (step, end time) in order
    saves: list[tuple[datetime, float]] = field(default_factory=list)  # (logged at, seconds)
    gate_s: float | None = None  # the pre-flight gate's seconds at this start (None: no gate ran)
    gate_local: bool = False  # its nodes' own checks only: they passed the whole gate in this job recently


def _titan_events(seg: Segment) -> None:
    for line in seg.text.splitlines():
        m = _TITAN_TIME.search(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") + timedelta(milliseconds=int(m.group(2)))
        msg = m.group(3)
        if seg.first_time is None:
            seg.first_time = t
        if seg.train_start is None and _TRAIN_START.search(msg):
            seg.train_start = t
        if s := _LOADED.search(msg):
            seg.restore_s = max(seg.restore_s, float(s.group(1)))
        if s := _SAVED.search(msg):
            secs = float(s.group(1) or s.group(2))
            # every rank reports the same save: reports within one save's duration (or 1 s) are one save,
            # counted at its slowest rank's figure
            if seg.saves and (t - seg.saves[-1][0]).total_seconds() < max(1.0, secs, seg.saves[-1][1]):
                seg.saves[-1] = (seg.saves[-1][0], max(secs, seg.saves[-1][1]))
            else:
                seg.saves.append((t, secs))


def _gate_events(seg: Segment) -> None:
    """The gate's seconds at this start, and whether it ran its nodes' own checks only (the restart shortcut)."""
    from cookbook_runtime.files import GATE_SHORTCUT, NODE_LINES

    if took := NODE_LINES["preflight_time"].search(seg.text):
        seg.gate_s = float(took.group("rest").split()[0])
        seg.gate_local = GATE_SHORTCUT.search(seg.text) is not None


def saves_by_start(text: str) -> list[list[tuple[datetime, float]]]:
    """The checkpoint saves each start of the batch script logged, as (finished at, seconds), in the order of
    :func:`cookbook.analysis.starts.split_starts`: a step whose time holds one is a save, not a steady step."""
    from cookbook.analysis.starts import split_starts

    out = []
    for job_id, part in split_starts(_ANSI.sub("", text)):
        seg = Segment(job_id, part)
        _titan_events(seg)
        out.append(seg.saves)
    return out


def log_segments(log: str | Path) -> list[Segment]:
    """The log split at each start of the batch script (:func:`cookbook.analysis.starts.split_starts`), with
    step end times and framework events."""
    from cookbook.analysis.starts import split_starts
    from cookbook.metrics import parse_text
    from cookbook_runtime.files import START

    segments = []
    for job_id, part in split_starts(_ANSI.sub("", Path(log).read_text(errors="replace"))):
        line = START.search(part)
        seg = Segment(job_id, part, int(line.group(2)) if line else None)
        _titan_events(seg)
        _gate_events(seg)
        df = parse_text(seg.text)
        if len(df):
            df = df[df["split"] == "train"] if "split" in df else df
            times = df["time"] if "time" in df else [None] * len(df)
            for step, t in zip(df["step"], times):
                ok = t is not None and not (hasattr(t, "value") and str(t) == "NaT")
                seg.steps.append((int(step), t.to_pydatetime() if ok and hasattr(t, "to_pydatetime") else None))
        segments.append(seg)
    return segments


# ------------------------------------------------------------------------------------------ recoveries
def _at(epoch: float) -> datetime:
    """An epoch time as the log's and Slurm's naive local times."""
    return datetime.fromtimestamp(epoch)


def _s(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f} s"


@dataclass(frozen=True)
class IncidentCost:
    """One recovery of the run (a row of ``recoveries.tsv``) and what it cost, from the row and the log."""

    incident: Incident
    detection_s: float | None  # the fault seen -> the ranks' step ended
    decide_s: float | None  # the step ended -> the runtime's decision
    relaunch_s: float | None  # the decision -> the first step logged after it (relaunch + restore)
    redone: tuple[int, ...] = ()  # steps logged after it that had been logged before it
    spare_unit_s: float = 0.0  # its spares stood by from the allocation's start until swapped in (GPU/node-s)

    @property
    def to_first_step_s(self) -> float | None:
        """The fault to the first new step: the three parts together (None where one is unknown)."""
        parts = (self.detection_s, self.decide_s, self.relaunch_s)
        return None if None in parts else sum(p for p in parts if p is not None)

    def line(self, unit: str = "GPU") -> str:
        i = self.incident
        what = f"spare {','.join(i.spares)} swapped in" if i.action == "spare" else i.action
        head = f"{_at(i.when):%Y-%m-%d %H:%M:%S} job {i.job}: {','.join(i.nodes) or '?'} ({i.reason}) -> {what}"
        took = self.to_first_step_s
        out = (f"{head}: {_s(took)} to the first new step (detection {_s(self.detection_s)}, stop/decide "
               f"{_s(self.decide_s)}, relaunch + restore {_s(self.relaunch_s)}); "
               f"{len(self.redone)} step(s) redone")  # fmt: skip
        out += f" ({', '.join(map(str, self.redone))})" if self.redone else ""
        if self.spare_unit_s:
            out += f"; the spare(s) stood by {self.spare_unit_s / 3600:.3g} {unit}-hours before"
        return out


def read_incidents(run_dir: str | Path | None, job_id: str | None = None) -> list[Incident]:
    """The rows of ``RUN_DIR/.cookbook/recoveries.tsv`` (of ``job_id`` only, when given), oldest first."""
    from cookbook_runtime.decide import parse_incidents
    from cookbook_runtime.files import recoveries

    if run_dir is None:
        return []
    try:
        rows = parse_incidents(recoveries(run_dir).read_text())
    except OSError:
        return []
    return sorted((i for i in rows if job_id is None or i.job == job_id), key=lambda i: i.when)


def _by_attempt(
    segments: Sequence[Segment], attempts: Sequence[Attempt], incidents: Sequence[Incident]
) -> list[list[tuple[Segment, datetime | None]]]:
    """The log's starts within each Slurm start, each with when it began (None: the allocation's start): a
    relaunch inside the allocation begins at its recovery's decision. Without those, matched one to one."""
    relaunches = [_at(i.when) for i in incidents if i.action in RELAUNCHES and i.ended_at > 0]
    inside = [[t for t in relaunches if a.start <= t <= a.end] for a in attempts]
    if relaunches and len(segments) == len(attempts) + sum(map(len, inside)):
        it = iter(segments)
        return [[(next(it), None)] + [(next(it), t) for t in cuts] for cuts in inside]
    return [[(segments[i], None)] if i < len(segments) else [] for i in range(len(attempts))]


def incident_costs(
    incidents: Sequence[Incident], segments: Sequence[Segment], attempts: Sequence[Attempt]
) -> list[IncidentCost]:
    """Each recovery's parts: detection and stop/decide from its row, relaunch + restore to the first step the
    log timed after its decision, the steps that start logged again, and its spares' standing-by time."""
    timed = [(k, next((t for _, t in s.steps if t is not None), None)) for k, s in enumerate(segments)]
    restarts = [i for i in incidents if i.action not in ("train-on-gate", "stop")]
    out = []
    for inc in incidents:
        when = _at(inc.when)
        k, first = next(((k, t) for k, t in timed if t is not None and t > when), (None, None))
        if k is None and not any(t for _, t in timed) and inc in restarts and len(segments) == len(restarts) + 1:
            k = restarts.index(inc) + 1  # a log without timestamps: the starts in the recoveries' order
        before = {step for s in segments[:k] for step, _ in s.steps} if k is not None else set()
        redone = tuple(sorted(before & {step for step, _ in segments[k].steps})) if k is not None else ()
        spare = 0.0
        att = next((a for a in attempts if a.start <= when <= a.end), None)
        if inc.action == "spare" and att is not None:
            spare = len(inc.spares) * att.units / max(1, att.nodes) * (when - att.start).total_seconds()
        out.append(
            IncidentCost(
                inc,
                inc.ended_at - inc.fault_at if inc.ended_at and inc.fault_at else None,
                inc.when - inc.ended_at if inc.ended_at else None,
                (first - when).total_seconds() if first is not None else None,
                redone,
                spare,
            )
        )
    return out


# ------------------------------------------------------------------------------------------ the ledger
@dataclass
class Ledger:
    """Wall and GPU time of a run by part, with goodput and cost."""

    parts_s: dict[str, float]  # wall seconds per allocated part (summed over starts)
    parts_unit_s: dict[str, float]  # the same weighted by the allocation's GPUs (or nodes)
    queue_s: float
    attempts: list[Attempt]
    steps_done: int
    steps_redone: int
    redone_steps: list[int]
    unit: str = "GPU"
    price: float = 0.0
    forecast_productive_s: float | None = None
    notes: list[str] = field(default_factory=list)
    gpus: dict[str, float] | None = None  # what the GPUs did meanwhile (the nodes' telemetry): clock, power, kWh
    incidents: list[IncidentCost] = field(default_factory=list)  # the recoveries (recoveries.tsv), oldest first
    gates: list[tuple[float, bool]] = field(default_factory=list)  # each start's gate: (seconds, own checks only)

    @property
    def allocated_s(self) -> float:
        return sum(a.seconds for a in self.attempts)

    @property
    def allocated_unit_hours(self) -> float:
        return sum(a.seconds * a.units for a in self.attempts) / 3600

    @property
    def goodput(self) -> float:
        """Productive GPU-time / allocated GPU-time."""
        total = sum(self.parts_unit_s.values())
        return self.parts_unit_s.get("productive", 0.0) / total if total else 0.0

    @property
    def cost(self) -> float:
        return self.allocated_unit_hours * self.price

    def table(self) -> pd.DataFrame:
        """One row per part: wall seconds, share of the allocation, GPU-hours, cost."""
        import pandas as pd

        total = sum(self.parts_unit_s.values()) or 1.0
        rows = [
            {
                "part": "queue",
                "wall_s": round(self.queue_s, 1),
                "share_pct": None,
                f"{self.unit}_hours": 0.0,
                "cost": 0.0,
            }
        ]
        for name in ALLOCATED_PARTS:
            if name not in self.parts_s:
                continue
            hours = self.parts_unit_s[name] / 3600
            rows.append(
                {
                    "part": name,
                    "wall_s": round(self.parts_s[name], 1),
                    "share_pct": round(100 * self.parts_unit_s[name] / total, 1),
                    f"{self.unit}_hours": hours,
                    "cost": round(hours * self.price, 2),
                }
            )
        return pd.DataFrame(rows)

    def render(self) -> str:
        t = self.table()
        lines = [
            f"{len(self.attempts)} start(s), {self.allocated_s:.0f} s allocated, "
            f"{self.allocated_unit_hours:.3f} {self.unit}-hours, cost {self.cost:,.2f} "
            f"(at {self.price:g} per {self.unit}-hour); goodput {100 * self.goodput:.1f}%",
            f"steps: {self.steps_done} done, {self.steps_redone} redone after a resume"
            + (f" ({', '.join(map(str, self.redone_steps))})" if self.redone_steps else ""),
            t.to_string(index=False),
        ]
        if self.forecast_productive_s is not None:
            prod = self.parts_s.get("productive", 0.0)
            lines.append(
                f"planner forecast for these steps: {self.forecast_productive_s:.0f} s productive "
                f"(measured {prod:.0f} s, x{prod / self.forecast_productive_s:.2f})"
            )
        if self.gpus:
            g = self.gpus
            lines.append(
                f"the GPUs meanwhile: {g['gpus']:.0f} sampled, mean SM clock {g['mean_sm_mhz']:,.0f} MHz, "
                f"mean power {g['mean_power_w']:.0f} W, energy {g['energy_kwh']:.3g} kWh"
            )
        if self.gates:
            each = [f"{s:.0f} s ({'own checks only' if local else 'full'})" for s, local in self.gates]
            lines.append(f"pre-flight gate per start: {', '.join(each)}")
        if self.incidents:
            lines.append(f"recoveries ({len(self.incidents)}):")
            lines += [f"  {c.line(self.unit)}" for c in self.incidents]
        if self.parts_s.get("spare"):
            lines.append("spare: nodes that stood by (spares, then the nodes they replaced) while the others ran")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def recoveries_table(self) -> pd.DataFrame:
        """One row per recovery: when, nodes, reason, action, the seconds of each part, the steps redone."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "when": _at(c.incident.when),
                    "job": c.incident.job,
                    "nodes": ",".join(c.incident.nodes),
                    "reason": c.incident.reason,
                    "action": c.incident.action,
                    "spares": ",".join(c.incident.spares),
                    "detection_s": c.detection_s,
                    "stop_decide_s": c.decide_s,
                    "relaunch_restore_s": c.relaunch_s,
                    "to_first_step_s": c.to_first_step_s,
                    "steps_redone": len(c.redone),
                    f"spare_{self.unit}_hours": c.spare_unit_s / 3600,
                }
                for c in self.incidents
            ]
        )

    def plot(self, ax: Any = None) -> Any:
        """A horizontal bar per part (GPU-hours), goodput in the title; returns the matplotlib figure."""
        import matplotlib.pyplot as plt

        t = self.table()
        t = t[t["part"] != "queue"]
        if ax is None:
            fig, ax = plt.subplots(figsize=(7, 0.35 * len(t) + 1.2))
        else:
            fig = ax.figure
        colours = {"productive": "tab:green", "redone": "tab:red", "lost": "tab:red", "checkpoint": "tab:blue"}
        ax.barh(t["part"], t[f"{self.unit}_hours"], color=[colours.get(p, "tab:gray") for p in t["part"]])
        ax.invert_yaxis()
        ax.set_xlabel(f"{self.unit}-hours")
        ax.set_title(
            f"goodput {100 * self.goodput:.1f}% of {self.allocated_unit_hours:.3f} {self.unit}-hours "
            f"({len(self.attempts)} start(s); queue {self.queue_s:.0f} s)"
        )
        fig.tight_layout()
        return fig


def goodput_ledger(
    log: str | Path,
    attempts: Sequence[Attempt],
    *,
    gpu: str | None = None,
    price: float | None = None,
    forecast_step_s: float | None = None,
    profile: str | None = None,
    incidents: Sequence[Incident] = (),
) -> Ledger:
    """Split each start's allocation window into the parts above, using the log's timestamps.

    ``attempts`` come from :func:`slurm_attempts`; ``forecast_step_s`` (the planner's step time) adds a
    forecast of the productive time for the steps done. The price: :func:`price_per_gpu_hour`.
    ``incidents``: the run's recoveries (:func:`read_incidents`), each a line of the ledger; one inside the
    allocation cuts its Slurm start where the ranks were launched again.
    """
    segments = [s for s in log_segments(log) if s.job_id is not None] or log_segments(log)
    incidents = sorted(incidents, key=lambda i: i.when)
    groups = _by_attempt(segments, attempts, incidents)
    notes: list[str] = []
    if sum(map(len, groups)) != len(segments) or len(segments) < len(attempts):
        notes.append(f"{len(attempts)} start(s) in Slurm's accounting, {len(segments)} in the log: matched in order")
    tally = _Tally()
    for i, att in enumerate(attempts):
        tally.add_attempt(att, groups[i], last=i == len(attempts) - 1)
    parts, unit_parts = tally.parts, tally.unit_parts
    used = {k: v for k, v in parts.items() if v > 0 or k in ("productive", "redone")}
    unit = "GPU" if any(a.gpus for a in attempts) else "node"
    ledger = Ledger(
        {k: parts[k] for k in used},
        {k: unit_parts[k] for k in used},
        _queue_seconds(attempts),
        list(attempts),
        len(tally.done),
        len(tally.redone),
        tally.redone,
        unit,
        price_per_gpu_hour(gpu, price, profile),
        None,
        notes,
        incidents=incident_costs(incidents, segments, attempts),
        gates=[(s.gate_s, s.gate_local) for s in segments if s.gate_s is not None],
    )
    if ledger.price == 0 and price is None and unit == "GPU":
        notes.append("no price known for this GPU kind or profile: pass --price-per-gpu-hour for the cost")
    if forecast_step_s is not None:
        ledger.forecast_productive_s = forecast_step_s * len(tally.done)
    if unit == "node":
        notes.append("the allocation has no GPUs: hours are node-hours")
    return ledger


def _queue_seconds(attempts: Sequence[Attempt]) -> float:
    """Wall time waiting: submission to the first start (when known), then each end to the next start."""
    queue = 0.0
    previous_end: datetime | None = None
    for i, att in enumerate(attempts):
        if i == 0 and att.submit is not None:
            queue += max(0.0, (att.start - att.submit).total_seconds())
        elif previous_end is not None:
            queue += max(0.0, (att.start - previous_end).total_seconds())
        previous_end = att.end
    return queue


@dataclass
class _Tally:
    """The ledger's running sums: seconds and unit-seconds per part, the steps done and those redone."""

    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ALLOCATED_PARTS, 0.0))
    unit_parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ALLOCATED_PARTS, 0.0))
    done_before: int = 0
    done: set[int] = field(default_factory=set)
    redone: list[int] = field(default_factory=list)

    def add_attempt(self, att: Attempt, group: Sequence[tuple[Segment, datetime | None]], last: bool) -> None:
        """Add one Slurm start, cut into a window per launch of the ranks (a start with no log: one window)."""
        windows: list[tuple[Segment | None, datetime | None]] = [*group] or [(None, None)]
        for j, (seg, begin) in enumerate(windows):
            lo = _clip(begin, att.start, att.end) if begin else att.start
            cut = windows[j + 1][1] if j + 1 < len(windows) else None
            hi = _clip(cut, lo, att.end) if cut else att.end
            final = last and att.state == "COMPLETED" and j == len(windows) - 1
            self.add_window(att, seg, lo, hi, final)
            if seg is not None:
                self.add_steps(seg)

    def add_window(self, att: Attempt, seg: Segment | None, lo: datetime, hi: datetime, final: bool) -> None:
        """Add one window's parts, weighted by the units that train, and the spares' standing by."""
        training = min(att.nodes, seg.nodes) if seg is not None and seg.nodes else att.nodes
        units = att.units * training / max(1, att.nodes)  # the spares' share stands by
        for name, secs in _split_window(lo, hi, seg, self.done_before, final).items():
            self.parts[name] += secs
            self.unit_parts[name] += secs * units
        if units < att.units:
            self.parts["spare"] += (hi - lo).total_seconds()
            self.unit_parts["spare"] += (hi - lo).total_seconds() * (att.units - units)

    def add_steps(self, seg: Segment) -> None:
        """Count a start's steps: each one done, those at or below the last step done before it redone."""
        for step, _ in seg.steps:
            if step <= self.done_before:
                self.redone.append(step)
            self.done.add(step)
        self.done_before = max([self.done_before] + [s for s, _ in seg.steps])


def _clip(t: datetime, lo: datetime, hi: datetime) -> datetime:
    return min(max(t, lo), hi)


def _split_window(lo: datetime, hi: datetime, seg: Segment | None, done_before: int, final: bool) -> dict[str, float]:
    """Seconds of one window (a Slurm start, or the part of it one launch of the ranks had) by part; they add
    up to the window."""
    window = max(0.0, (hi - lo).total_seconds())
    out = {p: 0.0 for p in ALLOCATED_PARTS}
    steps = [(step, t) for step, t in seg.steps if t is not None] if seg is not None else []
    if seg is None or seg.first_time is None or len(steps) < len(seg.steps):  # not every step has a time
        out["untimed"] = window
        return out
    first = _clip(seg.first_time, lo, hi)
    out["preflight"] = (first - lo).total_seconds()
    cursor = first
    begin = _clip(seg.train_start, lo, hi) if seg.train_start is not None else first
    restore = min(seg.restore_s, (begin - cursor).total_seconds())
    out["restore"] = restore
    out["startup"] = (begin - cursor).total_seconds() - restore
    cursor = begin
    saves = sorted(seg.saves)
    for step, end in steps:
        t = _clip(end, lo, hi)
        if t <= cursor:
            continue
        span = (t - cursor).total_seconds()
        saved = min(span, sum(s for when, s in saves if cursor < when <= t and when < t))
        out["checkpoint"] += saved
        out["redone" if step <= done_before else "productive"] += span - saved
        cursor = t
    tail = (hi - cursor).total_seconds()
    saved = min(tail, sum(s for when, s in saves if when >= cursor))
    out["checkpoint"] += saved
    out["shutdown" if final else "lost"] += tail - saved
    assert abs(sum(out.values()) - window) < 1e-6, (out, window)
    return out


# ------------------------------------------------------------------------------------------ a run
@dataclass(frozen=True)
class RunRef:
    """What the ledger and the explainer need to know about a run: job id, log, recipe and shape."""

    job_id: str | None
    log: Path
    recipe: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    profile: str | None = None  # the cluster profile it was rendered for (job.json), for price and fabric
    run_dir: Path | None = None  # its RUN_DIR (job.json): the nodes' telemetry is under it


def _sbatch_int(script: Path, option: str) -> int | None:
    try:
        m = re.search(rf"^#SBATCH --{option}=(\d+)", script.read_text(), flags=re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def resolve_run(target: str, log: str | None = None, client: SlurmClient | None = None) -> RunRef:
    """``target`` is a run folder (with ``job.json`` from ``submit``), a log file, or a Slurm job id.

    Raises ``FileNotFoundError``/``ValueError`` with a message fit for the user.
    """
    p = Path(target)
    if p.is_dir() or p.name == "job.json":
        from cookbook.slurm.record import JOB_FILE, JobRecord

        if not (p if p.is_file() else p / JOB_FILE).exists():
            raise FileNotFoundError(f"{target}: no {JOB_FILE} here (a folder made by `submit`), nor a log")
        job = JobRecord.load(p)
        return RunRef(
            job.job_id,
            Path(log) if log else job.log,
            job.recipe,
            _sbatch_int(job.script, "nodes"),
            _sbatch_int(job.script, "gpus-per-node"),
            job.profile or None,
            job.run_dir,
        )
    if p.is_file():
        m = re.search(r"-(\d+)\.out$", p.name)
        return RunRef(m.group(1) if m else None, p)
    if target.isdigit():
        if log:
            return RunRef(target, Path(log))
        from cookbook.slurm.client import SlurmClient

        out = (client or SlurmClient()).output_path(target)
        if out is None:
            raise ValueError(f"Slurm no longer knows job {target}'s output file: pass --log LOG")
        return RunRef(target, out)
    raise FileNotFoundError(f"{target}: not a run folder, a log file or a job id")


def planned_step_seconds(
    recipe: str | None, nodes: int | None, gpus_per_node: int | None, gpu: str | None
) -> float | None:
    """The planner's step time for the recipe's default settings on this shape (None if it cannot say)."""
    if not (recipe and nodes and gpus_per_node and gpu):
        return None
    try:
        from cookbook.planner import plan

        return plan(recipe, nodes, gpus_per_node, gpu).step_time_s
    except (KeyError, ValueError):
        return None


def _said(client: SlurmClient, ref: RunRef) -> str:
    """What Slurm says of a job no record shows started (its state, or why it does not know it); the controller
    not answering is :class:`~cookbook.slurm.client.SlurmUnreachable`, raised."""
    from cookbook.slurm.client import SlurmError, SlurmUnreachable

    try:
        return f"Slurm says {client.state(str(ref.job_id)).state}"
    except SlurmUnreachable:
        raise
    except SlurmError as e:
        return e.line


def run_ledger(
    ref: RunRef, client: SlurmClient | None = None, gpu: str | None = None, price: float | None = None
) -> Ledger:
    """The ledger of a resolved run: its Slurm starts + its log (+ the planner's forecast when on GPUs).

    ``gpu`` and ``price`` default to the run's profile (its GPU kind and price), see :func:`price_per_gpu_hour`.
    """
    from cookbook.slurm.client import SlurmClient
    from cookbook.spec import profiles

    if ref.job_id is None:
        raise ValueError(f"{ref.log}: cannot tell the job id (name the log JOB-ID.out or pass the job id)")
    client = client or SlurmClient()
    attempts = slurm_attempts(client, ref.job_id)
    if not attempts:
        raise ValueError(
            f"job {ref.job_id}: no start recorded by sacct or the job-completion log ({_said(client, ref)})"
        )
    if not ref.log.exists():
        raise FileNotFoundError(f"{ref.log} does not exist")
    profile = profiles().get(ref.profile or "")
    planned_gpu = gpu or (profile.gpu if profile else None)
    ledger = goodput_ledger(
        ref.log,
        attempts,
        gpu=gpu,
        price=price,
        forecast_step_s=planned_step_seconds(ref.recipe, ref.nodes, ref.gpus_per_node, planned_gpu),
        profile=ref.profile,
        incidents=read_incidents(ref.run_dir, ref.job_id),
    )
    from cookbook.metrics.telemetry import gpu_summary, read_telemetry, telemetry_from_log

    ledger.gpus = gpu_summary(read_telemetry(ref.run_dir) if ref.run_dir else telemetry_from_log(ref.log))
    return ledger
