"""``parse_log``: a training log file (or a TensorBoard folder) -> one DataFrame row per step."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path
from typing import Callable

import pandas as pd

from cookbook.metrics.formats import ALIASES, scan
from cookbook.metrics.table import RowTable, to_frame

# TensorBoard tags (torchtune, torchtitan) -> canonical columns; validation tags get split=validation
TB_TAGS: dict[str, str] = {
    **ALIASES,
    "loss": "loss",
    "grad_norm": "grad_norm",
    "tflops": "tflops",
    "tokens_per_second_per_gpu": "tokens_per_second_per_gpu",
    "lr/AdamW": "lr",
    "n_tokens_seen": "tokens_seen",
}
_VAL_PREFIX = "validation_metrics/"
_CHUNK = 64 << 20


def parse_log(path: str | os.PathLike, ranks: str = "first", workers: int | None = None) -> pd.DataFrame:
    """Parse a training log (any supported format, detected per line) or a TensorBoard event folder.

    Returns one row per (split, step) -- ``ranks="all"`` keeps one row per rank as well. ``df.attrs``
    holds ``source``, ``formats`` (those seen), ``ranks`` (ranks seen) and ``skipped``: a list of
    ``(line_number, text)`` for lines that looked like metrics but matched no format exactly.

    Files larger than ``PARALLEL_MIN_BYTES`` are parsed by up to ``workers`` processes (default: one per
    CPU), each reading and scanning its own ~64 MB byte range; ``workers=1`` forces one process. The
    result is the same table either way.
    """
    p = Path(path)
    if p.is_dir():
        return read_tensorboard(p)
    size = p.stat().st_size
    n_workers = min(os.cpu_count() or 1, workers or os.cpu_count() or 1)
    table = RowTable()
    if n_workers > 1 and size > PARALLEL_MIN_BYTES:
        skipped = _parse_parallel(p, size, n_workers, table)
    else:
        with open(p, "rb") as f:
            skipped = _scan_file(f, 0, None, table.add)
    if skipped:                      # rare: map the file once to count lines up to each skipped one
        data = _map(p)
        table.skipped = with_line_numbers(data, skipped)
        if isinstance(data, mmap.mmap):
            data.close()
    return _annotate(table, ranks, str(p))


def _scan_file(f, start: int, end: int | None, add: Callable[[list], object],
               buf: bytearray | None = None) -> list[tuple[int, str]]:
    """Scan bytes ``start``..``end`` (None: to EOF) of the open file ``f`` in ``_CHUNK`` windows.

    Each window's frames go to ``add`` (``RowTable.add``, or a list's ``extend`` in a worker process);
    returns (byte offset, text) of the skipped lines.
    """
    skipped: list[tuple[int, str]] = []
    # Reads into one reused buffer (no fresh 64 MB allocation per read), not mmap: a log truncated
    # while mapped (Slurm truncates it on requeue) would kill the process with SIGBUS.
    if buf is None or len(buf) < _CHUNK:
        buf = bytearray(_CHUNK)
    base, keep = start, 0
    f.seek(start)
    while True:
        if keep == len(buf):     # one line longer than the buffer: grow it
            buf.extend(bytes(len(buf)))
        room = len(buf) - keep if end is None else min(len(buf) - keep, end - base - keep)
        if room <= 0:
            break
        with memoryview(buf) as view:
            n = f.readinto(view[keep:keep + room])
        if not n:
            break
        total = keep + n
        cut = max(buf.rfind(b"\n", 0, total), buf.rfind(b"\r", 0, total)) + 1
        frames, skips = scan(buf, 0, cut)
        add(frames)
        skipped += [(base + off, text) for off, text in skips]
        buf[:total - cut] = buf[cut:total]     # the partial last line moves to the front
        base, keep = base + cut, total - cut
    if keep:
        frames, skips = scan(bytes(buf[:keep]))
        add(frames)
        skipped += [(base + off, text) for off, text in skips]
    return skipped


# --- parallel path: one worker process per ~64 MB byte range of a big file ----------------------------
PARALLEL_MIN_BYTES = 128 << 20   # smaller files: one process (a pool costs more than it saves)
_PIECE = 64 << 20                # nominal size of one worker's byte range
_WORKER_BUF: bytearray | None = None


def _after_newline(f, pos: int, size: int) -> int:
    """Offset just after the first b"\n" at or after ``pos`` (``size`` if there is none)."""
    f.seek(pos)
    while True:
        block = f.read(1 << 16)
        if not block:
            return size
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)


def _parse_range(path: str, start: int, end: int, size: int) -> tuple[list, list[tuple[int, str]]]:
    """Worker: rows of the lines of ``path`` in nominal byte range ``start``..``end``, as compact columns.

    The range begins after the first newline at/after ``start`` (0 stays 0) and ends after the first
    newline at/after ``end`` (EOF for the last range), so neighbouring ranges share no line and miss none.
    Skipped lines come back with absolute byte offsets; the parent turns those into line numbers.
    """
    global _WORKER_BUF
    with open(path, "rb") as f:
        s = 0 if start == 0 else _after_newline(f, start, size)
        e = None if end >= size else _after_newline(f, end, size)
        if e is not None and s >= e:
            return [], []
        if _WORKER_BUF is None or len(_WORKER_BUF) < _CHUNK:
            _WORKER_BUF = bytearray(_CHUNK)
        frames: list = []
        skipped = _scan_file(f, s, e, frames.extend, _WORKER_BUF)
    return [_pack(df) for df in frames], skipped


def _pack(df: pd.DataFrame) -> object:
    """A DataFrame as (column names, numpy arrays) -- cheap to pickle; constant object columns (split,
    format) as one value. Frames with pandas extension dtypes travel as they are."""
    import numpy as np

    cols = []
    for name in df.columns:
        s = df[name]
        if not isinstance(s.dtype, np.dtype):
            return df
        a = s.to_numpy()
        if a.dtype == object and len(a) and isinstance(a[0], str) and (a == a[0]).all():
            cols.append((name, ("const", a[0], len(a))))
        else:
            cols.append((name, a))
    return ("cols", cols, len(df))


def _unpack(packed: object) -> pd.DataFrame:
    import numpy as np

    if isinstance(packed, pd.DataFrame):
        return packed
    _, cols, n = packed
    data = {}
    for name, a in cols:
        data[name] = np.full(a[2], a[1], dtype=object) if isinstance(a, tuple) else a
    return pd.DataFrame(data, index=pd.RangeIndex(n))


def _parse_parallel(p: Path, size: int, n_workers: int, table: RowTable) -> list[tuple[int, str]]:
    """Scan ``p`` with a pool of ``n_workers`` processes; add their rows to ``table`` in file order (so
    duplicate steps resolve exactly as in one process) and return skipped lines' (byte offset, text)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    bounds = list(range(0, size, _PIECE)) + [size]
    ctx = multiprocessing.get_context("fork")
    skipped: list[tuple[int, str]] = []
    with ProcessPoolExecutor(max_workers=min(n_workers, len(bounds) - 1), mp_context=ctx) as pool:
        n = len(bounds) - 1
        for frames, skips in pool.map(_parse_range, [str(p)] * n, bounds[:-1], bounds[1:], [size] * n):
            table.add(_unpack(df) for df in frames)
            skipped += skips
    return skipped


def parse_text(text: str | bytes, ranks: str = "first") -> pd.DataFrame:
    """Like :func:`parse_log` for log text already in memory (a notebook cell, a test)."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    frames, skipped = scan(data)
    table = RowTable()
    table.add(frames)
    table.skipped = with_line_numbers(data, skipped)
    return _annotate(table, ranks, "<text>")


def with_line_numbers(data: bytes | mmap.mmap, skipped: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(byte offset, text) -> (1-based line number, text); reads the file only up to the last offset."""
    out, line, pos = [], 1, 0
    for offset, text in sorted(skipped):
        line += data[pos:offset].count(b"\n")
        pos = offset
        out.append((line, text))
    return out


def _map(path: Path) -> bytes | mmap.mmap:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _annotate(table: RowTable, ranks: str, source: str) -> pd.DataFrame:
    everything = table.frame(ranks="all")
    df = everything if ranks == "all" else to_frame(everything, ranks=ranks)
    df.attrs.update(
        source=source,
        formats=sorted(everything["format"].dropna().unique()) if "format" in everything else [],
        ranks=sorted(int(r) for r in everything["rank"].dropna().unique()) if "rank" in everything else [],
        skipped=list(table.skipped),
    )
    return df


def read_tensorboard(folder: str | os.PathLike) -> pd.DataFrame:
    """Scalars of a TensorBoard event folder (torchtune or torchtitan) in the same columns as logs.

    If the folder holds several runs (sub-folders with event files) the newest one is read; the others
    are listed in ``df.attrs["other_runs"]``.
    """
    from tbparse import SummaryReader

    folder = Path(folder)
    event_dirs = sorted({f.parent for f in folder.rglob("events.out.tfevents*")},
                        key=lambda d: max(f.stat().st_mtime for f in d.glob("events.out.tfevents*")))
    if not event_dirs:
        raise FileNotFoundError(f"no TensorBoard event files (events.out.tfevents*) under {folder}")
    run = event_dirs[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tbparse 0.0.9 uses pandas' deprecated inplace sort
        reader = SummaryReader(str(run), extra_columns={"wall_time"})
        # torchtitan writes scalar summaries, torchtune (add_scalar via the v2 API) tensor summaries
        tables = [t for t in (reader.scalars, reader.tensors) if len(t)]
    scalars = pd.concat(tables, ignore_index=True) if tables else \
        pd.DataFrame(columns=["tag", "step", "value", "wall_time"])
    rows: dict[tuple[str, int], dict] = {}
    for tag, step, value, wall in scalars[["tag", "step", "value", "wall_time"]].itertuples(index=False):
        split = "validation" if tag.startswith(_VAL_PREFIX) else "train"
        name = tag[len(_VAL_PREFIX):] if split == "validation" else tag
        column = TB_TAGS.get(name, name)
        row = rows.setdefault((split, int(step)), {"step": int(step), "split": split, "format": "tensorboard"})
        row[column] = float(value)
        row["time"] = max(row.get("time", wall), wall)
    records = list(rows.values())
    for r in records:
        r["time"] = pd.Timestamp(r["time"], unit="s")
    df = to_frame(records)
    df.attrs.update(source=str(run), formats=["tensorboard"], ranks=[], skipped=[],
                    other_runs=[str(d) for d in event_dirs[:-1]])
    return df
