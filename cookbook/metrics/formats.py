"""The grammar: one compiled regex per training-log format, the line prefixes, and how a line is read.

Every format's metrics line holds ``oss`` (``loss``, ``Loss``): only lines holding it are matched. A line that looks
like a metrics line but matches no format exactly is reported as skipped, unless it loses its step anyway (parse.py):
a typo never becomes a wrong number. Commas are only thousands separators (``0,7052``: a typo), counters (step, rank
...) have at most 15 digits (exact in float64), a date like ``2025-06-37`` gives NaT. ``FORMATS`` order is match order:

- ``torchtitan``: ``[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7052  grad_norm: 2.9
  memory: 76.79GiB(96.97%)  tps: 1,541,366  tflops: 0.00  mfu: 0.00%`` (ANSI colours, optional fields,
  ``mfu: N/A``, ``wps``; ``validate step:`` is the validation split; ``loss: -1.0000`` is pipeline
  parallelism's placeholder on ranks without the last stage: a missing value)
- ``torchtune-tqdm``: ``1|2|Loss: 1.2548:   0%|   | 2/1367 [05:03<49:53:19, 131.58s/it]`` (``]`` may be cut)
- ``torchtune-disk``: ``Step 1 | loss:6.22 lr:0.001 tokens_per_second_per_gpu:273.99``
- ``fsdp``: ``0: 2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: 11.61653, Speed: 4.88 samples/sec,
  lr: 0.000100`` (our ``fsdp_train.py`` adds ``, tokens_per_second_per_gpu: 3712.0, mfu: 38.12%``/``N/A``)
- ``jsonl``: ``{"step": 1, "loss": 6.2, ...}`` (one JSON object per line)

Line prefixes (each optional, in this order): an ``srun --label`` number ``12: ``; a launcher tag ``[rank3]:``
(torch), ``[default3]:`` (torchrun ``--tee``), ``[trainer0|8]:`` (torchtune multi-node: the global rank is after
``|``) or ``[3]:``. With a tag, its number is ``rank`` and the srun number ``node`` (one srun task per node running
torchrun); with only an srun number, that is the ``rank``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NEEDLE = "oss"  # in every format's metrics line: loss / Loss / "loss"

# commas only as thousands separators; possessive (faster): no format has a digit, ",digit", "." or "e" after a number
_NUM = r"-?(?:\d++(?!,\d)|\d{1,3}(?:,\d{3})++)(?:\.\d*+)?(?:[eE][-+]?\d++)?|-?\.\d++(?:[eE][-+]?\d++)?|-?nan|-?inf"
_NUM_RE = re.compile(_NUM)
_C = r"\d{1,15}"  # counters: exact in float64 (and int64)
INT_COLUMNS = ("step", "epoch", "progress", "total_steps", "rank", "node")
_INT_LIMIT = 10**15
_A = r"(?:\x1b\[[0-9;]*+[A-Za-z])*+"  # ANSI colours, allowed before each field
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX = rf"{_A}\s*(?:(?P<srun>{_C}):\s)?\s*{_A}(?:\[[A-Za-z_]*(?P<tag>{_C})(?:\|(?P<glob>{_C}))?\]:)?"
PREFIX = re.compile(_PREFIX)
_PREFIX_START = set("0123456789[ \t\x1b")
_DATE = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[,.](\d{3}))?")
# Looks like a metrics line (so a non-match is worth reporting): a step/batch counter and a loss.
_LOOKS_LIKE = re.compile(r"(?i)(?:\b(?:step|batch)\b\"?[\s:=]*\d+|\d+\|\d+\|).*?\bloss\b")


def _f(name: str, label: str, unit: str = "") -> str:
    """An optional ``label: NUMBER`` field (after blanks and ANSI colours)."""
    return rf"(?:\s++{_A}{label}:\s*+(?P<{name}>{_NUM}){unit})?"


_MEMORY = rf"(?:\s++{_A}memory:\s*+(?P<memory_gib>{_NUM})GiB\((?P<memory_pct>{_NUM})%\))?"
_MFU = rf"(?:\s++{_A}mfu:\s*+(?:(?P<mfu_pct>{_NUM})%|N/A))?"
_HEAD = r"(?P<_head>(?!\d{16}).*?)"  # the text before a format's key: holds the date, no garbled number
_DISK_STEP = rf"Step (?P<step>{_C}) \| "  # a DiskLogger line's start (its key)


def _line(key: str, rest: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The regex of a format's line up to ``key`` (see :func:`parse_line`) and its whole regex, matched from the line
    start: the launcher prefix (groups ``srun``, ``tag``, ``glob``), anything (``_head``, holding the date; not a
    garbled 16-digit number), ``key`` (up to the step: :class:`~.parse.Collector`) and ``rest``."""
    return re.compile(_PREFIX + _HEAD + key), re.compile(_PREFIX + _HEAD + key + rest)


@dataclass(frozen=True, eq=False)  # hashed by identity: a cheap dict key
class Format:
    """One log format. A regex format's named groups are its columns (converted by kind: counters in ``INT_COLUMNS``,
    ``elapsed``/``remaining`` as h:m:s, ``rate``+``unit`` as seconds per step, the rest numbers); a format without
    a regex has a ``parse`` function returning a row dict."""

    name: str
    marker: str  # a substring every line of the format holds (cheap test first)
    key: re.Pattern[str]  # the line up to its step (group ``step``), matched from its start
    regex: re.Pattern[str] | None = None
    split: str = "train"
    dated: bool = False  # take the time from the date before the match (the line's head)
    parse: Callable[[str], dict[str, Any] | None] | None = None


def _disk(line: str) -> dict[str, Any] | None:
    m = re.match(_DISK_STEP + r"(?P<pairs>(?:[\w/.()%-]+:\S+ ?)+)\s*$", line.strip(" \t"))
    if not m:
        return None
    row: dict[str, Any] = {"step": float(m["step"])}
    for pair in m["pairs"].split():
        key, _, value = pair.rpartition(":")
        if not _NUM_RE.fullmatch(value):
            return None  # a malformed value: skip the line rather than guess
        row[ALIASES.get(key, key)] = float(value.replace(",", ""))
    return row


def _jsonl(line: str) -> dict[str, Any] | None:
    text = line.strip()
    try:
        obj = json.loads(text) if text.startswith("{") and text.endswith("}") else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or "step" not in obj:
        return None
    row: dict[str, Any] = {"split": "validation" if str(obj.get("split", "")).startswith("val") else "train"}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            row[ALIASES.get(key, str(key))] = float(value)
        except OverflowError:  # an int beyond float64
            return None
    return row if "step" in row and any("loss" in k for k in row) else None


# fmt: off
FORMATS: tuple[Format, ...] = (
    Format("torchtitan", "validate step:", *_line(
        rf"validate step:\s*+(?P<step>{_C})\s++{_A}loss:",
        rf"\s*+(?P<loss>{_NUM}){_MEMORY}" + _f("tokens_per_second_per_gpu", "[tw]ps") + rf"{_A}\s*$",
    ), split="validation", dated=True),
    Format("torchtitan", "step:", *_line(
        rf"step:(?<!validate step:)\s*+(?P<step>{_C})\s++{_A}loss:",
        rf"\s*+(?P<loss>{_NUM})" + _f("grad_norm", "grad_norm") + _MEMORY + _f("tokens_per_second_per_gpu", "[tw]ps")
        + _f("tflops", "tflops") + _MFU + rf"{_A}\s*+\|?\s*$",
    ), dated=True),
    Format("torchtune-tqdm", "|Loss:", *_line(
        rf"(?<![\w.|])(?P<epoch>{_C})\|(?P<step>{_C})\|Loss:",
        rf"\s*+(?P<loss>{_NUM}):\s*+\d++%\|[^|]*+\|\s*+(?P<progress>{_C})/(?P<total_steps>{_C})\s*+"
        r"\[(?P<elapsed>\d++(?::\d++)*+)<(?P<remaining>\d++(?::\d++)*+|\?)"
        r"(?:,\s*+(?P<rate>\d++(?:\.\d++)?+|\?)(?P<unit>s/it|it/s))?+(?:\]|\s*$)",
    )),
    Format("torchtune-disk", "Step ", re.compile(rf"{_PREFIX}[ \t]*+{_DISK_STEP}"), parse=_disk),
    Format("fsdp", "Batch ", *_line(  # the last two fields: our own fsdp_train.py
        rf"Batch (?P<step>{_C}) Loss: ",
        rf"(?P<loss>{_NUM}), Speed: (?P<samples_per_second>{_NUM}) samples/sec"
        rf"(?:, lr: (?P<lr>{_NUM}))?(?:, tokens_per_second_per_gpu: (?P<tokens_per_second_per_gpu>{_NUM}))?"
        rf"(?:, mfu: (?:(?P<mfu_pct>{_NUM})%|N/A))?\s*$",
    ), dated=True),
    Format("jsonl", "{", re.compile(rf'{_PREFIX}[ \t]*+{{"step": (?P<step>{_C})[,}}](?!.*"s(?:tep|plit)")'),
           parse=_jsonl),  # key: no "split" (a validation row) or second "step" after it, else read whole
)
# fmt: on

# DiskLogger / jsonl / TensorBoard names -> canonical column names
# fmt: off
ALIASES: dict[str, str] = {
    "throughput(tps)": "tokens_per_second_per_gpu", "tps": "tokens_per_second_per_gpu",
    "loss_metrics/global_avg_loss": "loss", "mfu(%)": "mfu_pct", "mfu": "mfu_pct",
    "memory/max_reserved(GiB)": "memory_gib", "memory/max_reserved(%)": "memory_pct",
    "peak_memory_reserved": "memory_gib", "lr": "lr",
}
# fmt: on


def prefix(line: str) -> tuple[str, int | None, int | None]:
    """``line`` without its launcher prefix: (text, rank, node) -- see the module docstring. A number
    of more than 15 digits (garbled) gives rank -1: the caller skips the line."""
    end = m.end() if line[:1] in _PREFIX_START and (m := PREFIX.match(line)) else 0
    if not end:
        return line, None, None
    if line[end : end + 1].isdigit():  # a number of more than 15 digits: garbled
        return line[end:], -1, None
    assert m is not None  # end > 0: the prefix matched
    rank, node = (None if v is None else int(v) for v in rank_node(*m.group("srun", "tag", "glob")))
    return line[end:], rank, node


def parse_line(line: str, won_fmt: Any = None, won: Any = None) -> tuple[Format | None, Any, bool | None]:
    """Read one line (no ``\\n``/``\\r``): (format, its match or row dict, looks_like_metrics).

    A regex format's match holds the prefix groups (see :func:`rank_node`); a row dict has ``rank`` and ``node``. The
    format is None when no format matches; ``looks_like_metrics`` then says whether to report the line. A line of a
    format other than ``won_fmt`` with the split and step of ``won`` (a rank-0 row's match: table.py) loses to it and
    is read only up to its step: (format, key match, None)."""
    for fmt in FORMATS:
        if fmt.marker in line:
            k = fmt.key.match(line) if won and fmt is not won_fmt and fmt.split == won_fmt.split else None
            if k and k["step"] == won["step"]:  # type: ignore[index]
                return fmt, k, None
            if fmt.regex is not None:
                if m := fmt.regex.match(line):
                    return fmt, m, True
                continue
            assert fmt.parse is not None  # a format has a regex or a parse function
            text, rank, node = prefix(line)
            if rank == -1:
                return None, None, True
            row = fmt.parse(_ANSI.sub("", text) if "\x1b" in text else text)
            if row is not None:
                if all(abs(row[k]) < _INT_LIMIT for k in row.keys() & INT_COLUMNS):
                    row.update(rank=rank, node=node)
                    return fmt, row, True
                return None, None, True
    return None, None, bool(_LOOKS_LIKE.search(_ANSI.sub("", line) if "\x1b" in line else line))


def rank_node(srun: str | None, tag: str | None, glob: str | None) -> tuple[str | None, str | None]:
    """(rank, node) from the prefix numbers: with a launcher tag the srun number is the node."""
    return (srun, None) if (tag := glob or tag) is None else (tag, srun)


def head_time(head: str) -> tuple[str | None, str | None]:
    """The first date (and milliseconds) in a line's head (the text before its metrics)."""
    m = _DATE.search(head)
    return (m[1], m[2]) if m else (None, None)
