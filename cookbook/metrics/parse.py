"""``parse_log``: a training log file (or a TensorBoard folder) -> one DataFrame row per step."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path

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


def parse_log(path: str | os.PathLike, ranks: str = "first") -> pd.DataFrame:
    """Parse a training log (any supported format, detected per line) or a TensorBoard event folder.

    Returns one row per (split, step) -- ``ranks="all"`` keeps one row per rank as well. ``df.attrs``
    holds ``source``, ``formats`` (those seen), ``ranks`` (ranks seen) and ``skipped``: a list of
    ``(line_number, text)`` for lines that looked like metrics but matched no format exactly.
    """
    p = Path(path)
    if p.is_dir():
        return read_tensorboard(p)
    table = RowTable()
    skipped: list[tuple[int, str]] = []
    # Reads into one reused buffer (no fresh 64 MB allocation per read), not mmap: a log truncated
    # while mapped (Slurm truncates it on requeue) would kill the process with SIGBUS.
    buf, base, keep = bytearray(_CHUNK), 0, 0
    with open(p, "rb") as f:
        while True:
            if keep == len(buf):     # one line longer than the buffer: grow it
                buf.extend(bytes(len(buf)))
            with memoryview(buf) as view:
                n = f.readinto(view[keep:])
            if not n:
                break
            total = keep + n
            cut = max(buf.rfind(b"\n", 0, total), buf.rfind(b"\r", 0, total)) + 1
            frames, skips = scan(buf, 0, cut)
            table.add(frames)
            skipped += [(base + off, text) for off, text in skips]
            buf[:total - cut] = buf[cut:total]     # the partial last line moves to the front
            base, keep = base + cut, total - cut
    if keep:
        frames, skips = scan(bytes(buf[:keep]))
        table.add(frames)
        skipped += [(base + off, text) for off, text in skips]
    if skipped:                      # rare: map the file once to count lines up to each skipped one
        data = _map(p)
        table.skipped = with_line_numbers(data, skipped)
        if isinstance(data, mmap.mmap):
            data.close()
    return _annotate(table, ranks, str(p))


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
