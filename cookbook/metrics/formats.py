"""One parser per training-log format; each turns one log line into one metrics row (or nothing).

Every format's line contains ``oss`` (``loss``/``Loss``), so a file is scanned with a fast byte
search for that needle and only those lines are decoded and matched (see :func:`scan`). A line that
looks like a metrics line but matches no format exactly is reported as skipped: a typo never becomes
a wrong number.

Formats (``FORMATS`` order is the match order):

- ``torchtitan``: ``[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7052
  grad_norm: 2.9  memory: 76.79GiB(96.97%)  tps: 1,541,366  tflops: 0.00  mfu: 0.00%`` (ANSI colours,
  ``[rank0]:``/``[default0]:``/``0: `` prefixes, optional grad_norm/tflops/mfu, ``mfu: N/A``, ``wps``)
- ``torchtitan-validation``: ``validate step:  3  loss:  7.1  memory: ...  tps: 1,234``
- ``torchtune-tqdm``: ``1|2|Loss: 1.2548030614852905:   0%|   | 2/1367 [05:03<49:53:19, 131.58s/it]``
- ``torchtune-disk``: ``Step 1 | loss:6.22 lr:0.001 tokens_per_second_per_gpu:273.99 ``
- ``fsdp``: ``0: 2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: 11.61653, Speed: 4.88 samples/sec,
  lr: 0.000100``
- ``jsonl``: ``{"step": 1, "loss": 6.2, ...}`` (one JSON object per line)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

NEEDLE = b"oss"  # in every format's metrics line: loss / Loss / "loss"

_NUM = r"-?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
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
    r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)(?:,\s*(?P<rate>[\d.?]+)(?P<unit>s/it|it/s))?\]")
_DISK = re.compile(r"^Step (?P<step>\d+) \| (?P<pairs>(?:[\w/.()%-]+:\S+ ?)+)\s*$")
_FSDP = re.compile(
    rf"Batch (?P<step>\d+) Loss: (?P<loss>{_NUM}), Speed: (?P<samples_per_second>{_NUM}) samples/sec"
    rf"(?:, lr: (?P<lr>{_NUM}))?\s*$")
# Looks like a metrics line (so a non-match is worth reporting): a step/batch counter and a loss.
_LOOKS_LIKE = re.compile(r"(?i)(?:\b(?:step|batch)\b[\s:=]*\d+|\d+\|\d+\|).*?\bloss\b")

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
    """``"1,541,366"`` -> 1541366.0, ``"nan"`` -> nan; raises ValueError on anything else."""
    value = float(text.replace(",", ""))
    return value


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
        row["time"] = f"{t.group(1)}.{t.group(2)}"
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
        row["time"] = t.group(1)
    return row


def _jsonl(line: str) -> Row | None:
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "step" not in obj:
        return None
    row: Row = {"split": "validation" if str(obj.get("split", "")).startswith("val") else "train"}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        row[ALIASES.get(key, key)] = float(value)
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
                return row, True
    return None, bool(_LOOKS_LIKE.search(text))


def candidate_lines(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of every line in ``buf[start:end]`` containing NEEDLE; ``\\r`` also ends a line.

    ``bytes.find`` does the scanning, so lines without the needle (NCCL INFO noise) cost almost nothing.
    """
    end = len(buf) if end is None else end
    find, rfind = buf.find, buf.rfind
    pos = find(NEEDLE, start, end)
    while pos != -1:
        nl = rfind(b"\n", start, pos) + 1
        cr = rfind(b"\r", nl, pos) + 1
        line_start = max(nl, cr, start)
        line_end = find(b"\n", pos, end)
        if line_end == -1:
            line_end = end
        cr_end = find(b"\r", pos, line_end)
        if cr_end != -1:
            line_end = cr_end
        yield line_start, bytes(buf[line_start:line_end])
        pos = find(NEEDLE, line_end, end)


# Formats parsed in bulk: one multi-line regex over all candidate lines at once (no per-line Python).
# Each pattern captures the srun/torch rank prefixes, an optional timestamp, then the format's fields.
# Strict fast patterns for the standard layout; anything else (tables, odd prefixes) goes per line.
_LINE_PREFIX = r"^(?:(?P<srun>\d+): )?(?:\[(?:rank|default)(?P<rank>\d+)\]:)?"
_EOL_AHEAD = "(?=\n|\\Z)"
_BULK: tuple[tuple[str, str, re.Pattern], ...] = (
    ("torchtitan", "step:", re.compile(
        _LINE_PREFIX + r"\[titan\] (?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) - [\w.]+ - INFO - "
        r"(?P<validate>validate )?" + _TITAN.pattern[len(r"(?<![\w ])\s*"):].replace(r"\s", r"[ \t]")
        .replace("$", _EOL_AHEAD), re.M)),
    ("fsdp", "Batch ", re.compile(
        _LINE_PREFIX + r"(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \w \[[^\]\n]*\] "
        + _FSDP.pattern.replace(r"\s", r"[ \t]").replace("$", _EOL_AHEAD), re.M)),
)


def _bulk_frame(name: str, found: list[tuple], pattern: re.Pattern) -> "pd.DataFrame":
    import pandas as pd

    cols = list(pattern.groupindex)
    df = pd.DataFrame(found, columns=cols, dtype=object).replace("", None)
    out = pd.DataFrame(index=df.index)
    for col in cols:
        if col in ("srun", "rank", "time", "ms", "validate") or df[col].isna().all():
            continue
        values = df[col].str.replace(",", "", regex=False) if df[col].str.contains(",", regex=False).any() \
            else df[col]
        out[col] = pd.to_numeric(values, errors="coerce")
    out["rank"] = pd.to_numeric(df["rank"].fillna(df["srun"]), errors="coerce")
    if df["time"].notna().any():
        out["time"] = df["time"] + ("." + df["ms"]).fillna("") if "ms" in df else df["time"]
    out["split"] = df["validate"].notna().map({True: "validation", False: "train"}) if "validate" in df \
        else "train"
    out["format"] = name
    return out


def scan(buf: bytes, start: int = 0, end: int | None = None) -> tuple[list, list[tuple[int, str]]]:
    """Metrics in ``buf[start:end]``: a list of DataFrames (raw columns) and (byte offset, text) of lines
    that looked like metrics but matched no format.

    The common big-log formats (torchtitan, FSDP) are matched in bulk by one regex over all candidate
    lines; the remaining lines go through the per-line parsers.
    """
    import pandas as pd

    offsets, raws = [], []
    for off, raw in candidate_lines(buf, start, end):
        offsets.append(off)
        raws.append(raw)
    if not raws:
        return [], []
    lines = b"\n".join(raws).decode("utf-8", errors="replace")
    if "\x1b" in lines:
        lines = _ANSI.sub("", lines)
    lines = lines.split("\n")
    frames: list = []
    todo = list(range(len(lines)))
    for name, marker, pattern in _BULK:
        subset = [i for i in todo if marker in lines[i]]
        if not subset:
            continue
        text = "\n".join(lines[i] for i in subset)
        found = pattern.findall(text)          # tuples straight from C: the fast path
        if len(found) == len(subset):           # every candidate line matched (the usual case)
            done = set(subset)
        else:                                   # some did not: find out which, by position
            line_at, pos = {}, 0
            for i in subset:
                line_at[pos] = i
                pos += len(lines[i]) + 1
            matches = [m for m in pattern.finditer(text) if m.start() in line_at]
            found = [m.groups() for m in matches]
            done = {line_at[m.start()] for m in matches}
        if found:
            frames.append(_bulk_frame(name, found, pattern))
            todo = [i for i in todo if i not in done]
    rows: list[Row] = []
    skipped: list[tuple[int, str]] = []
    for i in todo:
        row, looks = parse_line(lines[i])
        if row is not None:
            rows.append(row)
        elif looks:
            skipped.append((offsets[i], lines[i].strip()[:300]))
    if rows:
        frames.append(pd.DataFrame.from_records(rows))
    return frames, skipped


KEEP = {fmt.name: fmt.keep for fmt in FORMATS}
