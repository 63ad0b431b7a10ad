"""Dataset sources and styles: read rows from a local file or the Hub, and check each row.

Every problem names the row (0-based, as ``datasets`` indexes it; plus the file line for JSON lines)
and the column, so a bad file is caught before anything is submitted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: style -> (torchtune builder, the columns it reads by default)
STYLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sharegpt": ("torchtune.datasets.chat_dataset", ("conversations",)),
    "openai": ("torchtune.datasets.chat_dataset", ("messages",)),
    "alpaca": ("torchtune.datasets.alpaca_dataset", ("instruction", "input", "output")),
    "instruct": ("torchtune.datasets.instruct_dataset", ("input", "output")),
    "text": ("torchtune.datasets.text_completion_dataset", ("text",)),
}
LOCAL_LOADERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
SHAREGPT_ROLES = ("system", "human", "gpt")
OPENAI_ROLES = ("system", "user", "assistant", "ipython", "tool")
OPTIONAL_COLUMNS = {("alpaca", "input")}  # alpaca rows may leave out "input"


@dataclass(frozen=True)
class RowProblem:
    """One problem in one row (``row`` is None for file-level problems)."""

    row: int | None
    column: str | None
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = [] if self.row is None else [f"row {self.row}" + (f" (line {self.line})" if self.line else "")]
        if self.column:
            where.append(f"column '{self.column}'")
        return (", ".join(where) + ": " if where else "") + self.message


class DataError(ValueError):
    """A dataset that cannot be used as given; ``problems`` names rows and columns."""

    def __init__(self, source: str, problems: list[RowProblem], total: int | None = None):
        self.source, self.problems = source, problems
        n = total if total is not None else len(problems)
        if n == 1 and len(problems) == 1:  # one problem: one line (`cookbook data` prints it as its error)
            super().__init__(f"{source}: {problems[0]}")
            return
        head = f"{source}: {n} problem{'s' if n != 1 else ''}"
        lines = [f"  {p}" for p in problems]
        if total is not None and total > len(problems):
            lines.append(f"  ... and {total - len(problems)} more")
        super().__init__("\n".join([head, *lines]))


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset is and how torchtune should read it.

    ``column_map`` maps torchtune's names (``conversations``, ``messages``, ``instruction``, ``input``,
    ``output``, ``text``) to the dataset's own column names.
    """

    source: str
    style: str
    column_map: dict[str, str] = field(default_factory=dict)
    split: str = "train"
    name: str | None = None  # Hub config name

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}; choose one of {', '.join(STYLES)}")
        if bad := set(self.column_map) - set(STYLES[self.style][1]):
            raise ValueError(
                f"column map keys {sorted(bad)} do not apply to style {self.style!r} "
                f"(it reads {', '.join(STYLES[self.style][1])})"
            )
        if self.is_local and Path(self.source).suffix.lower() not in LOCAL_LOADERS:
            raise ValueError(f"{self.source}: unsupported file type; use one of {', '.join(LOCAL_LOADERS)}")

    @property
    def is_local(self) -> bool:
        return Path(self.source).expanduser().exists() or Path(self.source).suffix.lower() in LOCAL_LOADERS

    @property
    def path(self) -> Path:
        return Path(self.source).expanduser().resolve()

    def column(self, key: str) -> str:
        """The dataset column torchtune reads for ``key``."""
        return self.column_map.get(key, key)

    @property
    def component(self) -> str:
        return STYLES[self.style][0]

    def builder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the torchtune builder (everything but the tokenizer)."""
        kw: dict[str, Any] = {
            "source": LOCAL_LOADERS[self.path.suffix.lower()] if self.is_local else self.source,
            "split": self.split,
        }
        if self.is_local:
            kw["data_files"] = str(self.path)
        if self.name:
            kw["name"] = self.name
        if self.style in ("sharegpt", "openai"):
            key = STYLES[self.style][1][0]
            kw.update(conversation_column=self.column(key), conversation_style=self.style)
        elif self.style == "text":
            kw["column"] = self.column("text")
        elif self.column_map:
            kw["column_map"] = {k: self.column(k) for k in STYLES[self.style][1]}
        return kw


# ---------------------------------------------------------------------------------------- reading
@dataclass
class Rows:
    """Rows read from a source, with the file line each starts on (JSON lines) where known."""

    rows: list[dict[str, Any]]
    lines: list[int | None]
    total: int | None  # rows in the whole source (None for a streamed Hub sample)


def read_rows(spec: DatasetSpec, limit: int | None = None) -> Rows:
    """Read up to ``limit`` rows (all if None); invalid files raise :class:`DataError` naming the line."""
    if not spec.is_local:
        return _read_hub(spec, limit)
    path = spec.path
    if not path.is_file():
        raise DataError(str(path), [RowProblem(None, None, "file not found")])
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        rows, lines = _read_json(path)
    else:
        import pandas as pd

        try:
            frame = pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path, keep_default_na=False)
        except Exception as e:  # noqa: BLE001 - pandas/pyarrow parse errors carry the line
            raise DataError(str(path), [RowProblem(None, None, f"cannot read {suffix[1:]}: {e}")]) from None
        rows = frame.to_dict(orient="records")
        lines = [i + 2 for i in range(len(rows))] if suffix == ".csv" else [None] * len(rows)
    total = len(rows)
    if limit is not None:
        rows, lines = rows[:limit], lines[:limit]
    return Rows(rows, lines, total)


def _read_json(path: Path) -> tuple[list[dict[str, Any]], list[int | None]]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):  # one JSON array
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(
                str(path), [RowProblem(None, None, f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}")]
            ) from None
        if not_objects := [
            RowProblem(i, None, f"expected a JSON object, got {type(r).__name__}")
            for i, r in enumerate(data)
            if not isinstance(r, dict)
        ]:
            raise DataError(str(path), not_objects[:20], len(not_objects))
        return data, [None] * len(data)
    rows: list[dict[str, Any]] = []
    lines: list[int | None] = []
    problems: list[RowProblem] = []
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    for row, (lineno, line) in enumerate(numbered):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(RowProblem(row, None, f"invalid JSON ({e.msg} at column {e.colno})", lineno))
            continue
        if not isinstance(obj, dict):
            problems.append(RowProblem(row, None, f"expected a JSON object, got {type(obj).__name__}", lineno))
            continue
        rows.append(obj)
        lines.append(lineno)
    if problems:
        raise DataError(str(path), problems[:20], len(problems))
    if not rows:
        raise DataError(str(path), [RowProblem(None, None, "no rows")])
    return rows, lines


def _read_hub(spec: DatasetSpec, limit: int | None) -> Rows:
    from datasets import load_dataset

    from cookbook.hub import explain, redact

    try:
        ds = load_dataset(spec.source, name=spec.name, split=spec.split, streaming=True)
        rows = [dict(r) for r in (ds.take(limit) if limit else ds)]
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: one clear message
        msg = explain(e, spec.source, repo_type="dataset") if _is_hub_error(e) else f"{type(e).__name__}: {e}"
        raise DataError(spec.source, [RowProblem(None, None, redact(msg))]) from None
    return Rows(rows, [None] * len(rows), None)


def _is_hub_error(e: BaseException) -> bool:
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    chain = [e, e.__cause__, e.__context__]
    return any(
        isinstance(x, (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, httpx.HTTPError, ConnectionError))
        for x in chain
        if x is not None
    )


# ---------------------------------------------------------------------------------------- checking
def validate_rows(spec: DatasetSpec, rows: Rows, max_problems: int = 20) -> None:
    """Check every row's columns, roles and contents for ``spec.style``; raise :class:`DataError`."""
    problems = [
        p for i, (row, line) in enumerate(zip(rows.rows, rows.lines)) for p in _row_problems(spec, i, row, line)
    ]
    if problems:
        raise DataError(spec.source, problems[:max_problems], len(problems))


def _row_problems(spec: DatasetSpec, i: int, row: dict[str, Any], line: int | None) -> Iterable[RowProblem]:
    wanted = STYLES[spec.style][1]
    for key in wanted:
        col = spec.column(key)
        if col not in row and (spec.style, key) not in OPTIONAL_COLUMNS:
            hint = f"; map yours with --column-map {key}=YOUR_COLUMN" if len(row) else ""
            other = {"sharegpt": ("messages", "openai"), "openai": ("conversations", "sharegpt")}.get(spec.style)
            if other and other[0] in row:
                hint = f"; it has '{other[0]}': use --style {other[1]}"
            yield RowProblem(i, col, f"missing (row has: {', '.join(map(str, row)) or 'nothing'}){hint}", line)
            return
    if spec.style in ("sharegpt", "openai"):
        yield from _chat_problems(spec, i, row, line)
        return
    for key in wanted:
        col = spec.column(key)
        value = "" if row.get(col) is None else row[col]
        if not isinstance(value, str):
            yield RowProblem(i, col, f"expected text, got {type(value).__name__}", line)
        elif not value.strip() and (spec.style, key) not in OPTIONAL_COLUMNS:
            yield RowProblem(i, col, "empty", line)


def _chat_problems(spec: DatasetSpec, i: int, row: dict[str, Any], line: int | None) -> Iterable[RowProblem]:
    sharegpt = spec.style == "sharegpt"
    col = spec.column("conversations" if sharegpt else "messages")
    turns = row[col]
    if not isinstance(turns, list) or not turns:
        yield RowProblem(
            i,
            col,
            "is a string, expected a list of messages (is it JSON-encoded text?)"
            if isinstance(turns, str)
            else "empty conversation"
            if isinstance(turns, list)
            else f"expected a list of messages, got {type(turns).__name__}",
            line,
        )
        return
    role_key, text_key, roles = ("from", "value", SHAREGPT_ROLES) if sharegpt else ("role", "content", OPENAI_ROLES)
    other = ("openai", "role/content") if sharegpt else ("sharegpt", "from/value")
    found: list[RowProblem] = []
    for j, turn in enumerate(turns):
        where = f"{col}[{j}]"
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            keys = ", ".join(turn) if isinstance(turn, dict) else type(turn).__name__
            hint = (
                f" (that looks like {other[1]}: use --style {other[0]})"
                if isinstance(turn, dict) and set(other[1].split("/")) <= set(turn)
                else ""
            )
            found.append(RowProblem(i, where, f"expected keys '{role_key}' and '{text_key}', got {keys}{hint}", line))
            continue
        if turn[role_key] not in roles:
            found.append(
                RowProblem(
                    i,
                    f"{where}.{role_key}",
                    f"role {turn[role_key]!r} is not a {spec.style} role ({', '.join(roles)})",
                    line,
                )
            )
        content = turn[text_key]
        if (
            content is None
            or (isinstance(content, str) and not content.strip())
            or (isinstance(content, list) and not content)
        ):
            found.append(RowProblem(i, f"{where}.{text_key}", "empty message", line))
    yield from found
    if not found:  # order rules, checked by torchtune's own transform + validator
        from torchtune.data import OpenAIToMessages, ShareGPTToMessages, validate_messages

        transform = (
            ShareGPTToMessages(column_map={"conversations": col})
            if sharegpt
            else OpenAIToMessages(column_map={"messages": col})
        )
        try:
            validate_messages(transform(row)["messages"])
        except (ValueError, KeyError, TypeError) as e:
            yield RowProblem(i, col, f"{e}", line)
