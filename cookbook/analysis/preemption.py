"""What preemptions did to a run, from its log: each start of the batch script (a requeued job appends to
the same log), how it began (afresh, or resumed from which checkpoint), what stopped it (the signal, the
step the ranks saved at) and the steps it trained; and the steps trained twice (redone).

The lines read are the stop protocol's (``cookbook: got USR1: ...``, ``cookbook: saved at step N for
preemption: PATH``), the resume blocks' ``resuming from PATH`` and the steps of the metrics parser
(:func:`cookbook.analysis.goodput.log_segments`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cookbook_runtime.files import GOT_SIGNAL as _SIGNAL  # the runtime's lines, named once there
from cookbook_runtime.files import SAVED as _SAVED

_RESUMING = re.compile(r"resuming from (\S+)")


@dataclass(frozen=True)
class Start:
    """One start of the job."""

    job_id: str | None
    steps: tuple[int, ...]  # steps trained, in order
    resumed_from: str | None  # the checkpoint it resumed from; None: afresh
    signal: str | None  # the signal that stopped it (USR1, TERM), if one did
    saved_at: int | None  # the step the ranks saved at when stopped
    saved_to: str | None

    def line(self, number: int) -> str:
        began = f"resumed from {self.resumed_from}" if self.resumed_from else "started afresh"
        trained = f"trained steps {self.steps[0]}-{self.steps[-1]}" if self.steps else "trained no step"
        if self.saved_at is not None:
            ended = f"; {self.signal or 'a stop'}: saved at step {self.saved_at} ({self.saved_to}), requeued"
        elif self.signal:
            ended = f"; got {self.signal}, nothing saved"
        else:
            ended = ""
        return f"start {number}: {began}, {trained}{ended}"


def starts(log: str | Path) -> list[Start]:
    """Every start of the batch script in ``log``."""
    from cookbook.analysis.goodput import log_segments

    out = []
    for seg in log_segments(log):
        signal, saved, resumed = _SIGNAL.search(seg.text), _SAVED.search(seg.text), _RESUMING.search(seg.text)
        out.append(
            Start(
                seg.job_id,
                tuple(step for step, _ in seg.steps),
                resumed.group(1) if resumed else None,
                signal.group(1) if signal else None,
                int(saved.group(1)) if saved else None,
                saved.group(2) if saved else None,
            )
        )
    return out


def steps_redone(runs: list[Start]) -> list[int]:
    """Steps trained again after an earlier start had trained them."""
    done: set[int] = set()
    redone = []
    for run in runs:
        redone += sorted(set(run.steps) & done)
        done |= set(run.steps)
    return redone


def preemption_report(log: str | Path) -> str:
    """A few lines: each start of the job, and the steps redone (what a preemption cost in steps)."""
    runs = starts(log)
    lines = [run.line(i + 1) for i, run in enumerate(runs)]
    if len(runs) == 1 and runs[0].signal is None:
        lines.append(
            "not preempted. On USR1 (Slurm's --signal=B:USR1@N before the time limit, or scancel --signal=USR1 "
            "--batch) or TERM the ranks save at their next step boundary, the job requeues and resumes there"
        )
    redone = steps_redone(runs)
    which = f" ({', '.join(map(str, redone))})" if redone else ""
    lines.append(f"steps redone after a resume: {len(redone)}{which}")
    return "\n".join(lines)
