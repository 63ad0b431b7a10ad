"""What a job's log says about its nodes: the pre-flight gate's verdict per node, nodes that failed under the
job (NODE_FAIL), and what was done about them (excluded by which method, retries left, the new job id).

The lines come from the generated script (``templates/preflight.sh.j2``, ``templates/exclude_nodes.sh.j2``), each
starting with ``cookbook: ``; ``cookbook metrics`` and ``cookbook watch`` print :func:`node_report` after the
failure diagnosis.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("preflight_ok", re.compile(r"cookbook: pre-flight ok on (?P<node>\S+) in (?P<rest>.*)")),
    ("preflight_failed", re.compile(r"cookbook: pre-flight failed on (?P<node>\S+?): (?P<rest>.*)")),
    ("preflight_time", re.compile(r"cookbook: pre-flight took (?P<rest>\d+ s on .*)")),
    ("node_failure", re.compile(r"cookbook: node failure: (?P<node>\S+) (?P<rest>.*)")),
    ("excluded", re.compile(r"cookbook: excluding (?P<node>\S+) (?P<rest>.*)")),
    ("not_excluded", re.compile(r"cookbook: (?:not excluding|not retrying|could not exclude) (?P<rest>.*)")),
)
_PREFIX = b"cookbook: "


@dataclass(frozen=True)
class NodeEvent:
    """One line of the gate or the exclusion: ``kind`` (see ``_EVENTS``), the node(s) it names, the rest."""

    kind: str
    node: str | None
    detail: str
    line_number: int


def node_events(path: str | os.PathLike[str]) -> list[NodeEvent]:
    """Every gate/exclusion line of the log at ``path``, in order (one pass, line by line)."""
    out: list[NodeEvent] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if _PREFIX not in raw:
                continue
            line = raw.decode("utf-8", errors="replace").strip()
            for kind, rx in _EVENTS:
                if m := rx.search(line):
                    out.append(NodeEvent(kind, m.groupdict().get("node"), m["rest"], number))
                    break
    return out


def node_report(path: str | os.PathLike[str]) -> list[str]:
    """Lines for a person: the gate's result per run and what was done (empty: the log has none)."""
    lines = []
    for e in node_events(path):
        if e.kind == "preflight_ok":
            lines.append(f"pre-flight passed on {e.node} ({e.detail})")
        elif e.kind == "preflight_failed":
            lines.append(f"pre-flight FAILED on {e.node}: {e.detail}")
        elif e.kind == "preflight_time":
            lines.append(f"pre-flight took {e.detail}")
        elif e.kind == "node_failure":
            lines.append(f"node {e.node} failed under the job: {e.detail}")
        elif e.kind == "excluded":
            lines.append(f"done: excluded {e.node} {e.detail}")
        else:
            lines.append(f"not done: {e.detail}")
    return lines
