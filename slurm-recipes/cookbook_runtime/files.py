"""The names of the files a job keeps in its run folder and of the log lines another process reads.

One place: the batch step (:mod:`~cookbook_runtime.run`), the ranks (:mod:`~cookbook_runtime.rank`,
:mod:`~cookbook_runtime.hang`), the gate (:mod:`~cookbook_runtime.nodecheck`) and the cookbook on the login node
(metrics, goodput, ``diagnose``) read these, so a name never has two spellings. Standard library only.

Everything the job keeps lives in ``RUN_DIR/.cookbook/``:

==================================  ==========================================================
``stop``                            a stop asked for (USR1/TERM reached the batch step); ranks poll it
``stop.saved``                      rank 0 wrote its stop-save (one :func:`saved_line`)
``gate-passes.tsv``                 one line per gate every node passed: when, job, nodes, seconds, mode
``recoveries.tsv``                  one line per recovery: when, nodes, why, action, fault and step-end times
``exits/<job>-<restart>.<launch>/``  each node's launcher: how its ranks ended (``<node>.json``), for the culprit
``runs.tsv``                        one line per run: job, restart, nodes, start, end, outcome (NODE_FAIL reads it)
``preflight-<job>.<restart>/``      the gate's reports (``<node>.json``, one a node)
``hang/<job>-<restart>/``           the hang watch's dumps (``HANG``, flight recorder, stacks)
``telemetry/<job>-<restart>/``      each node's GPU and NIC samples, ``<node>.csv`` (:mod:`~cookbook_runtime.telemetry`)
``complete``                        the run finished its training: a new submission does nothing
==================================  ==========================================================

Each node's ranks' output: ``RUN_DIR/torchrun-logs/<job>-<restart>/<node>.log`` (:mod:`~cookbook_runtime.launch`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

STATE = ".cookbook"  # under RUN_DIR
STOP = "stop"
SAVED_SUFFIX = ".saved"
RECOVERIES = "recoveries.tsv"
GATE_PASSES = "gate-passes.tsv"
EXITS = "exits"
EXITS_DIR_ENV = "COOKBOOK_EXITS_DIR"  # where a node's launcher writes how its ranks ended
RUNS = "runs.tsv"
COMPLETE = "complete"
PREFLIGHT = "preflight-"  # + <job>.<restart>
HANG = "hang"
TELEMETRY = "telemetry"
RANK_LOGS = "torchrun-logs"  # under RUN_DIR: each node's ranks' output
RANK_LOGS_ENV = "COOKBOOK_RANK_LOGS_DIR"
STOP_FILE_ENV = "COOKBOOK_STOP_FILE"  # the ranks find the stop flag here
HANG_DIR_ENV = "COOKBOOK_HANG_DIR"
TELEMETRY_DIR_ENV, TELEMETRY_S_ENV = "COOKBOOK_TELEMETRY_DIR", "COOKBOOK_TELEMETRY_S"  # the sampler's folder, interval
LEAD_ENV = "COOKBOOK_STOP_LEAD_S"  # the --signal lead time: how late a stop may be seen and still saved
SAVE_ENV = "COOKBOOK_SAVE_S"  # the model's stop-save time
HANG_TRIGGER = "HANG"  # the file a rank writes when it declares a hang
TRACE_PREFIX = "nccl_trace_rank_"  # = TORCH_FR_DUMP_TEMP_FILE's file part: torch's dumps and ours alike


def state_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / STATE


def recoveries(run_dir: str | os.PathLike[str]) -> Path:
    """The recoveries of the run (:class:`cookbook_runtime.decide.Incident` rows), across its requeues."""
    return state_dir(run_dir) / RECOVERIES


def gate_passes(run_dir: str | os.PathLike[str]) -> Path:
    """The gates this run's nodes passed (a start within a window of one of them checks only locally)."""
    return state_dir(run_dir) / GATE_PASSES


def exits_dir(run_dir: str | os.PathLike[str], job: str, restart: int, launch: int) -> Path:
    return state_dir(run_dir) / EXITS / f"{job}-{restart}.{launch}"


def gate_dir(run_dir: str | os.PathLike[str], job: str, restart: int) -> Path:
    return state_dir(run_dir) / f"{PREFLIGHT}{job}.{restart}"


def hang_dir(run_dir: str | os.PathLike[str], job: str, restart: int) -> Path:
    return state_dir(run_dir) / HANG / f"{job}-{restart}"


def telemetry_dir(run_dir: str | os.PathLike[str], job: str, restart: int) -> Path:
    return state_dir(run_dir) / TELEMETRY / f"{job}-{restart}"


def rank_logs_dir(run_dir: str | os.PathLike[str], job: str, restart: int) -> Path:
    return Path(run_dir) / RANK_LOGS / f"{job}-{restart}"


# ---------------------------------------------------------------- log lines read by other processes


def saved_line(step: int, path: str) -> str:
    """The log line of a stop-save (``cookbook.metrics`` and goodput parse it)."""
    return f"cookbook: saved at step {step} for preemption: {path}"


SAVED = re.compile(r"cookbook: saved at step (\d+) for preemption: (\S+)")
START = re.compile(r"^(?:\d+: )?job (\d+): (\d+) node\(s\)(?: \[(\S*)\],)?", re.M)  # run.rendezvous: a start
GOT_SIGNAL = re.compile(r"cookbook: got (\w+)")
TELEMETRY_LINE = re.compile(r"cookbook: node telemetry every (\S+) s in (\S+)")  # run.main: where the samples go

# the gate and exclusion lines (``cookbook.analysis.node_health`` reads them): name -> regex
NODE_LINES: dict[str, re.Pattern[str]] = {
    "preflight_ok": re.compile(r"cookbook: pre-flight ok on (?P<node>\S+) in (?P<rest>.*)"),
    "preflight_failed": re.compile(r"cookbook: pre-flight failed on (?P<node>\S+?): (?P<rest>.*)"),
    "preflight_time": re.compile(r"cookbook: pre-flight took (?P<rest>\d+ s on .*)"),
    "node_failure": re.compile(r"cookbook: node failure: (?P<node>\S+) (?P<rest>.*)"),
    "excluded": re.compile(r"cookbook: excluding (?P<node>\S+) (?P<rest>.*)"),
    "recovered": re.compile(r"cookbook: recovery: (?P<node>\S+) (?P<rest>.*)"),
    "not_excluded": re.compile(r"cookbook: (?:not excluding|not retrying|could not exclude|keeping) (?P<rest>.*)"),
}
# run.recent_pass: a restart on nodes that passed the whole gate in this job runs their own checks only
GATE_SHORTCUT = re.compile(r"cookbook: pre-flight: every node passed the whole gate in job \S+ (\d+) min ago")
