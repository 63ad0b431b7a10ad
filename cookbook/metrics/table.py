"""Raw rows -> one tidy DataFrame: duplicates resolved, canonical columns, train rows first.

Which row a (split, step) keeps: rank 0's (or a line without a rank), else the first line seen -- never a later one
(tqdm redraws a step's bar; a resumed run logs steps again; every rank prints its own line). ``ranks="all"`` keeps
the first line of each (split, step, node, rank) instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cookbook.metrics.formats import INT_COLUMNS

# fmt: off
COLUMNS: tuple[str, ...] = (
    "step", "split", "epoch", "loss", "lr", "grad_norm", "tokens_per_second_per_gpu", "samples_per_second",
    "memory_gib", "memory_pct", "tflops", "mfu_pct", "time", "elapsed_s", "remaining_s", "seconds_per_step",
    "progress", "total_steps", "rank", "node", "format",
)
# fmt: on


def resolve(df: pd.DataFrame, ranks: str = "first") -> pd.DataFrame:
    """Raw rows in the order their lines appear -> one row per key (see the module docstring)."""
    if df.empty or ((s := df["split"].to_numpy()) == s[0]).all() and (np.diff(df["step"].to_numpy(float)) > 0).all():
        return df  # one split, steps increasing: no key repeats
    if ranks == "all":
        dup = df.duplicated([c for c in ("split", "step", "node", "rank") if c in df], keep="first")
    else:  # the first of each key once rank 0's rows (or rows without a rank) are put first
        loses = df["rank"].notna() & df["rank"].ne(0) if "rank" in df else pd.Series(False, index=df.index)
        dup = df.loc[loses.sort_values(kind="stable").index, ["split", "step"]].duplicated().sort_index()
    return df[~dup.to_numpy()] if dup.any() else df


def to_frame(rows: pd.DataFrame | list[dict[str, object]], ranks: str = "first") -> pd.DataFrame:
    """Canonical DataFrame from raw rows: resolved, sorted by split (train first) then step."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=["step", "split", "loss"])
    df = resolve(df if "split" in df else df.assign(split="train"), ranks)
    df = df.drop(columns=[c for c in ("rank", "node") if c in df and df[c].isna().all()])
    for col in (c for c in INT_COLUMNS if c in df):
        df[col] = pd.to_numeric(df[col]).round().astype("Int64")
    if "time" in df.columns:
        df["time"] = pd.to_datetime(df["time"], errors="coerce")
    df["split"] = df["split"].fillna("train").astype(str)
    order = [c for c in COLUMNS if c in df.columns] + sorted(c for c in df.columns if c not in COLUMNS and c != "seq")
    rows = np.lexsort((df["step"].to_numpy(dtype=float), df["split"].ne("train").to_numpy()))  # stable
    df = df[order] if (rows[1:] > rows[:-1]).all() else df[order].take(rows)
    return df.reset_index(drop=True)
