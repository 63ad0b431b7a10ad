"""Follow a growing training log: read only the new bytes, parse only complete lines.

    follower = LogFollower("slurm-12.out")
    new = follower.poll()      # DataFrame of rows added (or updated) since the last poll
    follower.df                # everything so far (same columns as parse_log)

A line is complete once a ``\\n`` or ``\\r`` follows it (tqdm starts each redraw with ``\\r``, so its
latest bar is parsed when the next redraw arrives). If the file shrinks or is replaced (another
inode, e.g. a requeued job rewrote it) the follower starts over and counts it in ``resets``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pandas as pd

from cookbook.metrics.formats import scan
from cookbook.metrics.table import RowTable

_MAX_PARTIAL = 1 << 20


class LogFollower:
    """Incremental parser of one log file; ``poll()`` is cheap when nothing changed."""

    def __init__(self, path: str | os.PathLike, ranks: str = "first", max_read: int = 64 << 20):
        self.path = Path(path)
        self.ranks = ranks
        self.max_read = max_read        # bytes per read; a poll reads until the end in such chunks
        self.offset = 0                 # bytes of the file consumed (complete lines only)
        self.resets = 0
        self.lines_skipped: list[str] = []
        self._inode: tuple[int, int] | None = None
        self._partial = b""
        self._table = RowTable()

    @property
    def df(self) -> pd.DataFrame:
        """All rows seen so far (since the last reset)."""
        return self._table.frame(ranks=self.ranks)

    def poll(self) -> pd.DataFrame:
        """Read what was appended since the last call; return the new or updated rows."""
        changed = []
        for chunk in self._read_new():
            data = self._partial + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            self._partial = data[cut:]
            if len(self._partial) > _MAX_PARTIAL:   # not a log line (binary junk): drop it
                self._partial = b""
            if cut:
                frames, skipped = scan(data, 0, cut)
                changed.append(self._table.add(frames))
                self.lines_skipped += [text for _, text in skipped]
        changed = [c for c in changed if len(c)]
        return self._table.frame(pd.concat(changed, ignore_index=True) if changed else pd.DataFrame(),
                                 ranks=self.ranks)

    def _read_new(self) -> Iterator[bytes]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        inode = (st.st_dev, st.st_ino)
        if self._inode is not None and (inode != self._inode or st.st_size < self.offset):
            self._reset()
        self._inode = inode
        if st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while True:
                chunk = f.read(self.max_read)
                if not chunk:
                    break
                self.offset += len(chunk)
                yield chunk

    def _reset(self) -> None:
        self.offset, self._partial = 0, b""
        self._table.clear()
        self.lines_skipped.clear()
        self.resets += 1


def follow(path: str | os.PathLike, ranks: str = "first") -> LogFollower:
    """A :class:`LogFollower` for ``path`` (the file need not exist yet)."""
    return LogFollower(path, ranks=ranks)
