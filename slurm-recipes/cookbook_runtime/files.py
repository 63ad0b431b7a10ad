"""The names of the files a job keeps in its run folder and of the log lines another process reads.

One place: the ranks (:mod:`~cookbook_runtime.rank`, :mod:`~cookbook_runtime.hang`), the gate
(:mod:`~cookbook_runtime.nodecheck`) and the cookbook on the login node (metrics, goodput, ``diagnose``) read
these; the batch step (``cookbook/templates/job.sbatch.j2`` and its includes) writes the same names, which
``tests/unit/test_runtime_decide.py`` checks in a rendered script. Standard library only.

Everything the job keeps lives in ``RUN_DIR/.cookbook/``:

==================================  ==========================================================
``stop``                            a stop asked for (USR1/TERM reached the batch step); ranks poll it
``stop.saved``                      rank 0 wrote its stop-save (one :func:`saved_line`)
``retries-<first job>``             the exclusions and NODE_FAIL retries of one job and its resubmissions
``nodes-<job>``                     the nodes of the job's run (NODE_FAIL reads them after a requeue)
``preflight-<job>.<restart>/``      the gate's reports (``<node>.<local rank>.json``)
``hang/<job>-<restart>/``           the hang watch's dumps (``HANG``, flight recorder, stacks)
==================================  ==========================================================
"""

from __future__ import annotations

import re

STATE = ".cookbook"  # under RUN_DIR
STOP = "stop"
SAVED_SUFFIX = ".saved"
RETRIES = "retries-"  # + the first job's id
NODES = "nodes-"  # + the job id
PREFLIGHT = "preflight-"  # + <job>.<restart>
HANG = "hang"
STOP_FILE_ENV = "COOKBOOK_STOP_FILE"  # the ranks find the stop flag here
HANG_DIR_ENV = "COOKBOOK_HANG_DIR"
HANG_TRIGGER = "HANG"  # the file a rank writes when it declares a hang
TRACE_PREFIX = "nccl_trace_rank_"  # = TORCH_FR_DUMP_TEMP_FILE's file part: torch's dumps and ours alike


# ---------------------------------------------------------------- log lines read by other processes


def saved_line(step: int, path: str) -> str:
    """The log line of a stop-save (``cookbook.metrics`` and goodput parse it)."""
    return f"cookbook: saved at step {step} for preemption: {path}"


SAVED = re.compile(r"cookbook: saved at step (\d+) for preemption: (\S+)")
GOT_SIGNAL = re.compile(r"cookbook: got (\w+)")

# the gate and exclusion lines (``cookbook.analysis.node_health`` reads them): name -> regex
NODE_LINES: dict[str, re.Pattern[str]] = {
    "preflight_ok": re.compile(r"cookbook: pre-flight ok on (?P<node>\S+) in (?P<rest>.*)"),
    "preflight_failed": re.compile(r"cookbook: pre-flight failed on (?P<node>\S+?): (?P<rest>.*)"),
    "preflight_time": re.compile(r"cookbook: pre-flight took (?P<rest>\d+ s on .*)"),
    "node_failure": re.compile(r"cookbook: node failure: (?P<node>\S+) (?P<rest>.*)"),
    "excluded": re.compile(r"cookbook: excluding (?P<node>\S+) (?P<rest>.*)"),
    "not_excluded": re.compile(r"cookbook: (?:not excluding|not retrying|could not exclude) (?P<rest>.*)"),
}
