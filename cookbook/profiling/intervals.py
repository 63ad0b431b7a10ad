"""Arithmetic on sets of time intervals (``N x 2`` arrays of ``[start, end)``)."""

from __future__ import annotations

import numpy as np

EMPTY = np.empty((0, 2))


def union(iv: np.ndarray) -> np.ndarray:
    """Sorted, non-overlapping intervals covering the same time as ``iv``."""
    iv = np.asarray(iv, dtype=float).reshape(-1, 2)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if len(iv) == 0:
        return EMPTY
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    # running max of ends; a new block starts where start > every previous end
    ends = np.maximum.accumulate(iv[:, 1])
    new = np.r_[True, iv[1:, 0] > ends[:-1]]
    starts = iv[new, 0]
    block_end = ends[np.r_[np.flatnonzero(new)[1:] - 1, len(iv) - 1]]
    return np.column_stack([starts, block_end])


def total(iv: np.ndarray) -> float:
    """Time covered by ``iv`` (overlaps counted once)."""
    u = union(iv)
    return float((u[:, 1] - u[:, 0]).sum())


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``iv`` cut to the window ``[lo, hi)``."""
    iv = np.asarray(iv, dtype=float).reshape(-1, 2)
    out = np.column_stack([np.maximum(iv[:, 0], lo), np.minimum(iv[:, 1], hi)])
    return out[out[:, 1] > out[:, 0]]


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Time in ``a`` that is not in ``b``."""
    a, b = union(a), union(b)
    out, j = [], 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j, 1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k, 0] < end:
            if b[k, 0] > cur:
                out.append((cur, b[k, 0]))
            cur = max(cur, b[k, 1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return np.array(out, dtype=float).reshape(-1, 2)
