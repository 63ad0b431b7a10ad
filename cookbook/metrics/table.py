"""Rows -> one tidy DataFrame: one row per (split, step), duplicates resolved, canonical columns."""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from cookbook.metrics.formats import KEEP, Row

COLUMNS: tuple[str, ...] = (
    "step", "split", "epoch", "loss", "lr", "grad_norm", "tokens_per_second_per_gpu", "samples_per_second",
    "memory_gib", "memory_pct", "tflops", "mfu_pct", "time", "elapsed_s", "remaining_s", "seconds_per_step",
    "progress", "total_steps", "rank", "format",
)
_INT_COLUMNS = ("step", "epoch", "progress", "total_steps", "rank")


class RowTable:
    """Accumulates parsed rows, keyed by (split, step, rank); the format decides which duplicate wins.

    ``add`` returns the keys it inserted or replaced, so a live follower can report only new rows.
    """

    def __init__(self) -> None:
        self._rows: dict[tuple, Row] = {}
        self._best_rank: dict[tuple, int | None] = {}   # (split, step) -> lowest rank seen
        self.skipped: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows.clear()
        self._best_rank.clear()
        self.skipped.clear()

    def add(self, rows: Iterable[Row]) -> list[tuple]:
        changed: list[tuple] = []
        for row in rows:
            key = (row.get("split", "train"), int(row["step"]), row.get("rank"))
            if key in self._rows and KEEP.get(row.get("format", ""), "last") == "first":
                continue
            self._rows[key] = row
            changed.append(key)
            best = self._best_rank.get(key[:2], key[2])
            if key[2] is not None and (best is None or key[2] < best):
                best = key[2]
            self._best_rank[key[:2]] = best
        return changed

    def frame(self, keys: Iterable[tuple] | None = None, ranks: str = "first") -> pd.DataFrame:
        """The rows (all, or those of ``keys``) as a DataFrame; ``ranks="all"`` keeps every rank's row."""
        if keys is None:
            rows = list(self._rows.values())
        else:
            keys = list(dict.fromkeys(keys))
            if ranks == "first":
                keys = [k for k in keys if k[2] == self._best_rank.get(k[:2], k[2])]
            rows = [self._rows[k] for k in keys]
        return to_frame(rows, ranks=ranks)


def to_frame(rows: list[Row], ranks: str = "first") -> pd.DataFrame:
    """Canonical DataFrame from row dicts: sorted by split then step, known columns first."""
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=["step", "split", "loss"])
    if "rank" in df.columns:
        if ranks == "first":
            df = df.sort_values("rank", kind="stable", na_position="last")
            df = df.drop_duplicates(subset=["split", "step"], keep="first")
    for col in _INT_COLUMNS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col]).round().astype("Int64")
    if "time" in df.columns:
        df["time"] = pd.to_datetime(df["time"], errors="coerce")
    if "split" in df.columns:
        df["split"] = df["split"].fillna("train").astype(str)
    order = [c for c in COLUMNS if c in df.columns] + sorted(c for c in df.columns if c not in COLUMNS)
    df = df[order]
    if len(df):
        df = df.sort_values(["split", "step"], kind="stable", key=lambda s: s.map({"train": 0}).fillna(1)
                            if s.name == "split" else s)
    return df.reset_index(drop=True)
