"""The starts of a run: a requeued Slurm job appends each start of its batch script to the same log.

A start begins at the generated scripts' first line, ``job ID: N node(s) [NODES], rendezvous ...``
(``cookbook_runtime.run.rendezvous``; ``srun -l`` may prefix it). This module is the one definition of a
start for the goodput ledger, the explainer and the straggler report: a step time is taken within one
start only, so the time between two starts (a requeue's queue wait, the next start-up) is never a step,
and the first steps of each start are its start-up (compilation, warm-up, restore), not steady steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from cookbook_runtime.files import START as START_LINE  # the runtime writes it, once per start


def split_starts(text: str) -> list[tuple[str | None, str]]:
    """``text`` cut at each start line: (job id, text) per start, in order. Text before the first start
    line goes with the first start; a log without start lines is one start with no job id."""
    cuts = [(m.start(), m.group(1)) for m in START_LINE.finditer(text)]
    if not cuts:
        return [(None, text)]
    cuts[0] = (0, cuts[0][1])
    return [(job, text[a : cuts[i + 1][0] if i + 1 < len(cuts) else len(text)]) for i, (a, job) in enumerate(cuts)]


def parse_starts(log: str | Path, ranks: str = "first") -> pd.DataFrame:
    """:func:`cookbook.metrics.parse_log` of ``log`` with a ``start`` column (0, 1, ... in the log's order):
    each start is parsed on its own, so a step a resumed start logs again is a row of that start too.
    A run folder (TensorBoard events) is one start."""
    import pandas as pd

    from cookbook.metrics import parse_log, parse_text

    parts = [] if Path(log).is_dir() else split_starts(Path(log).read_text(errors="replace"))
    if len(parts) < 2:  # one start, or a run folder: parse_log as it is (it reads a log in windows)
        df = parse_log(log, ranks=ranks)
        return df.assign(start=pd.Series(0, index=df.index, dtype="int64"))
    frames, skipped, line = [], [], 0
    for i, (_, part) in enumerate(parts):
        df = parse_text(part, ranks=ranks)
        frames.append(df.assign(start=pd.Series(i, index=df.index, dtype="int64")))
        skipped += [(line + n, shown) for n, shown in df.attrs.get("skipped", [])]
        line += part.count("\n")
    out = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
    out.attrs = {
        "source": str(log),
        "formats": sorted({f for df in frames for f in df.attrs.get("formats", [])}),
        "ranks": sorted({r for df in frames for r in df.attrs.get("ranks", [])}),
        "skipped": skipped,
    }
    return out


def start_of(df: pd.DataFrame) -> pd.Series:
    """Each row's start: the ``start`` column, or 0 (one start) for a table without it."""
    import pandas as pd

    return df["start"] if "start" in df else pd.Series(0, index=df.index, dtype="int64")


def after_startup(df: pd.DataFrame, skip: int, by: tuple[str, ...] = ()) -> pd.Series:
    """Rows past the first ``skip`` rows of their start (and of their ``by`` group, e.g. the rank), in
    ``df``'s order: the steady steps, without each start's start-up."""
    return df.groupby([start_of(df), *(df[c] for c in by)], sort=False).cumcount() >= skip


def step_seconds(df: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.Series:
    """Seconds from the previous row of the same start (and ``by`` group) to each row, from ``time``, in
    ``df``'s order (sort it by step first); NaN for the first row of each: a duration never spans two starts."""
    import pandas as pd

    t = pd.to_datetime(df["time"])
    return t.groupby([start_of(df), *(df[c] for c in by)], sort=False).diff().dt.total_seconds()
