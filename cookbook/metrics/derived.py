"""Numbers the frameworks do not print: MFU/TFLOPs from model FLOPs, tokens seen, ETA.

MFU follows the PaLM definition torchtitan uses: achieved model FLOPs per second per GPU divided by
the GPU's peak dense bf16 FLOPs. Model FLOPs per token = 6 * N (N = non-embedding parameters) plus
attention 12 * layers * heads * head_dim * seq_len.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pandas as pd

from cookbook.gpus import peak_tflops as peak_tflops  # re-exported: cookbook.metrics.peak_tflops


def hf_config_flops_per_token(config: Mapping[str, object] | str | os.PathLike[str], seq_len: int) -> float:
    """FLOPs per token of a Llama-style model from its Hugging Face ``config.json`` (dict or path),
    counted by the planner's formula (the one count of the package: 6N + 12 * layers * heads * head_dim * s)."""
    from cookbook.planner.estimate import Settings, flops_per_token
    from cookbook.planner.models import shape_from_config

    p = Path() if isinstance(config, Mapping) else Path(config)
    values = config if isinstance(config, Mapping) else json.loads((p / "config.json" if p.is_dir() else p).read_text())
    return flops_per_token(shape_from_config(values), Settings(seq_len=seq_len))


# torchtitan's FLUX trainer (2025, e.g. ``tps: 1,541,366`` in the Nebius FLUX.1-schnell guide,
# https://github.com/nebius/ml-cookbook) counted ``labels.numel()`` as tokens: the pixel values of each
# image, 3 * image_size**2. Later versions count seq_len per image instead.
FLUX_TPS_PER_IMAGE_PIXEL = 3


def planner_flops(model: str, seq_len: int | None = None, image_size: int | None = None) -> tuple[float, float]:
    """(FLOPs per unit of the logged ``tokens_per_second_per_gpu``, FLOPs per sample) of a planner model.

    ``model`` is a planner key (``llama3_1_8b``, ``flux_schnell`` ...), counted by the planner's formulas (unset
    sizes: the planner's ``Settings`` defaults). An LLM's unit is a token; FLUX trains on images, so its unit is one
    pixel value (see ``FLUX_TPS_PER_IMAGE_PIXEL``): FLOPs per image / (3 * image_size**2)."""
    from cookbook.planner.estimate import Settings, flops_per_sample, flops_per_token
    from cookbook.planner.models import FluxShape, get_model

    shape = get_model(model)
    s = Settings().with_overrides(**{k: v for k, v in (("seq_len", seq_len), ("image_size", image_size)) if v})
    per_sample = flops_per_sample(shape, s)
    if isinstance(shape, FluxShape):
        return per_sample / (FLUX_TPS_PER_IMAGE_PIXEL * s.image_size**2), per_sample
    return flops_per_token(shape, s), per_sample


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
