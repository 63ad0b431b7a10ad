"""GPU kinds (memory, dense peak FLOP/s, power): the table lives once in the job runtime,
:mod:`cookbook_runtime.gpus` (the gate on the nodes reads it there); the planner, the derived metrics and
goodput read it through this module."""

from cookbook_runtime.gpus import (
    GPU_ALIASES,
    GPU_KINDS,
    LIST_PRICE_PER_GPU_HOUR,
    GpuKind,
    UnknownGpu,
    device_name_peaks,
    gpu_kind,
    list_price_per_gpu_hour,
    peak_tflops,
)

__all__ = [
    "GPU_ALIASES",
    "GPU_KINDS",
    "LIST_PRICE_PER_GPU_HOUR",
    "GpuKind",
    "UnknownGpu",
    "device_name_peaks",
    "gpu_kind",
    "list_price_per_gpu_hour",
    "peak_tflops",
]
