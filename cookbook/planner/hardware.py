"""GPU kinds: usable memory, dense bf16 peak and the MFU the planner assumes, each with its source."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    memory_gib: float  # what torch.cuda reports as total (torchtitan's "memory: X GiB (Y%)" divides by it)
    peak_bf16_tflops: float  # dense, no sparsity; the value torchtitan's MFU uses
    mfu: float  # model-FLOPs utilisation assumed for a well-tuned FSDP run with selective AC
    mfu_source: str


# MFU anchors (model FLOPs = 6N + 12*L*h*s per token, torchtitan's convention), each for selective op AC
# (the estimate module scales them for none/full AC and LoRA):
# - torchtitan docs/performance.md (2024-12): Llama 3 8B on 64 A100, selective op AC: 58.2% MFU.
# - torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1: Llama 3.1 8B on 8 H100 (96 GB HBM2e,
#   default 500 W power limit), FSDP, bs 2, seq 8192: 5,762 tok/s/GPU = 33.7% (fitted: the 500 W anchor).
# - Crusoe torchtitan results (seed 002 and reference README): H100 (SXM, 700 W) 2 nodes 8,714 tok/s 51.0%;
#   H200 4 nodes 8,895 tok/s 52.1%; B200 2 nodes 17,441 tok/s 44.9%; GB200 3-17 nodes 45.3-47.1%.
# The planner takes a value a little under the best published one: planning with the best case
# under-books wall time. Power matters: an H100 capped at 500 W (Meta's Grand Teton default, many
# 96 GB HBM2e cards) sustains ~0.8 of the clock a 700 W SXM card holds under dense bf16 GEMMs.
GPUS: dict[str, GpuSpec] = {
    "a100-40": GpuSpec("a100-40", "A100 40GB", 39.4, 312.0, 0.50, "torchtitan 8B on 64 A100: 56-58%"),
    "a100-80": GpuSpec("a100-80", "A100 80GB", 79.2, 312.0, 0.50, "torchtitan 8B on 64 A100: 56-58%"),
    "h100": GpuSpec("h100", "H100 80GB SXM (700 W)", 79.2, 989.0, 0.42, "Crusoe H100 SXM 51.0%"),
    "h100-500w": GpuSpec("h100-500w", "H100 80GB SXM capped at 500 W", 79.2, 989.0, 0.34,
                         "torchtitan 8xH100 at 500 W: 33.7%"),
    "h100-96": GpuSpec("h100-96", "H100 96GB HBM2e (Grand Teton, 500 W)", 94.5, 989.0, 0.34,
                       "torchtitan 8xH100 96GB at 500 W: 33.7%"),
    "h200": GpuSpec("h200", "H200 141GB", 139.8, 989.0, 0.47, "Crusoe H200 52.1%"),
    "b200": GpuSpec("b200", "B200 180GB", 178.4, 2250.0, 0.40, "Crusoe B200 44.9%"),
    "gb200": GpuSpec("gb200", "GB200 (186GB HBM)", 184.0, 2250.0, 0.41, "Crusoe GB200 45.3-47.1%"),
}
# Other names people use for the same kinds.
GPU_ALIASES: dict[str, str] = {"h100-sxm": "h100", "h100-700w": "h100", "h100-80": "h100", "a100": "a100-80",
                               "h100-96gb": "h100-96"}

# torch.compile: torchtitan 8B on 8 H100 went 5,762 -> 6,667 tok/s (+15.7%) and 82.4 -> 77.0 GiB (-6.5%).
COMPILE_SPEEDUP = 1.15
COMPILE_ACTIVATION_FACTOR = 0.9


def get_gpu(key: str) -> GpuSpec:
    """A GPU kind by key or alias (case-insensitive): ``h100``, ``h100-500w``, ``a100-80`` ..."""
    k = key.lower()
    try:
        return GPUS[GPU_ALIASES.get(k, k)]
    except KeyError:
        raise KeyError(f"unknown GPU {key!r}; known: {', '.join(GPUS)}") from None
