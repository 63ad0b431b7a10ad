"""Follow a growing training log: read only the new bytes, parse only complete lines, emit each step once.

    follower = LogFollower("slurm-12.out")
    new = follower.poll()      # the steps that became known since the last poll
    follower.eta()             # time left, from the last steps polled (no table rebuilt)
    follower.df                # everything so far (the table parse_log gives)

A line is complete once a ``\\n`` or ``\\r`` follows it. A poll costs O(new bytes), with the grammar and
:class:`~cookbook.metrics.parse.Collector` of ``parse_log``; a step is emitted once, with the row ``parse_log`` keeps
(table.py): a rank-0 (or rankless) line at once, another rank's when a later step's line came first (a rank-0 line
after that is ignored: then ``df`` differs from ``parse_log``). A file that shrinks or is replaced (a requeued job
rewrote it) is read again from the start, counted in ``resets``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd

from cookbook.metrics.derived import eta
from cookbook.metrics.parse import MAX_PARTIAL, Collector
from cookbook.metrics.table import to_frame

READ = 16 << 20  # bytes per read; a poll reads to the end


class LogFollower:
    """Incremental parser of one log file; ``poll()`` is cheap when nothing changed."""

    def __init__(self, path: str | os.PathLike[str], ranks: str = "first"):
        self.path, self.ranks, self.resets = Path(path), ranks, -1
        self._reset()

    def _reset(self) -> None:
        self.offset, self._partial, self._inode = 0, b"", (-1, -1)  # bytes of the file consumed; (dev, inode)
        self.lines_skipped: list[str] = []
        self._collector, self._emitted = Collector(self.ranks), set[tuple[object, ...]]()
        self._parts: list[pd.DataFrame] = []
        self._held: dict[tuple[object, ...], pd.Series] = {}  # (split, step) -> first row of a non-zero rank
        self._df: pd.DataFrame | None = None
        self._recent = pd.DataFrame()  # the last train rows, for eta()
        self.resets += 1

    @property
    def df(self) -> pd.DataFrame:
        """All steps so far (since the last reset), including those whose rank-0 line may still come."""
        if self._df is None:
            self._df = pd.concat(self._parts, ignore_index=True) if self._parts else pd.DataFrame()
            self._parts = [self._df] if len(self._df) else []
        held = pd.DataFrame(list(self._held.values()))
        return to_frame(pd.concat([self._df, held], ignore_index=True) if len(held) else self._df, ranks="all")

    def poll(self) -> pd.DataFrame:
        """Read what was appended since the last call; return the steps not returned before."""
        for chunk in self._read_new():
            data = self._partial + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            self._partial = data[cut:] if len(data) - cut <= MAX_PARTIAL else b""
            if cut:
                self._collector.feed(data[:cut])
        self.lines_skipped += [text for _, text in self._collector.skipped]
        self._collector.skipped.clear()
        new = self._emit(self._collector.frame())
        if new.empty:
            return to_frame(new)
        self._parts.append(new)
        self._df = None
        train = new[new["split"].eq("train")] if "split" in new else new
        if len(train):
            self._recent = pd.concat([self._recent, train], ignore_index=True).tail(20)
        return to_frame(new, ranks="all")

    def _emit(self, raw: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``raw`` (in line order) that are steps not emitted before."""
        if raw.empty:
            return raw
        nan, keep, held_rows = pd.Series(float("nan"), index=raw.index), [], []
        ranks, nodes = raw.get("rank", nan), raw.get("node", nan)
        for i, split, step, rank, node in zip(raw.index, raw["split"], raw["step"], ranks, nodes, strict=True):
            key = (split, step, node, rank) if self.ranks == "all" else (split, step)
            if key in self._emitted:
                continue
            if self.ranks == "all" or pd.isna(rank) or rank == 0:
                self._emitted.add(key)
                self._held.pop(key, None)
                keep.append(i)
            elif key not in self._held:
                self._held[key] = raw.loc[i]
            for k in [k for k in self._held if k[0] == split and k[1] < step]:  # a later step: k is done
                self._emitted.add(k)
                held_rows.append(self._held.pop(k))
        out = raw.loc[keep]
        if held_rows:
            out = pd.concat([out, pd.DataFrame(held_rows)]).sort_values("seq", kind="stable")
        return out.reset_index(drop=True)

    def eta(self, total_steps: int | None = None) -> timedelta | None:
        """Time left (see :func:`~cookbook.metrics.derived.eta`) from the last 20 steps polled."""
        return eta(to_frame(self._recent, ranks="all"), total_steps=total_steps) if len(self._recent) else None

    def _read_new(self) -> Iterator[bytes]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        inode = (st.st_dev, st.st_ino)
        if self._inode != (-1, -1) and (inode != self._inode or st.st_size < self.offset):
            self._reset()
        self._inode = inode
        if st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while chunk := f.read(READ):
                self.offset += len(chunk)
                yield chunk
