"""GPU kinds: usable memory, dense bf16 peak and the MFU the planner assumes, each with its source."""

from __future__ import annotations

from dataclasses import dataclass

from cookbook.gpus import GPU_ALIASES, GPU_KINDS, GpuKind, UnknownGpu

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    """A GPU kind of :mod:`cookbook.gpus` with the MFU the planner assumes on it."""

    kind: GpuKind
    mfu: float  # model-FLOPs utilisation assumed for a well-tuned FSDP run with selective AC
    mfu_source: str

    @property
    def key(self) -> str:
        return self.kind.key

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def memory_gib(self) -> float:
        return self.kind.memory_gib

    @property
    def peak_bf16_tflops(self) -> float:
        return self.kind.peak_bf16_tflops


# MFU anchors (model FLOPs = 6N + 12*L*h*s per token, torchtitan's convention; peaks from cookbook.gpus),
# each for selective op AC (the estimate module scales them for none/full AC and LoRA):
# - torchtitan docs/performance.md (2024-12): Llama 3 8B on 64 A100, selective op AC: 58.2% MFU.
# - torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1: Llama 3.1 8B on 8 H100 (96 GB HBM2e,
#   default 500 W power limit), FSDP, bs 2, seq 8192: 5,762 tok/s/GPU = 33.7% (fitted: the 500 W anchor).
# - Crusoe torchtitan results (https://github.com/crusoecloud/distributed-torchrun-on-slurm/tree/main/torchtitan):
#   H100 (SXM, 700 W) 2 nodes 8,714 tok/s 51.0%;
#   H200 4 nodes 8,895 tok/s 52.1%; B200 2 nodes 17,441 tok/s 44.9%; GB200 3-17 nodes 45.3-47.1% as
#   torchtitan prints it (peak 2,250); against GB200's data-sheet 2,500 that is 40.8-42.4%.
# The planner takes a value a little under the best published one: planning with the best case
# under-books wall time. Power matters: an H100 capped at 500 W (Meta's Grand Teton default, many
# 96 GB HBM2e cards) sustains ~0.8 of the clock a 700 W SXM card holds under dense bf16 GEMMs.
PLANNER_MFU: dict[str, tuple[float, str]] = {
    "a100-40": (0.50, "torchtitan 8B on 64 A100: 56-58%"),
    "a100-80": (0.50, "torchtitan 8B on 64 A100: 56-58%"),
    "h100": (0.42, "Crusoe H100 SXM 51.0%"),
    "h100-500w": (0.34, "torchtitan 8xH100 at 500 W: 33.7%"),
    "h100-96": (0.34, "torchtitan 8xH100 96GB at 500 W: 33.7%"),
    "h200": (0.47, "Crusoe H200 52.1%"),
    "b200": (0.40, "Crusoe B200 44.9%"),
    "gb200": (0.369, "Crusoe GB200 40.8-42.4% of 2,500 (45.3-47.1% of torchtitan's 2,250)"),
}
# The kinds the planner can plan for: those with an MFU anchor.
GPUS: dict[str, GpuSpec] = {k: GpuSpec(GPU_KINDS[k], mfu, src) for k, (mfu, src) in PLANNER_MFU.items()}

# torch.compile: torchtitan 8B on 8 H100 went 5,762 -> 6,667 tok/s (+15.7%) and 82.4 -> 77.0 GiB (-6.5%).
COMPILE_SPEEDUP = 1.15
COMPILE_ACTIVATION_FACTOR = 0.9


def get_gpu(key: str) -> GpuSpec:
    """A GPU kind by key or alias (case-insensitive): ``h100``, ``h100-500w``, ``a100-80`` ..."""
    k = key.lower()
    try:
        return GPUS[GPU_ALIASES.get(k, k)]
    except KeyError:
        raise UnknownGpu(f"unknown GPU {key!r}; the planner knows: {', '.join(GPUS)}") from None
