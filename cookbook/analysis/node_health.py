"""What a job's log says about its nodes: the pre-flight gate's verdict per node, nodes that failed under the
job (NODE_FAIL), and what was done about them (excluded by which method, retries left, the new job id).

The lines come from the job runtime (``cookbook_runtime.run``; their patterns: ``cookbook_runtime.files``), each
starting with ``cookbook: ``; ``cookbook metrics``, ``cookbook watch`` and ``cookbook diagnose`` print
:func:`node_report` after the failure diagnosis, whose NODE_FAIL advice :func:`settled` replaces by what the job
already did.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cookbook_runtime.files import NODE_LINES

if TYPE_CHECKING:
    from cookbook.metrics.diagnose import Finding

# the gate's and the exclusions' lines, as the job runtime names them (cookbook_runtime.files: one place)
_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(NODE_LINES.items())


@dataclass(frozen=True)
class NodeEvent:
    """One line of the gate or the exclusion: ``kind`` (see ``_EVENTS``), the node(s) it names, the rest."""

    kind: str
    node: str | None
    detail: str
    line_number: int


def node_events(path: str | os.PathLike[str], lines: list[tuple[int, str]] | None = None) -> list[NodeEvent]:
    """Every gate/exclusion line of the log at ``path``, in order; ``lines``: the log's ``cookbook: `` lines as
    :func:`~cookbook.metrics.diagnose.diagnose` collected them (``lines_with``), else read here."""
    if lines is None:
        from cookbook.metrics.diagnose import diagnose

        diagnose(path, lines_with=(lines := list[tuple[int, str]]()))
    out: list[NodeEvent] = []
    for number, line in lines:
        for kind, rx in _EVENTS:
            if m := rx.search(line):
                out.append(NodeEvent(kind, m.groupdict().get("node"), m["rest"], number))
                break
    return out


def node_report(path: str | os.PathLike[str], lines: list[tuple[int, str]] | None = None) -> list[str]:
    """Lines for a person: the gate's result per run and what was done (empty: the log has none)."""
    report = []
    for e in node_events(path, lines):
        if e.kind == "preflight_ok":
            report.append(f"pre-flight passed on {e.node} ({e.detail})")
        elif e.kind == "preflight_failed":
            report.append(f"pre-flight FAILED on {e.node}: {e.detail}")
        elif e.kind == "preflight_time":
            report.append(f"pre-flight took {e.detail}")
        elif e.kind == "node_failure":
            report.append(f"node {e.node} failed under the job: {e.detail}")
        elif e.kind == "excluded":
            report.append(f"done: excluded {e.node} {e.detail}")
        elif e.kind == "recovered":
            report.append(f"done: recovered from {e.node} {e.detail}")
        else:
            report.append(f"not done: {e.detail}")
    return report


def settled(findings: list[Finding], events: list[NodeEvent]) -> list[Finding]:
    """``findings`` with the NODE_FAIL advice ("resubmit excluding it") replaced by what the job did itself when the
    log shows it: a node exclusion after the failure's line with no later give-up (retry budget spent, exclusion
    refused), where the advice stands."""
    out = []
    for f in findings:
        after = [e for e in events if e.line_number >= f.line_number and e.kind in ("excluded", "not_excluded")]
        if f.kind == "slurm_node_fail" and after and after[-1].kind == "excluded":
            done = after[-1]
            out.append(
                replace(
                    f,
                    hint=f"already done by the job: excluded {done.node} and ran again (line {done.line_number}, "
                    "the `nodes:` lines below); resubmit by hand only if that run fails too",
                )
            )
        else:
            out.append(f)
    return out
