"""``parse_log``: a training log file, a TensorBoard event folder or a run folder -> one row per step.

A log is read in ``WINDOW``-byte windows cut after the last ``\\n``/``\\r``; each window's lines that hold the NEEDLE
are read by :func:`~cookbook.metrics.formats.parse_line` (the one grammar, shared with the live follower), but a line
that cannot win its step (table.py) only until that is known: another rank's line of the step just read (its key's
text), another format's (its regex up to the step). Every ``BATCH`` rows the keys of all formats are resolved, then
the winners' strings converted column-wise. Time and memory are linear in the file, whatever its shape and windows.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import cookbook.metrics.formats as fm
from cookbook.metrics.formats import FORMATS, NEEDLE, Format, parse_line, rank_node
from cookbook.metrics.table import resolve, to_frame

WINDOW = 1 << 18  # 256 KB: 1 MB reads cost ~20% more CPU in page faults (glibc maps and unmaps each)
MAX_PARTIAL = 1 << 20  # a longer "line" (no \\n or \\r in it) is no log line (binary junk): dropped
_EARLIER = {f: (*(m := [e.marker for e in FORMATS[: FORMATS.index(f)]]), *["\0\1\0"] * (4 - len(m))) for f in FORMATS}
_BNEEDLE = NEEDLE.encode()
_GROUPS = {f: (f.regex.groupindex, f.regex.groups + 1) for f in FORMATS if f.regex is not None}  # a row: groups + seq
_STEP = {f: groups["step"] for f, (groups, _) in _GROUPS.items()}
BATCH = 5_000  # rows converted at a time (their strings held until then)
_KEYS = ("split", "step", "rank", "node")


def _hms(col: Sequence[Any] | np.ndarray) -> np.ndarray:
    """tqdm's ``05:03`` / ``49:53:19`` (str, ``?`` or None) -> seconds (NaN for ``?``/None), column-wise."""
    lists = pc.split_pattern(pc.if_else(pc.equal(arr := pa.array(col, pa.string()), "?"), None, arr), ":")
    values = pc.cast(lists.flatten(), pa.float64()).to_numpy()
    ends, lens = lists.offsets.to_numpy()[1:], pc.list_value_length(lists).fill_null(0).to_numpy()
    parent = np.repeat(np.arange(len(col)), lens)
    secs = np.bincount(parent, values * 60.0 ** (ends[parent] - 1 - np.arange(len(values))), minlength=len(col))
    return np.where(lens > 0, secs, np.nan)


def _each(fn: Callable[[Any], Any], col: Sequence[Any] | np.ndarray) -> list[Any]:
    """``fn`` of each value, computed once per distinct value (logs repeat them a lot)."""
    done = {v: fn(v) for v in set(col)}
    return [done[v] for v in col]


def _floats(col: Sequence[Any] | np.ndarray) -> np.ndarray | None:
    """Captured numbers (str or None; ``1,541,366``) -> float64 (None -> NaN); None if no value was captured."""
    if (arr := pa.array(col, pa.string())).null_count == len(arr):
        return None
    return np.asarray(pc.cast(pc.replace_substring(arr, ",", ""), pa.float64()).to_numpy(zero_copy_only=False))


class Collector:
    """Rows of complete log lines fed in file order, kept column-wise per format until :meth:`frame`."""

    def __init__(self, ranks: str = "all") -> None:
        # lines that gave a row (their order); ``\\n`` seen (line numbers); the last tqdm bar's prefix + "E|S|Loss:"
        self.seq, self.lines, self._redraw = 0, 0, "\0"
        # per regex format, its rows flat: seq, then the regex's groups (a record of groups + 1 items)
        self._found: dict[Format, list[Any]] = {f: [] for f in FORMATS if f.regex is not None}
        self._rows: list[dict[str, Any]] = []  # rows of formats without a regex
        self.skipped: list[tuple[int, str]] = []  # (line number, text): looked like metrics, matched no format
        self.formats, self.ranks = set[str](), set[int]()  # formats and ranks seen (before duplicates are dropped)
        # ranks="first": the last rank-0 or rankless row's key text (e.g. "Batch 12 "), the markers of the formats read
        # before its own (_EARLIER, padded to 4), its launcher prefix and its match. A later line holding that text,
        # none of those markers and another prefix (same prefix: read; a typo is reported), or of another format with
        # its split and step (parse_line's ``won``), loses its step: read no further (its head kept for attrs).
        self._first, self._losers = ranks != "all", set[tuple[Format, str]]()
        self._last: tuple[Any, ...] = ("\0", FORMATS[0], ("\0\1\0",) * 4, "", None)

    def feed(self, data: bytes) -> None:
        """Read ``data``: complete UTF-8 lines (bad bytes replaced); it ends at a line end or at the end of the log."""
        seq, redraw, found, add_loser = self.seq, self._redraw, self._found, self._losers.add
        last_key, last_fmt, (e0, e1, e2, e3), last_pre, won = self._last
        text: Any = data  # a \r ends a line too (tqdm); line numbers count \n in text
        if data.count(_BNEEDLE, 0, 1 << 14) * 8 < data.count(b"\n", 0, 1 << 14):  # mostly other lines
            raw, segs, starts = data.replace(b"\r", b"\n") if b"\r" in data else data, [], []
            for hit in re.finditer(re.escape(_BNEEDLE) + rb"[^\n]*", raw):  # a line's first needle (re: 2x bytes.find)
                starts.append(raw.rfind(b"\n", 0, hit.start()) + 1)  # only the lines holding the needle are decoded
                segs.append(raw[starts[-1] : hit.end()].decode("utf-8", "replace"))
        else:
            text, starts = data.decode("utf-8", "replace"), None
            segs = (body := text.replace("\r", "\n") if "\r" in text else text).split("\n")
        nl: Any = b"\n" if text is data else "\n"
        at = [0, 0]  # an offset in text and the \n before it: line numbers of skipped lines, counted forward once

        def line_of(n: int) -> int:  # the line (in text) of segment n
            nonlocal starts
            if starts is None and body is text:
                return n  # no \r: segment n is line n
            starts = starts or [0, *itertools.accumulate(len(s) + 1 for s in segs)]
            at[1], at[0] = at[1] + text.count(nl, at[0], starts[n]), starts[n]
            return at[1]

        for n, seg in enumerate(segs):
            if NEEDLE not in seg or (seg.startswith(redraw) and "step:" not in seg):
                continue  # a tqdm redraw of the bar just read: its step is taken (first line wins)
            if last_key in seg and not (seg.startswith(last_pre) or e0 in seg or e1 in seg or e2 in seg or e3 in seg):
                add_loser((last_fmt, seg[: seg.index(last_key)]))  # another rank's line of the step just read
                continue
            fmt, m, looks = parse_line(seg, last_fmt, won)
            if looks is None:  # another format's line of the step just taken
                add_loser((fmt, seg[: m.start("step")]))  # type: ignore[arg-type]
                continue
            if fmt is None:
                if looks:
                    shown = (fm._ANSI.sub("", seg) if "\x1b" in seg else seg).strip()[:300]
                    self.skipped.append((self.lines + 1 + line_of(n), shown))
                continue
            if fmt.regex is not None:
                (rows := found[fmt]).append(seq)
                rows.extend(m.groups())
                step_end = m.end(_STEP[fmt])
                if fmt.name == "torchtune-tqdm":
                    redraw = seg[: step_end + 6]  # prefix, "E|S|Loss:"
                if self._first and ((r := m[3] or m[2] or m[1]) is None or int(r) == 0):  # rank 0 (glob, tag, srun)
                    head, head_end = m.span(4)
                    last_fmt, (e0, e1, e2, e3), last_pre = fmt, _EARLIER[fmt], seg[:head]
                    last_key = seg[head_end : step_end + 1]  # and the non-digit after the step
                    won = m
            else:
                m.update(seq=seq, format=fmt.name)
                m.setdefault("split", fmt.split)
                self._rows.append(m)
            seq += 1
        self.seq, self._redraw, self._last = seq, redraw, (last_key, last_fmt, (e0, e1, e2, e3), last_pre, won)
        self.lines += int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))  # \n

    def frame(self, ranks: str = "all") -> pd.DataFrame:
        """The rows read since the last call, in line order, then forget them. ``ranks="first"`` drops the rows that
        cannot win their step (see table.py), of all formats at once, before their numbers are converted."""
        parts: list[tuple[Format | None, Any]] = [(f, self._keys(f, v)) for f, v in self._found.items() if v]
        if self._rows:
            parts.append((None, rows := pd.DataFrame.from_records(self._rows)))
            self.formats.update(rows["format"].unique())
            self.ranks.update(int(r) for r in rows["rank"].dropna().unique())
        for fmt, head in self._losers:  # a line's launcher prefix is at the start of its head
            self.formats.add(fmt.name)
            if (p := fm.PREFIX.match(head)) and (rank := rank_node(*p.group("srun", "tag", "glob"))[0]) is not None:
                self.ranks.add(int(rank))
        wins = _winners([{c: np.asarray(keys[c]) for c in ("seq", *_KEYS)} for _, keys in parts], ranks)
        kept = [(f, k, w) for (f, k), w in zip(parts, wins, strict=True) if w is not None]  # columns: of winners
        frames = [k[w].dropna(axis=1, how="all") if f is None else self._convert(f, k, w) for f, k, w in kept]
        self._found, self._rows = {f: [] for f in self._found}, []
        self._losers.clear()
        if len(frames) < 2:
            return frames[0] if frames else pd.DataFrame()
        return pd.concat(frames, ignore_index=True).sort_values("seq", kind="stable", ignore_index=True)

    def _keys(self, fmt: Format, flat: list[Any]) -> dict[str, np.ndarray]:
        """The keys of a regex format's rows (seq, split, step, rank, node); notes the format and ranks seen."""
        index, width = _GROUPS[fmt]
        n, (srun, tag, glob) = len(flat) // width, (flat[index[g] :: width] for g in ("srun", "tag", "glob"))
        rank = node = np.full(n, np.nan)
        if not srun.count(None) == tag.count(None) == n:  # a launcher prefix
            pairs = _each(lambda p: rank_node(*p), list(zip(srun, tag, glob, strict=True)))
            rank, node = np.array(pairs, dtype=float).reshape(-1, 2).T
            self.ranks.update(int(r) for r in np.unique(rank[~np.isnan(rank)]))
        self.formats.add(fmt.name)
        steps = np.fromiter(map(int, flat[index["step"] :: width]), dtype=np.int64, count=n)
        seq, split = np.array(flat[::width], dtype=np.int64), np.full(n, fmt.split, dtype=object)
        return {"seq": seq, "split": split, "step": steps, "rank": rank, "node": node}

    def _convert(self, fmt: Format, keys: dict[str, np.ndarray], wins: slice | np.ndarray) -> pd.DataFrame:
        """A regex format's winning rows (``wins``), their captured strings converted column-wise."""
        (index, width), flat, out = _GROUPS[fmt], self._found[fmt], {c: v[wins] for c, v in keys.items()}
        pick = (lambda c: c) if isinstance(wins, slice) else (lambda c: list(itertools.compress(c, wins)))  # noqa: E731
        n, col = len(out["seq"]), {name: pick(flat[i::width]) for name, i in index.items()}
        if fmt.dated:
            dates = [f"{d}.{ms}" if ms else d for d, ms in _each(fm.head_time, col["_head"])]
            out["time"] = pd.to_datetime(dates, format="ISO8601", errors="coerce")  # no date: NaT
        for name, values in col.items():
            if name in ("elapsed", "remaining"):
                out[f"{name}_s"] = _hms(values)
            elif name == "rate":  # 131.58 s/it or 2.5 it/s -> seconds per step
                v: Any = _floats(["nan" if r in (None, "?") else r for r in values])  # no rate: NaN
                inverse = np.divide(1.0, v, out=np.full(n, math.nan), where=v != 0)
                out["seconds_per_step"] = np.where(np.asarray(col["unit"]) == "s/it", v, inverse)
            elif name in fm.INT_COLUMNS:  # always captured, digits only
                out[name] = out["step"] if name == "step" else np.fromiter(map(int, values), np.int64, n)
            elif name not in ("srun", "tag", "glob", "_head", "unit") and (v := _floats(values)) is not None:
                out[name] = v
        if fmt.name == "torchtitan":  # pipeline parallelism's placeholder on non-last stages
            out["loss"] = np.where(out["loss"] == -1.0, np.nan, out["loss"])
        return pd.DataFrame({**out, "format": fmt.name})


def _winners(keys: list[dict[str, np.ndarray]], ranks: str) -> list[slice | np.ndarray | None]:
    """Per part (rows of one format), the rows that can win their key in line order (``ranks="first"``; None: none)."""
    one = len(keys) == 1 and np.isnan(keys[0]["rank"].astype(float)).all() and (np.diff(keys[0]["step"]) > 0).all()
    if ranks == "all" or not keys or one:  # ranks="all", or one format's steps increasing without ranks: all win
        return [slice(None)] * len(keys)
    df = pd.DataFrame({c: np.concatenate([k[c] for k in keys]) for c in ("seq", "split", "step", "rank")})
    order, wins = np.argsort(df["seq"].to_numpy(), kind="stable"), np.zeros(len(df), dtype=bool)
    wins[order[resolve(df.take(order).reset_index(drop=True), ranks).index.to_numpy()]] = True
    return [w if w.any() else None for w in np.split(wins, np.cumsum([len(k["seq"]) for k in keys])[:-1])]


def _table(collector: Collector, parts: list[pd.DataFrame], ranks: str, source: str) -> pd.DataFrame:
    """The canonical table of the windows' rows (each already reduced), with its ``attrs``."""
    rows = pd.concat([p for p in parts if len(p)] or [pd.DataFrame()], ignore_index=True)
    parts.clear()  # the caller's list: its frames are freed before the table is built
    df = to_frame(rows, ranks=ranks)
    df.attrs.update(source=source, formats=sorted(collector.formats), ranks=sorted(collector.ranks))
    df.attrs["skipped"] = collector.skipped
    return df


def parse_log(path: str | os.PathLike[str], ranks: str = "first") -> pd.DataFrame:
    """Parse a training log (any supported format, detected per line), a TensorBoard event folder, or a run folder
    (its best source: see :func:`best_source`).

    Returns one row per (split, step) -- ``ranks="all"`` keeps one row per (split, step, node, rank). ``df.attrs``
    holds ``source``, ``formats`` (those seen), ``ranks`` (ranks seen) and ``skipped``: a list of ``(line_number,
    text)`` for lines that looked like metrics but matched no format exactly."""
    p = Path(path)
    if p.is_dir():
        kind, src = best_source(p)
        if kind == "tensorboard":
            return read_tensorboard(src)
        p = src
    # windows: rows converted every ``BATCH`` rows (each batch reduced to one row per key) and the rows so
    # far reduced whenever they doubled, so memory follows the result, not the file
    collector, parts, keep, converted, held, reduced = Collector(ranks), [], b"", 0, 0, BATCH
    with open(p, "rb") as f:  # plain reads, not mmap: a log truncated while mapped (a requeue) would SIGBUS
        while True:
            block = f.read(WINDOW)
            data = keep + block if keep else block
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 if block else len(data)
            if cut:
                collector.feed(data[:cut])
            keep = data[cut:] if len(data) - cut <= MAX_PARTIAL else b""
            if collector.seq - converted >= BATCH or not block:
                converted = collector.seq
                parts.append(resolve(collector.frame(ranks), ranks))  # cross-format keys too
                held += len(parts[-1])
                if held > 2 * reduced or not block:  # on the key columns only (at the end: to_frame copies none)
                    keys = pd.concat([p[[c for c in _KEYS if c in p]] for p in parts], ignore_index=True)
                    wins = np.zeros(len(keys), dtype=bool)
                    wins[resolve(keys, ranks).index.to_numpy()] = True
                    spans = np.split(wins, np.cumsum([len(p) for p in parts])[:-1])
                    parts = [p if w.all() else p[w] for p, w in zip(parts, spans, strict=True)]
                    held = reduced = max(int(wins.sum()), BATCH)
            if not block:
                break
    return _table(collector, parts, ranks, str(p))


def parse_text(text: str | bytes, ranks: str = "first") -> pd.DataFrame:
    """Like :func:`parse_log` for log text already in memory (a notebook cell, a test)."""
    collector = Collector(ranks)
    collector.feed(text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass"))
    return _table(collector, [collector.frame(ranks)], ranks, "<text>")


_LOG_GLOBS = ("log_*.txt", "*.log", "*.out", "*.err", "*.txt")


def best_source(folder: str | os.PathLike[str]) -> tuple[str, Path]:
    """The best metrics source in a run folder: ("tensorboard", event folder) when it has TensorBoard event files
    (torchtitan ``tb/``, torchtune's TensorBoardLogger), else ("log", file) -- torchtune's DiskLogger ``log_*.txt``
    first, then the newest ``*.log``/``*.out``/``*.err``/``*.txt`` holding a metrics line."""
    folder = Path(folder)
    if next(folder.rglob("events.out.tfevents*"), None) is not None:
        return "tensorboard", folder
    for pattern in _LOG_GLOBS:
        for f in sorted((f for f in folder.rglob(pattern) if f.is_file()), key=lambda f: -f.stat().st_mtime):
            with open(f, "rb") as fh:
                if _BNEEDLE in fh.read(1 << 20):
                    return "log", f
    raise FileNotFoundError(f"no TensorBoard event files or training log with metrics under {folder}")


# TensorBoard tags (torchtune, torchtitan) -> canonical columns; validation tags get split=validation
TB_TAGS: dict[str, str] = {**fm.ALIASES, "lr/AdamW": "lr", "n_tokens_seen": "tokens_seen"}
_VAL_PREFIX, _TB_COLUMNS = "validation_metrics/", ["tag", "step", "value", "wall_time"]


def read_tensorboard(folder: str | os.PathLike[str]) -> pd.DataFrame:
    """Scalars of a TensorBoard event folder (torchtune or torchtitan) in the same columns as logs. Of several
    runs (sub-folders with event files) the newest is read, the others listed in ``attrs["other_runs"]``."""
    from tbparse import SummaryReader

    newest = lambda d: max(f.stat().st_mtime for f in d.glob("events.out.tfevents*"))  # noqa: E731
    runs = sorted({f.parent for f in Path(folder).rglob("events.out.tfevents*")}, key=newest)
    if not runs:
        raise FileNotFoundError(f"no TensorBoard event files (events.out.tfevents*) under {folder}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tbparse 0.0.9 uses pandas' deprecated inplace sort
        reader = SummaryReader(str(runs[-1]), extra_columns={"wall_time"})
        # torchtitan writes scalar summaries, torchtune (add_scalar via the v2 API) tensor summaries
        tables = [t[_TB_COLUMNS] for t in (reader.scalars, reader.tensors) if len(t)]
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for tag, step, value, wall in (r for t in tables for r in t.itertuples(index=False)):
        split = "validation" if tag.startswith(_VAL_PREFIX) else "train"
        row = rows.setdefault((split, int(step)), {"step": int(step), "split": split, "format": "tensorboard"})
        row[TB_TAGS.get(tag.removeprefix(_VAL_PREFIX), tag.removeprefix(_VAL_PREFIX))] = float(value)
        row["time"] = max(row.get("time", wall), wall)
    df = to_frame([{**r, "time": pd.Timestamp(r["time"], unit="s")} for r in rows.values()])
    df.attrs.update(source=str(runs[-1]), formats=["tensorboard"], ranks=[], skipped=[])
    df.attrs["other_runs"] = [str(d) for d in runs[:-1]]
    return df
