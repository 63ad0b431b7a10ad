"""Compare the planner with published memory and throughput figures; print a Markdown table.

Run: ``.venv/bin/python benchmarks/planner_vs_published.py [--write]`` (``--write`` replaces the
``## Planner`` section of benchmarks/README.md). Every anchor names its source. No GPU is needed: this
compares formulas with numbers other people measured.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cookbook.planner import Plan, Settings, estimate_memory, get_gpu, get_model, plan
from cookbook.planner.estimate import samples_per_second_per_gpu

TORCHTITAN_PERF = "torchtitan docs/performance.md, Table 1 (8x H100 96GB, 500 W)"
TORCHTITAN_128 = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3 (128x H100 96GB, 500 W)"
TORCHTITAN_A100 = "torchtitan docs/performance.md @4d88a8a (2024-12), Llama 3 on 64 A100"
TORCHTITAN_A100_L2 = "torchtitan docs/performance.md @613bfd0 (2024-04), Llama 2 on 64 A100, seq 4096"
CRUSOE = "Crusoe torchtitan results table (seed 002; reference README)"
TORCHTUNE_README = "torchtune 0.6.1 README, memory/speed table (bs 2, packed 2048, compile)"
TORCHTUNE_OPT = "torchtune 0.6.1 README, optimization flags table (3B, bs 2, seq 4096, A100)"
TORCHTUNE_OPT_LINK = TORCHTUNE_OPT
TORCHTUNE_SLURM = "torchtune multinode tutorial (seed 001): 70B full on 2x8 H100"
NEBIUS_FLUX = "Nebius FLUX.1-schnell README log (seed 004), 2x8 H100"
NEMO = "NeMo AutoModel performance summary (2026-04), DGX-H100 BF16"

MEMORY_TOLERANCE = 0.15  # |planner / published - 1| for peak memory; the tests use the same bound
RATE_TOLERANCE = 0.25  # |planner / published - 1| for tokens/s: the goal is >= 80% of points within it
_SUMMED = (
    "README tokens/s divided by 8: 1,568 tok/s on one A100 would need 679 TFLOP/s (peak 312), so the"
    " table reports the sum over 8 GPUs; memory is torch 'active' (no allocator overhead)"
)
THROUGHPUT_TOLERANCE = 0.35  # MFU differs by cluster, power cap and tuning; a planning bound, not a fit


@dataclass(frozen=True)
class Anchor:
    what: str
    source: str
    published_gib: float | None
    published_rate: float | None  # tokens/s per GPU (images/s for FLUX)
    make_plan: Callable[[], Plan]
    note: str = ""
    active_memory: bool = False  # published figure is torch "active" bytes: compare with Plan.live_gib
    held_out: bool = False  # True: no planner constant was fitted on this figure


def _single_device_3b(**overrides: Any) -> Plan:
    """torchtune full_finetune_single_device, Llama 3.2 3B: bf16 params/grads/AdamW, packed seq 4096."""
    settings = Settings(
        seq_len=4096,
        micro_batch=2,
        checkpointing="full",
        loss="chunked",
        compile=True,
        master_weights_fp32=False,
        optimizer_state_bytes=2,
    ).with_overrides(**overrides)
    return _custom("full_finetune_single_device", "llama3_2_3b", "a100-80", 1, settings)


def _custom(name: str, model_key: str, gpu_key: str, world: int, settings: Settings) -> Plan:
    model, gpu = get_model(model_key), get_gpu(gpu_key)
    return Plan(
        name,
        model,
        gpu,
        1,
        world,
        settings,
        estimate_memory(model, settings, world),
        samples_per_second_per_gpu(model, settings, gpu),
    )


_TITAN = Settings(master_weights_fp32=True, optimizer_state_bytes=4, loss="fp32")
_TUNE = Settings(master_weights_fp32=False, optimizer_state_bytes=2, loss="chunked", checkpointing="full")
_NEMO_NOTE = (
    "activation checkpointing is not stated in the table: the planner assumes full AC; the rate is "
    "GBS x seq / step time / GPUs, as published"
)

ANCHORS: list[Anchor] = [
    Anchor(
        "Llama 3.1 8B, 8x H100, FSDP, bs 2, seq 8192, selective AC",
        TORCHTITAN_PERF,
        82.4,
        5762,
        lambda: plan("llama3_8b_c4", 1, 8, "h100-96"),
        "the 500 W MFU anchor is fitted on this rate",
    ),
    Anchor(
        "  same + torch.compile",
        TORCHTITAN_PERF,
        77.0,
        6667,
        lambda: plan("llama3_8b_c4", 1, 8, "h100-96", compile=True),
    ),
    Anchor(
        "Llama 3.1 8B, 128x H100 (500 W), FSDP, bs 2, seq 8192, selective AC",
        TORCHTITAN_128,
        67.0,
        5605,
        lambda: plan("llama3_8b_c4", 16, 8, "h100-96"),
        held_out=True,
    ),
    Anchor(
        "  same + torch.compile",
        TORCHTITAN_128,
        62.0,
        6514,
        lambda: plan("llama3_8b_c4", 16, 8, "h100-96", compile=True),
        held_out=True,
    ),
    Anchor(
        "Llama 3 8B, 64x A100, FSDP, bs 1, seq 8192, selective op AC",
        TORCHTITAN_A100,
        None,
        2973,
        lambda: plan("llama3_8b_c4", 8, 8, "a100-80", micro_batch=1),
        "the A100 MFU anchor is fitted on this",
    ),
    Anchor(
        "Llama 3 70B, 64x A100, FSDP, bs 1, seq 8192, full AC",
        TORCHTITAN_A100,
        None,
        331,
        lambda: _custom(
            "torchtitan llama3_70b",
            "llama3_1_70b",
            "a100-80",
            64,
            replace(_TITAN, seq_len=8192, micro_batch=1, checkpointing="full"),
        ),
        held_out=True,
    ),
    Anchor(
        "Llama 2 13B, 64x A100, FSDP, bs 2, no AC",
        TORCHTITAN_A100_L2,
        None,
        2162,
        lambda: _custom(
            "torchtitan llama2_13b",
            "llama2_13b",
            "a100-80",
            64,
            replace(_TITAN, seq_len=4096, micro_batch=2, checkpointing="none"),
        ),
        held_out=True,
    ),
    Anchor(
        "  same, selective op AC",
        TORCHTITAN_A100_L2,
        None,
        1904,
        lambda: _custom(
            "torchtitan llama2_13b",
            "llama2_13b",
            "a100-80",
            64,
            replace(_TITAN, seq_len=4096, micro_batch=2, checkpointing="selective"),
        ),
        held_out=True,
    ),
    Anchor(
        "Llama 2 70B, 64x A100, FSDP, bs 2, full AC",
        TORCHTITAN_A100_L2,
        None,
        353,
        lambda: _custom(
            "torchtitan llama2_70b",
            "llama2_70b",
            "a100-80",
            64,
            replace(_TITAN, seq_len=4096, micro_batch=2, checkpointing="full"),
        ),
        held_out=True,
    ),
    Anchor("Llama 3.1 8B, H100 2 nodes (Crusoe)", CRUSOE, None, 8714, lambda: plan("llama3_8b_c4", 2, 8, "h100")),
    Anchor("Llama 3.1 8B, H200 4 nodes (Crusoe)", CRUSOE, None, 8895, lambda: plan("llama3_8b_c4", 4, 8, "h200")),
    Anchor(
        "Llama 3.1 8B, B200 2x8, bs 5", CRUSOE, 161.51, 17441, lambda: plan("llama3_8b_c4", 2, 8, "b200", micro_batch=5)
    ),
    Anchor(
        "Llama 3.1 8B, GB200 3x4, bs 5",
        CRUSOE,
        161.65,
        18284,
        lambda: plan("llama3_8b_c4", 3, 4, "gb200", micro_batch=5),
    ),
    Anchor(
        "Llama 3.1 8B, GB200 9x4, bs 5",
        CRUSOE,
        159.31,
        17975,
        lambda: plan("llama3_8b_c4", 9, 4, "gb200", micro_batch=5),
    ),
    Anchor(
        "Llama 3.1 8B, GB200 17x4, bs 5",
        CRUSOE,
        158.61,
        17581,
        lambda: plan("llama3_8b_c4", 17, 4, "gb200", micro_batch=5),
    ),
    Anchor(
        "Llama 3.3 70B full, 2x8 H100 (tokens/s read as per GPU)",
        TORCHTUNE_SLURM,
        None,
        880,
        lambda: plan("llama3_3_70b_full", 2, 8, "h100"),
    ),
    Anchor(
        "Llama 3.1 70B full, 8x A100, CPU offload + fused",
        TORCHTUNE_README,
        13.9,
        1568 / 8,
        lambda: plan("llama3_3_70b_full", 1, 8, "a100-80", seq_len=2048, micro_batch=2, fsdp_cpu_offload=True),
        _SUMMED,
        active_memory=True,
    ),
    Anchor(
        "Llama 3.1 70B LoRA, 8x A100",
        TORCHTUNE_README,
        27.6,
        3497 / 8,
        lambda: plan("llama3_3_70b_lora", 1, 8, "a100-80", seq_len=2048, micro_batch=2, compile=True),
        _SUMMED,
        active_memory=True,
    ),
    Anchor(
        "Llama 3.2 3B full, 1x A100, packed, no AC, fp32 CE",
        TORCHTUNE_OPT_LINK,
        60.0,
        7075,
        lambda: _single_device_3b(checkpointing="none", loss="fp32", compile=False),
        "torchtune 'Peak Memory Active'",
        active_memory=True,
        held_out=True,
    ),
    Anchor(
        "  + compile",
        TORCHTUNE_OPT_LINK,
        51.0,
        8998,
        lambda: _single_device_3b(checkpointing="none", loss="fp32"),
        active_memory=True,
        held_out=True,
    ),
    Anchor(
        "  + chunked cross-entropy",
        TORCHTUNE_OPT_LINK,
        42.9,
        9174,
        lambda: _single_device_3b(checkpointing="none"),
        active_memory=True,
        held_out=True,
    ),
    Anchor(
        "  + AC (compile + chunked CE + AC)", TORCHTUNE_OPT, 24.9, 7210, lambda: _single_device_3b(), active_memory=True
    ),
    Anchor(
        "  + optimizer in backward",
        TORCHTUNE_OPT,
        23.1,
        7309,
        lambda: _single_device_3b(optimizer_in_backward=True),
        active_memory=True,
    ),
    Anchor(
        "  + activation offloading",
        TORCHTUNE_OPT_LINK,
        21.8,
        7301,
        lambda: _single_device_3b(optimizer_in_backward=True, activation_offloading=True),
        active_memory=True,
        held_out=True,
    ),
    Anchor(
        "  + 8-bit AdamW",
        TORCHTUNE_OPT_LINK,
        17.6,
        6960,
        lambda: _single_device_3b(optimizer_in_backward=True, activation_offloading=True, optimizer_state_bytes=1),
        active_memory=True,
        held_out=True,
    ),
    Anchor(
        "Llama 3.2 3B LoRA r64, 1x A100 (compile, chunked CE, AC, offloading)",
        TORCHTUNE_OPT_LINK,
        8.5,
        8210,
        lambda: _single_device_3b(activation_offloading=True, lora_rank=64),
        "LORA_LOSS_FACTOR is fitted on this memory figure; the rate is held out",
        active_memory=True,
    ),
    Anchor(
        "Llama 3 8B LoRA, 1x H100, bs 2, seq 4096",
        NEMO,
        None,
        12472.87,
        lambda: _custom(
            "nemo automodel lora",
            "llama3_1_8b",
            "h100",
            1,
            replace(_TUNE, seq_len=4096, micro_batch=2, lora_rank=8, loss="fp32"),
        ),
        _NEMO_NOTE,
        held_out=True,
    ),
    Anchor(
        "Llama 3 70B LoRA, 8x H100, TP 2 x FSDP 4, bs 2, seq 4096",
        NEMO,
        None,
        1091.85,
        lambda: _custom(
            "nemo automodel lora",
            "llama3_1_70b",
            "h100",
            8,
            replace(_TUNE, seq_len=4096, micro_batch=2, lora_rank=8, tp=2, loss="fp32"),
        ),
        held_out=True,
    ),
    Anchor(
        "Llama 3 70B LoRA, 16x H100, TP 2 x FSDP 8, bs 2, seq 4096",
        NEMO,
        None,
        984.85,
        lambda: _custom(
            "nemo automodel lora",
            "llama3_1_70b",
            "h100",
            16,
            replace(_TUNE, seq_len=4096, micro_batch=2, lora_rank=8, tp=2, loss="fp32"),
        ),
        held_out=True,
    ),
    Anchor(
        "Llama 3 70B pretrain, 64x H100, FSDP 32 x CP 2, bs 1, seq 8192",
        NEMO,
        None,
        866.77,
        lambda: _custom(
            "nemo automodel pretrain",
            "llama3_1_70b",
            "h100",
            64,
            replace(_TITAN, seq_len=8192, micro_batch=1, checkpointing="full"),
        ),
        "CP 2 not modelled (tokens/s per GPU does not depend on it in the planner); " + _NEMO_NOTE,
        held_out=True,
    ),
    Anchor(
        "FLUX.1-schnell, 2x8 H100, 64 img/GPU, full AC",
        NEBIUS_FLUX,
        76.8,
        7.9,
        lambda: plan("flux_schnell", 2, 8, "h100"),
        "rate in images/s/GPU = logged tps 1.55M / 196,608 pixels per 256x256x3 image (inferred); "
        "FLUX_MFU_FACTOR is fitted on it",
    ),
]


@dataclass
class Row:
    anchor: Anchor
    plan: Plan
    memory_ratio: float | None = field(default=None)
    rate_ratio: float | None = field(default=None)


def _planned_gib(a: Anchor, p: Plan) -> float:
    return p.live_gib if a.active_memory else p.peak_gib


def compare() -> list[Row]:
    rows = []
    for a in ANCHORS:
        p = a.make_plan()
        rows.append(
            Row(
                a,
                p,
                None if a.published_gib is None else _planned_gib(a, p) / a.published_gib,
                None if a.published_rate is None else p.tokens_per_s_per_gpu / a.published_rate,
            )
        )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[Row]) -> str:
    out = [
        "| configuration | held out | source | published GiB | planner GiB | ratio | published /s/GPU |"
        " planner /s/GPU | ratio |",
        "|---|:-:|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        a, p = r.anchor, r.plan
        out.append(
            f"| {a.what.strip()} | {'yes' if a.held_out else ''} | {a.source} | {_fmt(a.published_gib, '.1f')} | "
            f"{_planned_gib(a, p):.1f} | {_fmt(r.memory_ratio, '.2f')} | {_fmt(a.published_rate, ',.1f')} | "
            f"{p.tokens_per_s_per_gpu:,.1f} | {_fmt(r.rate_ratio, '.2f')} |"
        )
    notes = [f"- {r.anchor.what.strip()}: {r.anchor.note}" for r in rows if r.anchor.note]
    return "\n".join(out + [""] + summary_lines(rows) + ([""] + notes if notes else []))


@dataclass(frozen=True)
class Summary:
    """Median planner/published ratio and the share of points within tolerance."""

    points: int
    median: float
    within: int

    @property
    def share(self) -> float:
        return self.within / self.points if self.points else float("nan")


def summarize(rows: list[Row], kind: str, held_out_only: bool = False) -> Summary:
    """``kind`` is "memory" (within MEMORY_TOLERANCE) or "rate" (within RATE_TOLERANCE)."""
    tol = MEMORY_TOLERANCE if kind == "memory" else RATE_TOLERANCE
    ratios = [
        r.memory_ratio if kind == "memory" else r.rate_ratio for r in rows if not held_out_only or r.anchor.held_out
    ]
    ratios = [x for x in ratios if x is not None]
    if not ratios:
        return Summary(0, float("nan"), 0)
    return Summary(len(ratios), statistics.median(ratios), sum(abs(x - 1) <= tol + 1e-9 for x in ratios))


def summary_lines(rows: list[Row]) -> list[str]:
    out = [
        "| points | memory: median ratio | memory: within ±15% | throughput: median ratio | throughput: within ±25% |",
        "|---|--:|--:|--:|--:|",
    ]
    for label, held in (("all", False), ("held out only", True)):
        m, r = summarize(rows, "memory", held), summarize(rows, "rate", held)
        out.append(
            f"| {label} | {m.median:.2f} | {m.within}/{m.points} ({100 * m.share:.0f}%) | {r.median:.2f} | "
            f"{r.within}/{r.points} ({100 * r.share:.0f}%) |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the table in benchmarks/README.md")
    args = parser.parse_args(argv)
    table = markdown(compare())
    print(table)
    if args.write:
        readme = Path(__file__).with_name("README.md")
        text = readme.read_text() if readme.exists() else "# Benchmarks\n"
        begin, end = "<!-- planner-table:begin -->", "<!-- planner-table:end -->"
        if begin not in text:
            print(f"{readme}: no {begin} marker in the ## Planner section", file=sys.stderr)
            return 1
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{table}\n{end}", text, flags=re.S)
        readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
