"""One parser per training-log format; each turns one log line into one metrics row (or nothing).

Every format's line contains ``oss`` (``loss``/``Loss``), so a file is scanned by compiled bytes regexes
that start at that literal (or at ``[titan] ``) and so skip noise at memchr-like speed (see :func:`scan`):
standard torchtitan and FSDP lines are matched in bulk over whole 64 MB windows and their numbers
converted per column by numpy; every other line holding the needle is decoded and matched by the
per-line parsers below. A line that looks like a metrics line but matches no format exactly is
reported as skipped: a typo never becomes a wrong number. Commas are read only as thousands separators
(``1,541,366``; ``0,7052`` is a typo), counters (step, epoch, rank ...) have at most 15 digits (exact
in float64), and a timestamp that is no date (``2025-06-37``) gives the row a NaT time.

Formats (``FORMATS`` order is the match order):

- ``torchtitan``: ``[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7052
  grad_norm: 2.9  memory: 76.79GiB(96.97%)  tps: 1,541,366  tflops: 0.00  mfu: 0.00%`` (ANSI colours,
  ``[rank0]:``/``[default0]:``/``0: `` prefixes, optional grad_norm/tflops/mfu, ``mfu: N/A``, ``wps``)
- ``torchtitan-validation``: ``validate step:  3  loss:  7.1  memory: ...  tps: 1,234``
- ``torchtune-tqdm``: ``1|2|Loss: 1.2548030614852905:   0%|   | 2/1367 [05:03<49:53:19, 131.58s/it]``
- ``torchtune-disk``: ``Step 1 | loss:6.22 lr:0.001 tokens_per_second_per_gpu:273.99 ``
- ``fsdp``: ``0: 2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: 11.61653, Speed: 4.88 samples/sec,
  lr: 0.000100`` (our ``fsdp_train.py`` adds ``, tokens_per_second_per_gpu: 3712.0, mfu: 38.12%``/``N/A``)
- ``jsonl``: ``{"step": 1, "loss": 6.2, ...}`` (one JSON object per line)
"""

from __future__ import annotations

import json
import math
import mmap
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import regex

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

NEEDLE = b"oss"  # in every format's metrics line: loss / Loss / "loss"

_INT_PART = r"(?:\d{1,3}(?:,\d{3})+|\d+)"    # commas only as thousands separators
_NUM = rf"-?(?:{_INT_PART}(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
_NUM_RE = re.compile(_NUM)
INT_COLUMNS = ("step", "epoch", "progress", "total_steps", "rank")
_INT_LIMIT = 10 ** 15            # counters of up to 15 digits: exact in float64 (and int64)
_COUNTER = rb"\d{1,15}"          # the same limit in the bulk and fast regexes
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# srun -l "0: ", torchrun --tee "[default0]:", torch "[rank0]:" (in any combination, in this order)
_PREFIX = re.compile(r"^\s*(?:(?P<srun>\d+):\s)?\s*(?:\[(?:rank|default)(?P<rank>\d+)\]:)?")
_TITAN_TIME = re.compile(r"\[titan\]\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")

_TITAN = re.compile(
    rf"(?<![\w ])\s*step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})"
    rf"(?:\s+grad_norm:\s*(?P<grad_norm>{_NUM}))?"
    rf"(?:\s+memory:\s*(?P<memory_gib>{_NUM})GiB\((?P<memory_pct>{_NUM})%\))?"
    rf"(?:\s+[tw]ps:\s*(?P<tokens_per_second_per_gpu>{_NUM}))?"
    rf"(?:\s+tflops:\s*(?P<tflops>{_NUM}))?"
    rf"(?:\s+mfu:\s*(?:(?P<mfu_pct>{_NUM})%|N/A))?"
    r"\s*\|?\s*$")
_TITAN_VAL = re.compile(
    rf"validate step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})"
    rf"(?:\s+memory:\s*(?P<memory_gib>{_NUM})GiB\((?P<memory_pct>{_NUM})%\))?"
    rf"(?:\s+[tw]ps:\s*(?P<tokens_per_second_per_gpu>{_NUM}))?"
    r"\s*$")
_TQDM = re.compile(
    rf"(?:^|\s)(?P<epoch>\d+)\|(?P<step>\d+)\|Loss:\s*(?P<loss>{_NUM}):\s*\d+%\|[^|]*\|\s*"
    r"(?P<progress>\d+)/(?P<total_steps>\d+)\s*"
    r"\[(?P<elapsed>\d+(?::\d+)*)<(?P<remaining>\d+(?::\d+)*|\?)"
    r"(?:,\s*(?P<rate>\d+(?:\.\d+)?|\?)(?P<unit>s/it|it/s))?\]")
_DISK = re.compile(r"^Step (?P<step>\d+) \| (?P<pairs>(?:[\w/.()%-]+:\S+ ?)+)\s*$")
_FSDP = re.compile(
    rf"Batch (?P<step>\d+) Loss: (?P<loss>{_NUM}), Speed: (?P<samples_per_second>{_NUM}) samples/sec"
    rf"(?:, lr: (?P<lr>{_NUM}))?(?:, tokens_per_second_per_gpu: (?P<tokens_per_second_per_gpu>{_NUM}))?"
    rf"(?:, mfu: (?:(?P<mfu_pct>{_NUM})%|N/A))?\s*$")  # the last two: our own fsdp_train.py
# Looks like a metrics line (so a non-match is worth reporting): a step/batch counter and a loss.
_LOOKS_LIKE = re.compile(r"(?i)(?:\b(?:step|batch)\b\"?[\s:=]*\d+|\d+\|\d+\|).*?\bloss\b")

# DiskLogger / jsonl / TensorBoard names -> canonical column names
ALIASES: dict[str, str] = {
    "throughput(tps)": "tokens_per_second_per_gpu",
    "tps": "tokens_per_second_per_gpu",
    "loss_metrics/global_avg_loss": "loss",
    "mfu(%)": "mfu_pct",
    "mfu": "mfu_pct",
    "memory/max_reserved(GiB)": "memory_gib",
    "memory/max_reserved(%)": "memory_pct",
    "peak_memory_reserved": "memory_gib",
    "lr": "lr",
}

Row = dict[str, Any]


def to_number(text: str) -> float:
    """``"1,541,366"`` -> 1541366.0, ``"nan"`` -> nan; raises ValueError on anything else (``"0,7052"``)."""
    if not _NUM_RE.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text.replace(",", ""))


def _time(text: str) -> np.datetime64:
    """``"2025-06-10 21:58:27.008"`` -> datetime64[ms]; NaT if it is no date (``2025-06-37``)."""
    try:
        return np.datetime64(text, "ms")
    except ValueError:
        return np.datetime64("NaT", "ms")


def _times(col: np.ndarray) -> np.ndarray:
    """A column of captured timestamps (bytes) -> datetime64[ms], NaT where one is no date."""
    try:
        return col.astype("datetime64[ms]")
    except ValueError:
        return np.array([_time(v.decode()) for v in col], dtype="datetime64[ms]")


def _hms(text: str) -> float | None:
    """tqdm's ``05:03`` / ``49:53:19`` -> seconds; None for ``?``."""
    if "?" in text:
        return None
    secs = 0.0
    for part in text.split(":"):
        secs = secs * 60 + int(part)
    return secs


def _numbers(m: re.Match, skip: tuple[str, ...] = ()) -> Row:
    return {k: to_number(v) for k, v in m.groupdict().items() if v is not None and k not in skip}


def _titan(line: str) -> Row | None:
    if "validate step:" in line:
        m = _TITAN_VAL.search(line)
        split = "validation"
    else:
        m = _TITAN.search(line)
        split = "train"
    if not m:
        return None
    row = _numbers(m)
    row["split"] = split
    t = _TITAN_TIME.search(line, 0, m.start())
    if t:
        row["time"] = _time(f"{t.group(1)}.{t.group(2)}")
    return row


def _tqdm(line: str) -> Row | None:
    m = _TQDM.search(line)
    if not m:
        return None
    row = _numbers(m, skip=("elapsed", "remaining", "rate", "unit"))
    row["elapsed_s"] = _hms(m["elapsed"])
    row["remaining_s"] = _hms(m["remaining"])
    if m["rate"] and "?" not in m["rate"]:
        rate = float(m["rate"])
        row["seconds_per_step"] = rate if m["unit"] == "s/it" else (1 / rate if rate else math.nan)
    row["split"] = "train"
    return row


def _disk(line: str) -> Row | None:
    m = _DISK.match(line.strip(" \t"))
    if not m:
        return None
    row: Row = {"step": float(m["step"]), "split": "train"}
    for pair in m["pairs"].split():
        key, _, value = pair.rpartition(":")
        try:
            row[ALIASES.get(key, key)] = to_number(value)
        except ValueError:
            return None  # a malformed value: skip the line rather than guess
    return row


def _fsdp(line: str) -> Row | None:
    m = _FSDP.search(line)
    if not m:
        return None
    row = _numbers(m)
    row["split"] = "train"
    t = _ISO_TIME.search(line, 0, m.start())
    if t:
        row["time"] = _time(t.group(1))
    return row


def _jsonl(line: str) -> Row | None:
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or "step" not in obj:
        return None
    row: Row = {"split": "validation" if str(obj.get("split", "")).startswith("val") else "train"}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            row[ALIASES.get(key, key)] = float(value)
        except OverflowError:        # an int beyond float64
            return None
    has_loss = any("loss" in k for k in row)
    return row if "step" in row and has_loss else None


@dataclass(frozen=True)
class LineFormat:
    """A log format: its name, a cheap substring test, the line parser, and which duplicate wins."""

    name: str
    marker: str
    parse: Callable[[str], Row | None]
    keep: str = "last"   # "first" for tqdm (a step's first line has its own timing)


FORMATS: tuple[LineFormat, ...] = (
    LineFormat("torchtitan", "step:", _titan),
    LineFormat("torchtune-tqdm", "|Loss:", _tqdm, keep="first"),
    LineFormat("torchtune-disk", "Step ", _disk),
    LineFormat("fsdp", "Batch ", _fsdp),
    LineFormat("jsonl", "{", _jsonl),
)


def strip_line(raw: str) -> tuple[str, int | None]:
    """Remove ANSI colours and rank prefixes; return (text, rank or None)."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw
    m = _PREFIX.match(text)
    rank = None
    if m and m.end():
        r = m["rank"] if m["rank"] is not None else m["srun"]
        rank = int(r) if r is not None else None
        text = text[m.end():]
    return text.rstrip("\r\n"), rank


def _counters_ok(row: Row) -> bool:
    """Step, epoch, rank ... are finite and below ``_INT_LIMIT`` (else a garbled line: skip it)."""
    return all(math.isfinite(v) and abs(v) < _INT_LIMIT for k in INT_COLUMNS if (v := row.get(k)) is not None)


def parse_line(raw: str) -> tuple[Row | None, bool]:
    """Parse one line; return (row with ``format``/``rank``, looks_like_metrics)."""
    text, rank = strip_line(raw)
    for fmt in FORMATS:
        if fmt.marker in text:
            row = fmt.parse(text)
            if row is not None:
                row["format"] = fmt.name
                if rank is not None:
                    row["rank"] = rank
                if not _counters_ok(row):
                    return None, True
                return row, True
    return None, bool(_LOOKS_LIKE.search(text))


# Bulk scan: ONE compiled bytes regex (the `regex` module: variable-width lookbehind) runs over a whole
# 64 MB window with findall. Its branches, each anchored on a literal so the engine jumps from hit to
# hit at memchr-like speed through NCCL noise:
#   - the standard torchtitan train / validation lines and the FSDP line, matched from the literal to the
#     end of the line, the line's start (rank prefixes, timestamp) checked and captured by a lookbehind;
#   - ``oss`` (the NEEDLE) to the end of the line: any other line that may hold metrics. Those (rare in
#     big logs) are found again with their offsets and go through the per-line parsers above, so their
#     rows, rank prefixes and skipped-line reports are exactly what ``parse_line`` gives.
# Leftmost match wins and every branch consumes the rest of its line, so each line is taken once.
_A = rb"(?:\x1b\[[0-9;]*[A-Za-z])*"                   # ANSI colours, allowed before each field
_N = _NUM.encode()
_LINE_START = (rb"(?:^|[\n\r])(?:(?P<{b}_srun>" + _COUNTER + rb"): )?(?:\[(?:rank|default)(?P<{b}_rank>" + _COUNTER
               + rb")\]:)?")
_TITAN_HEAD = (rb"\[titan\] (?P<{b}_time>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<{b}_ms>\d{{3}}) - [\w.]+ - INFO - "
               + _A)
_EOL = rb"(?=[\r\n]|\Z)"


def _fields(b: str, names: tuple[str, ...]) -> bytes:
    parts = {
        "loss": rb":[ \t]*(?P<{b}_loss>" + _N + rb")",
        "grad_norm": rb"(?:[ \t]+" + _A + rb"grad_norm:[ \t]*(?P<{b}_grad_norm>" + _N + rb"))?",
        "memory": (rb"(?:[ \t]+" + _A + rb"memory:[ \t]*(?P<{b}_memory_gib>" + _N + rb")GiB\((?P<{b}_memory_pct>"
                   + _N + rb")%\))?"),
        "tps": rb"(?:[ \t]+" + _A + rb"[tw]ps:[ \t]*(?P<{b}_tokens_per_second_per_gpu>" + _N + rb"))?",
        "tflops": rb"(?:[ \t]+" + _A + rb"tflops:[ \t]*(?P<{b}_tflops>" + _N + rb"))?",
        "mfu": rb"(?:[ \t]+" + _A + rb"mfu:[ \t]*(?:(?P<{b}_mfu_pct>" + _N + rb")%|N/A))?",
    }
    return b"".join(parts[n] for n in names).replace(b"{b}", b.encode())


def _lookbehind(b: str, pattern: bytes) -> bytes:
    return b"(?<=" + pattern.replace(b"{b}", b.encode()).replace(b"{{", b"{").replace(b"}}", b"}") + b")"


_STEP = rb"[ \t]*(?P<{b}_step>" + _COUNTER + rb")[ \t]+" + _A
# Every branch starts at the literal NEEDLE, so the engine's literal search does the skipping; what the
# line holds before the needle (prefixes, timestamp, step) is matched and captured by a lookbehind.
_BULK_RE = regex.compile(NEEDLE + b"(?:" + b"|".join([
    _lookbehind("t", _LINE_START + _TITAN_HEAD + b"step:" + _STEP + b"loss")
    + _fields("t", ("loss", "grad_norm", "memory", "tps", "tflops", "mfu")) + _A + rb"[ \t]*\|?[ \t]*" + _EOL,
    _lookbehind("v", _LINE_START + _TITAN_HEAD + b"validate step:" + _STEP + b"loss")
    + _fields("v", ("loss", "memory", "tps")) + _A + rb"[ \t]*" + _EOL,
    _lookbehind("f", _LINE_START + rb"(?P<{b}_time>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d) \w \[[^\]\n\r]*\] "
                rb"Batch (?P<{b}_step>" + _COUNTER + rb") Loss")
    + rb": (?P<f_loss>" + _N + rb"), Speed: (?P<f_samples_per_second>" + _N
    + rb") samples/sec(?:, lr: (?P<f_lr>" + _N + rb"))?(?:, tokens_per_second_per_gpu: "
    rb"(?P<f_tokens_per_second_per_gpu>" + _N + rb"))?(?:, mfu: (?:(?P<f_mfu_pct>" + _N + rb")%|N/A))?[ \t]*"
    + _EOL,
    rb"[^\n\r]*",                      # any other line with the needle: per-line parsers
]) + b")")
# branch -> (format name, split, its group names without the branch prefix)
_BRANCHES = {"t": ("torchtitan", "train"), "v": ("torchtitan", "validation"), "f": ("fsdp", "train")}
_GROUPS = {b: {name[2:]: idx - 1 for name, idx in _BULK_RE.groupindex.items() if name.startswith(b + "_")}
           for b in _BRANCHES}


def _floats(col: "np.ndarray") -> "np.ndarray | None":
    """Captured byte strings -> float64 (b"" -> NaN); None if the group never matched."""
    import numpy as np

    empty = col == b""
    if empty.all():
        return None
    if (np.strings.find(col, b",") >= 0).any():       # tps: 1,541,366
        col = np.strings.replace(col, b",", b"")
    if empty.any():
        col = np.where(empty, b"nan", col)
    return col.astype(np.float64)


def _bulk_frame(branch: str, cols: list[tuple[bytes, ...]], rows: "np.ndarray | None") -> "pd.DataFrame":
    """One branch's matches (columns of findall's tuples; ``rows`` selects this branch's) as raw rows."""
    import numpy as np
    import pandas as pd

    def column(name: str) -> "np.ndarray":
        a = np.array(cols[_GROUPS[branch][name]])
        return a if rows is None else a[rows]

    name, split = _BRANCHES[branch]
    out: dict[str, object] = {}
    for field in _GROUPS[branch]:
        if field in ("srun", "rank", "time", "ms"):
            continue
        values = column(field).astype(np.int64) if field == "step" else _floats(column(field))
        if values is not None:
            out[field] = values
    n = len(out["step"])
    rank, srun = column("rank"), column("srun")
    rank = np.where(rank == b"", srun, rank)
    out["rank"] = np.where(rank == b"", b"nan", rank).astype(np.float64)
    time = column("time")
    if "ms" in _GROUPS[branch]:
        time = np.strings.add(np.strings.add(time, b"."), column("ms"))
    out["time"] = _times(time)
    out["split"] = np.full(n, split, dtype=object)
    out["format"] = np.full(n, name, dtype=object)
    return pd.DataFrame(out)


# Fast path for the layout of big torchtitan logs (train lines with every field, validation lines), in
# two passes:
#   1. stdlib `re` (faster than `regex` going forward) from each ``[titan] `` literal to the end of its line:
#      timestamp, step and every field, with the same strict grammar as the general path but no
#      optional fields (a line of another shape makes the whole range take the general path);
#   2. `regex` from each NEEDLE back to the line start (a lookbehind): the rank prefixes, and proof that
#      the needle is in a ``[titan] `` line.
# They are zipped only when they provably describe the same lines: every ``[titan] `` starts a complete
# line (which holds ``loss:``), every needle is in such a line, and the counts agree -- so each line
# holds one needle and no needle is anywhere else. Otherwise the general path runs.
_FN = rb"(-?(?:" + _INT_PART.encode() + rb"(?:\.\d*)?|\.\d+)|-?nan|-?inf)"  # _NUM without exponents (general path)
_GAP = rb"[ \t]+" + _A
_FAST_BODY = re.compile(
    rb"\[titan\] (?:(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - [\w.]+ - INFO - " + _A + rb"(?:"
    rb"step:[ \t]*(" + _COUNTER + rb")" + _GAP + rb"loss:[ \t]*" + _FN + _GAP + rb"grad_norm:[ \t]*" + _FN + _GAP
    + rb"memory:[ \t]*" + _FN + rb"GiB\(" + _FN + rb"%\)" + _GAP + rb"[tw]ps:[ \t]*" + _FN + _GAP
    + rb"tflops:[ \t]*" + _FN + _GAP + rb"mfu:[ \t]*(?:" + _FN + rb"%|N/A)" + _A + rb"[ \t]*\|?[ \t]*" + _EOL
    + rb"|validate step:[ \t]*(" + _COUNTER + rb")" + _GAP + rb"loss:[ \t]*" + _FN + _GAP + rb"memory:[ \t]*" + _FN
    + rb"GiB\(" + _FN + rb"%\)" + _GAP + rb"[tw]ps:[ \t]*" + _FN + _A + rb"[ \t]*" + _EOL + rb")|)")
_FAST_PREFIX = regex.compile(NEEDLE + rb"(?:(?<=(?:^|[\n\r])(?:(" + _COUNTER + rb"): )?(?:\[(?:rank|default)("
                             + _COUNTER + rb")\]:)?"
                             rb"(\[)titan\] [^\n\r]*" + NEEDLE + rb")|)")
# columns of _FAST_BODY after (time, ms)
_T_FIELDS = ("step", "loss", "grad_norm", "memory_gib", "memory_pct", "tokens_per_second_per_gpu", "tflops",
             "mfu_pct")
_V_FIELDS = ("step", "loss", "memory_gib", "memory_pct", "tokens_per_second_per_gpu")


def _fast_titan(buf: bytes | mmap.mmap, start: int, end: int) -> "pd.DataFrame | None":
    """Rows of ``buf[start:end]`` if it is a standard torchtitan log (see above), else None."""
    import pandas as pd

    body = _FAST_BODY.findall(buf, start, end)
    if not body:
        return None
    prefixes = _FAST_PREFIX.findall(buf, start, end)
    if len(body) != len(prefixes):
        return None
    cols = np.array(body).T          # one fixed-width bytes array: columns are views, no per-cell objects
    pcols = np.array(prefixes).T
    if not (pcols[2] != b"").all() or not (cols[0] != b"").all():   # needle outside titan lines / bad line
        return None
    train = cols[2] != b""
    n_train = int(train.sum())
    groups = []
    if n_train:
        groups.append((_T_FIELDS, 2, None if n_train == len(body) else train, "train"))
    if n_train < len(body):
        groups.append((_V_FIELDS, 2 + len(_T_FIELDS), None if n_train == 0 else ~train, "validation"))
    parts = []
    for fields, first, rows, split in groups:
        out: dict[str, object] = {}
        for i, field in enumerate(fields):
            index = first + i
            col = cols[index] if rows is None else cols[index][rows]
            try:
                values = col.astype(np.int64) if field == "step" else _floats(col)
            except ValueError:
                return None
            if values is not None:
                out[field] = values
        n = len(out["step"])
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])
        rank, srun = pick(pcols[1]), pick(pcols[0])
        rank = np.where(rank == b"", srun, rank)
        out["rank"] = np.where(rank == b"", b"nan", rank).astype(np.float64)
        stamp = np.strings.add(np.strings.add(pick(cols[0]), b"."), pick(cols[1]))
        out["time"] = _times(stamp)
        out["split"] = np.full(n, split, dtype=object)
        out["format"] = np.full(n, "torchtitan", dtype=object)
        parts.append(pd.DataFrame(out))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def scan(buf: bytes | mmap.mmap, start: int = 0, end: int | None = None) -> tuple[list, list[tuple[int, str]]]:
    """Metrics in ``buf[start:end]`` (which should start at a line start): a list of DataFrames (raw
    columns) and (byte offset, text) of lines that looked like metrics but matched no format.

    A range that is a standard torchtitan log takes :func:`_fast_titan`; otherwise the big-log formats
    (torchtitan and FSDP lines) come out of one ``findall`` over the whole range (see ``_BULK_RE``) and
    every other line holding the NEEDLE goes through :func:`parse_line`.
    """
    import pandas as pd

    end = len(buf) if end is None else end
    fast = _fast_titan(buf, start, end)
    if fast is not None:
        return [fast], []
    found = _BULK_RE.findall(buf, start, end)
    if not found:
        return [], []
    cols = list(zip(*found))
    frames: list = []
    n_other = len(found)
    for branch in _BRANCHES:
        hit = np.array(cols[_GROUPS[branch]["step"]]) != b""
        count = int(hit.sum())
        if count:
            frames.append(_bulk_frame(branch, cols, None if count == len(found) else hit))
            n_other -= count
    if not n_other:                    # the usual case: every candidate line was a standard one
        return frames, []
    rows: list[Row] = []
    skipped: list[tuple[int, str]] = []
    steps = [_GROUPS[b]["step"] + 1 for b in _BRANCHES]
    for m in _BULK_RE.finditer(buf, start, end):
        if any(m.start(g) >= 0 for g in steps):
            continue
        line_start = max(buf.rfind(b"\n", start, m.start()), buf.rfind(b"\r", start, m.start()), start - 1) + 1
        raw = bytes(buf[line_start:m.end()]).decode("utf-8", errors="replace")
        if "\x1b" in raw:
            raw = _ANSI.sub("", raw)
        row, looks = parse_line(raw)
        if row is not None:
            rows.append(row)
        elif looks:
            skipped.append((line_start, raw.strip()[:300]))
    if rows:
        frames.append(pd.DataFrame.from_records(rows))
    return frames, skipped


KEEP = {fmt.name: fmt.keep for fmt in FORMATS}
