"""Numbers the frameworks do not print: MFU/TFLOPs from model FLOPs (the planner counts them:
``cookbook.planner.estimate.planner_flops``), tokens seen, ETA.

MFU follows the PaLM definition torchtitan uses: achieved model FLOPs per second per GPU divided by
the GPU's peak dense bf16 FLOPs. Model FLOPs per token = 6 * N (N = non-embedding parameters) plus
attention 12 * layers * heads * head_dim * seq_len.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pandas as pd

from cookbook.gpus import peak_tflops as peak_tflops  # re-exported: cookbook.metrics.peak_tflops


def add_derived(df: pd.DataFrame, *, flops_per_token: float | None = None, flops_per_sample: float | None = None,
                gpu: str | None = None, n_gpus: int = 1,
                tokens_per_step: float | None = None) -> pd.DataFrame:  # fmt: skip
    """Copy of ``df`` with ``tflops``/``mfu_pct`` filled where missing or 0, and ``tokens_seen``.

    ``samples_per_second`` (FSDP) is taken as the total over ``n_gpus``; ``tokens_per_second_per_gpu`` is per GPU.
    Printed non-zero values are kept."""
    out = df.copy()
    tflops = None
    if flops_per_token and "tokens_per_second_per_gpu" in out:
        tflops = flops_per_token * out["tokens_per_second_per_gpu"] / 1e12
    elif flops_per_sample and "samples_per_second" in out:
        tflops = flops_per_sample * out["samples_per_second"] / n_gpus / 1e12
    for col, computed in (("tflops", tflops), ("mfu_pct", None)):
        if col == "mfu_pct" and gpu and "tflops" in out:
            computed = 100 * out["tflops"] / peak_tflops(gpu)
        if computed is not None:  # printed non-zero values are kept
            have = out.get(col)
            out[col] = computed if have is None else have.where(have.notna() & (have != 0), computed)
    if (seen := tokens_seen(out, tokens_per_step=tokens_per_step, n_gpus=n_gpus)) is not None:
        out["tokens_seen"] = seen
    return out


def tokens_seen(df: pd.DataFrame, tokens_per_step: float | None = None, n_gpus: int = 1) -> pd.Series | None:
    """Tokens processed up to each training row: step * tokens_per_step, or integrated throughput
    (tokens/s/GPU * GPUs * seconds between logged rows, from ``time``)."""
    if tokens_per_step:
        return df["step"].astype(float) * tokens_per_step
    if {"tokens_per_second_per_gpu", "time"} <= set(df.columns) and df["time"].notna().sum() > 1:
        train = df["split"].eq("train") if "split" in df else pd.Series(True, index=df.index)
        dt = df["time"].where(train).diff().dt.total_seconds().fillna(0)
        return (df["tokens_per_second_per_gpu"].fillna(0) * n_gpus * dt).where(train).cumsum()
    return None


def eta(df: pd.DataFrame, total_steps: int | None = None, window: int = 20) -> timedelta | None:
    """Time left until ``total_steps`` (tqdm logs carry their own total), from the recent pace."""
    train = df[df["split"].eq("train")] if "split" in df else df
    if train.empty:
        return None
    if total_steps is None and "total_steps" in train and train["total_steps"].notna().any():
        total_steps = int(train["total_steps"].dropna().iloc[-1])
    if not total_steps:
        return None
    last, recent, per_step = int(train["step"].iloc[-1]), train.tail(window), None
    if "time" in recent and recent["time"].notna().sum() > 1:
        t = recent.dropna(subset=["time"])
        if (steps := int(t["step"].iloc[-1] - t["step"].iloc[0])) > 0:
            per_step = (t["time"].iloc[-1] - t["time"].iloc[0]).total_seconds() / steps
    if per_step is None and "seconds_per_step" in recent and recent["seconds_per_step"].notna().any():
        per_step = float(recent["seconds_per_step"].dropna().iloc[-1])
    if per_step is None or math.isnan(per_step):
        return None
    return timedelta(seconds=max(total_steps - last, 0) * per_step)
