"""GPU kinds: memory, dense peak FLOP/s by dtype and power — the one table the gate, the FSDP training script,
the planner, the derived metrics (MFU) and goodput read (standard library only).

Peaks are dense (no sparsity) tensor-core TFLOP/s from NVIDIA's data sheets:
- A100: https://www.nvidia.com/en-us/data-center/a100/ (312 bf16; no fp8)
- H100 / H800 SXM, PCIe, NVL: https://www.nvidia.com/en-us/data-center/h100/ (989 / 756 / 835 bf16;
  the sheet's 1,979 / 1,513 / 1,671 bf16 and 3,958 / 3,026 / 3,341 fp8 are with sparsity: halved here)
- H200: https://www.nvidia.com/en-us/data-center/h200/ (989 bf16, 1,979 fp8)
- B200 (HGX, 1,000 W) and GB200 (NVL72, 1,200 W): https://www.nvidia.com/en-us/data-center/gb200-nvl72/
  and the HGX B200 sheet (2,250 / 2,500 bf16; 4,500 / 5,000 fp8). torchtitan uses 2,250 for every
  Blackwell part, so the MFU it prints for GB200 is 2,500 / 2,250 = 1.11x the one computed here.
- L40S: https://www.nvidia.com/en-us/data-center/l40s/ (362 bf16, 733 fp8); L4 (121 bf16, 242 fp8).
Memory is what ``torch.cuda`` reports as total (GiB), which torchtitan's "memory: X GiB (Y%)" divides by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuKind:
    """One GPU kind. ``device_names``: lower-case substrings of ``torch.cuda.get_device_name()``."""

    key: str
    name: str
    memory_gib: float
    power_w: int
    peak_tflops: dict[str, float] = field(hash=False)
    device_names: tuple[str, ...] = ()

    @property
    def peak_bf16_tflops(self) -> float:
        return self.peak_tflops["bf16"]


def _kind(
    key: str, name: str, memory_gib: float, power_w: int, bf16: float, fp8: float | None, *device_names: str
) -> GpuKind:
    peaks = {"bf16": bf16, "fp16": bf16} | ({"fp8": fp8} if fp8 else {})
    return GpuKind(key, name, memory_gib, power_w, peaks, device_names)


GPU_KINDS: dict[str, GpuKind] = {
    k.key: k
    for k in (
        _kind("a100-40", "A100 40GB", 39.4, 400, 312.0, None, "a100-sxm4-40gb", "a100-pcie-40gb"),
        _kind("a100-80", "A100 80GB", 79.2, 400, 312.0, None, "a100", "a800"),
        _kind("h100", "H100 80GB SXM (700 W)", 79.2, 700, 989.0, 1979.0, "h100", "h800"),
        _kind("h100-500w", "H100 80GB SXM capped at 500 W", 79.2, 500, 989.0, 1979.0),
        _kind("h100-96", "H100 96GB HBM2e (Grand Teton, 500 W)", 94.5, 500, 989.0, 1979.0, "h100 96gb"),
        _kind("h100-pcie", "H100 80GB PCIe (350 W)", 79.2, 350, 756.0, 1513.0, "h100 pcie"),
        _kind("h100-nvl", "H100 NVL 94GB (400 W)", 93.1, 400, 835.0, 1671.0, "h100 nvl"),
        _kind("h200", "H200 141GB", 139.8, 700, 989.0, 1979.0, "h200"),
        _kind("b200", "B200 180GB", 178.4, 1000, 2250.0, 4500.0, "b200"),
        _kind("gb200", "GB200 (186GB HBM)", 184.0, 1200, 2500.0, 5000.0, "gb200"),
        _kind("l40s", "L40S 48GB", 44.4, 350, 362.0, 733.0, "l40s"),
        _kind("l4", "L4 24GB", 22.0, 72, 121.0, 242.0, "l4"),
    )
}
# USD per GPU-hour, rough 2025 on-demand list prices, for orders of magnitude only: a profile with a contract
# price (``Profile.price_per_gpu_hour``) or ``--price-per-gpu-hour`` overrides them. Kinds without one: no price.
LIST_PRICE_PER_GPU_HOUR: dict[str, float] = {
    "h100": 3.00,
    "h100-500w": 3.00,
    "h100-96": 3.00,
    "h200": 3.80,
    "a100-80": 1.80,
    "a100-40": 1.30,
    "b200": 5.00,
    "gb200": 6.00,
}
# Other names people use for the same kinds.
GPU_ALIASES: dict[str, str] = {
    "h100-sxm": "h100",
    "h100-700w": "h100",
    "h100-80": "h100",
    "a100": "a100-80",
    "h100-96gb": "h100-96",
    "h800": "h100",
    "a800": "a100-80",
}


class UnknownGpu(KeyError):
    """A GPU kind or device name not in :data:`GPU_KINDS`."""

    def __str__(self) -> str:
        return str(self.args[0])


def _has_words(name: str, device: str) -> bool:
    """``device`` (``h100 nvl``) in ``name`` as whole words: ``h100 80gb hbm3`` is an H100, ``h1000`` is none."""
    return re.search(rf"(?<![a-z0-9]){re.escape(device.replace('-', ' '))}(?![a-z0-9])", name) is not None


def gpu_kind(gpu: str) -> GpuKind:
    """A kind by key or alias (``h100``, ``H100-500W``) or by device name (``NVIDIA H100 80GB HBM3``)."""
    key = gpu.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key in GPU_KINDS:
        return GPU_KINDS[key]
    name = key.removeprefix("nvidia").strip().replace("-", " ")
    matches = [(len(s), k) for k in GPU_KINDS.values() for s in k.device_names if _has_words(name, s)]
    if matches:
        return max(matches, key=lambda m: m[0])[1]
    raise UnknownGpu(f"unknown GPU {gpu!r}; known: {', '.join(GPU_KINDS)}")


def peak_tflops(gpu: str, dtype: str = "bf16") -> float:
    """Dense peak TFLOP/s of ``gpu`` (a kind, alias or device name) for ``dtype``."""
    kind = gpu_kind(gpu)
    if dtype not in kind.peak_tflops:
        raise UnknownGpu(f"{kind.name} has no {dtype} tensor cores; it has {', '.join(kind.peak_tflops)}")
    return kind.peak_tflops[dtype]


def known_peak(device_name: str, dtype: str = "bf16") -> float | None:
    """:func:`peak_tflops` of a device name, None for a kind the table does not know (measured, not judged)."""
    try:
        return peak_tflops(device_name, dtype)
    except UnknownGpu:
        return None


def list_price_per_gpu_hour(gpu: str) -> float | None:
    """The rough list price of ``gpu`` (a kind, alias or device name) per GPU-hour; None if unknown."""
    try:
        return LIST_PRICE_PER_GPU_HOUR.get(gpu_kind(gpu).key)
    except UnknownGpu:
        return None


def device_name_peaks(dtype: str = "bf16") -> list[tuple[str, float]]:
    """``(device-name substring, peak)`` pairs, longest substring first: the FSDP script's copy."""
    pairs = {s: k.peak_tflops[dtype] for k in GPU_KINDS.values() for s in k.device_names if dtype in k.peak_tflops}
    return sorted(pairs.items(), key=lambda p: (-len(p[0]), p[0]))
