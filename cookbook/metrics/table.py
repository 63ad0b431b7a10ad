"""Rows -> one tidy DataFrame: one row per (split, step), duplicates resolved, canonical columns."""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from cookbook.metrics.formats import INT_COLUMNS, KEEP, Row

COLUMNS: tuple[str, ...] = (
    "step", "split", "epoch", "loss", "lr", "grad_norm", "tokens_per_second_per_gpu", "samples_per_second",
    "memory_gib", "memory_pct", "tflops", "mfu_pct", "time", "elapsed_s", "remaining_s", "seconds_per_step",
    "progress", "total_steps", "rank", "format",
)


class RowTable:
    """Accumulates parsed rows (DataFrames from :func:`~cookbook.metrics.formats.scan`).

    Rows are keyed by (split, step, rank): a later row replaces an earlier one (a resumed run logs a
    step again), except for formats that keep the first (tqdm prints a step's line twice).
    """

    def __init__(self) -> None:
        self._frames: list[pd.DataFrame] = []
        self._first_keys: set[tuple] = set()   # keys already held by keep-first formats
        self._n = 0
        self.skipped: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        self._frames.clear()
        self._first_keys.clear()
        self._n = 0
        self.skipped.clear()

    def add(self, frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
        """Add rows; return the ones that are new or replace earlier rows."""
        added = []
        for df in frames:
            if df.empty:
                continue
            df = _with_keys(df)
            first = df["format"].map(KEEP).eq("first")
            if first.any():
                keys = list(zip(df["split"], df["step"], df["rank"]))
                seen = pd.Series([first.iloc[i] and k in self._first_keys for i, k in enumerate(keys)],
                                 index=df.index)
                dup_in_batch = first & df.duplicated(["split", "step", "rank"], keep="first")
                df = df[~(seen | dup_in_batch)]
                self._first_keys.update(k for k, f in zip(keys, first) if f)
            if len(df):
                added.append(df)
        if not added:
            return pd.DataFrame()
        new = pd.concat(added, ignore_index=True)
        self._frames.append(new)
        self._n += len(new)
        return new

    def frame(self, rows: pd.DataFrame | None = None, ranks: str = "first") -> pd.DataFrame:
        """All rows (or ``rows``) as the canonical DataFrame; ``ranks="all"`` keeps every rank's row."""
        if rows is None:
            rows = pd.concat(self._frames, ignore_index=True) if self._frames else pd.DataFrame()
            if len(rows):
                rows = rows.drop_duplicates(["split", "step", "rank"], keep="last")
        return to_frame(rows, ranks=ranks)


def _with_keys(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    if "split" not in df:
        df["split"] = "train"
    df["split"] = df["split"].fillna("train")
    df["step"] = pd.to_numeric(df["step"]).astype("int64")
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").astype("Float64") if "rank" in df else \
        pd.Series(pd.NA, index=df.index, dtype="Float64")
    return df


def to_frame(rows: list[Row] | pd.DataFrame, ranks: str = "first") -> pd.DataFrame:
    """Canonical DataFrame from rows: sorted by split then step, known columns first."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=["step", "split", "loss"])
    if "rank" in df.columns and df["rank"].isna().all():
        df = df.drop(columns="rank")
    if "rank" in df.columns:
        if ranks == "first":
            df = df.sort_values("rank", kind="stable", na_position="last")
            df = df.drop_duplicates(subset=["split", "step"], keep="first")
    for col in INT_COLUMNS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col]).round().astype("Int64")
    if "time" in df.columns:
        df["time"] = pd.to_datetime(df["time"], errors="coerce")
    if "split" in df.columns:
        df["split"] = df["split"].fillna("train").astype(str)
    order = [c for c in COLUMNS if c in df.columns] + sorted(c for c in df.columns if c not in COLUMNS)
    df = df[order]
    if len(df):
        df = df.sort_values(["split", "step"], kind="stable", key=lambda s: s.ne("train")  # train first
                            if s.name == "split" else s)
    return df.reset_index(drop=True)
