"""Compare the planner with published memory and throughput figures; print a Markdown table.

Run: ``.venv/bin/python benchmarks/planner_vs_published.py [--write]`` (``--write`` replaces the
``## Planner`` section of benchmarks/README.md). Every anchor names its source. No GPU is needed: this
compares formulas with numbers other people measured.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cookbook.planner import Plan, Settings, estimate_memory, get_gpu, get_model, plan
from cookbook.planner.estimate import samples_per_second_per_gpu

TORCHTITAN_PERF = "torchtitan docs/performance.md, Table 1 (8x H100 96GB, 500 W)"
CRUSOE = "Crusoe torchtitan results table (seed 002; reference README)"
TORCHTUNE_README = "torchtune 0.6.1 README, memory/speed table (bs 2, packed 2048, compile)"
TORCHTUNE_OPT = "torchtune 0.6.1 README, optimization flags table (3B, bs 2, seq 4096, A100)"
TORCHTUNE_SLURM = "torchtune multinode tutorial (seed 001): 70B full on 2x8 H100"
NEBIUS_FLUX = "Nebius FLUX.1-schnell README log (seed 004), 2x8 H100"

MEMORY_TOLERANCE = 0.15  # |planner / published - 1| for peak memory; the tests use the same bound
_SUMMED = ("README tokens/s divided by 8: 1,568 tok/s on one A100 would need 679 TFLOP/s (peak 312), so the"
           " table reports the sum over 8 GPUs; memory is torch 'active' (no allocator overhead)")
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


def _single_device_3b(**overrides: Any) -> Plan:
    """torchtune full_finetune_single_device, Llama 3.2 3B: bf16 params/grads/AdamW, packed seq 4096."""
    settings = Settings(seq_len=4096, micro_batch=2, checkpointing="full", loss="chunked", compile=True,
                        master_weights_fp32=False, optimizer_state_bytes=2).with_overrides(**overrides)
    model, gpu = get_model("llama3_2_3b"), get_gpu("a100-80")
    return Plan("full_finetune_single_device", model, gpu, 1, 1, settings, estimate_memory(model, settings, 1),
                samples_per_second_per_gpu(model, settings, gpu))


ANCHORS: list[Anchor] = [
    Anchor("Llama 3.1 8B, 8x H100, FSDP, bs 2, seq 8192, selective AC", TORCHTITAN_PERF, 82.4, 5762,
           lambda: plan("llama3_8b_c4", 1, 8, "h100-96")),
    Anchor("  same + torch.compile", TORCHTITAN_PERF, 77.0, 6667,
           lambda: plan("llama3_8b_c4", 1, 8, "h100-96", compile=True)),
    Anchor("Llama 3.1 8B, H100 2 nodes (Crusoe)", CRUSOE, None, 8714,
           lambda: plan("llama3_8b_c4", 2, 8, "h100")),
    Anchor("Llama 3.1 8B, H200 4 nodes (Crusoe)", CRUSOE, None, 8895,
           lambda: plan("llama3_8b_c4", 4, 8, "h200")),
    Anchor("Llama 3.1 8B, B200 2x8, bs 5", CRUSOE, 161.51, 17441,
           lambda: plan("llama3_8b_c4", 2, 8, "b200", micro_batch=5)),
    Anchor("Llama 3.1 8B, GB200 3x4, bs 5", CRUSOE, 161.65, 18284,
           lambda: plan("llama3_8b_c4", 3, 4, "gb200", micro_batch=5)),
    Anchor("Llama 3.1 8B, GB200 9x4, bs 5", CRUSOE, 159.31, 17975,
           lambda: plan("llama3_8b_c4", 9, 4, "gb200", micro_batch=5)),
    Anchor("Llama 3.1 8B, GB200 17x4, bs 5", CRUSOE, 158.61, 17581,
           lambda: plan("llama3_8b_c4", 17, 4, "gb200", micro_batch=5)),
    Anchor("Llama 3.3 70B full, 2x8 H100 (tokens/s read as per GPU)", TORCHTUNE_SLURM, None, 880,
           lambda: plan("llama3_3_70b_full", 2, 8, "h100")),
    Anchor("Llama 3.1 70B full, 8x A100, CPU offload + fused", TORCHTUNE_README, 13.9, 1568 / 8,
           lambda: plan("llama3_3_70b_full", 1, 8, "a100-80", seq_len=2048, micro_batch=2,
                        fsdp_cpu_offload=True),
           _SUMMED, active_memory=True),
    Anchor("Llama 3.1 70B LoRA, 8x A100", TORCHTUNE_README, 27.6, 3497 / 8,
           lambda: plan("llama3_3_70b_lora", 1, 8, "a100-80", seq_len=2048, micro_batch=2, compile=True),
           _SUMMED, active_memory=True),
    Anchor("Llama 3.2 3B full, 1x A100, compile + chunked CE + AC", TORCHTUNE_OPT, 24.9, 7210,
           lambda: _single_device_3b(), "torchtune 'Peak Memory Active'", active_memory=True),
    Anchor("  same + optimizer in backward", TORCHTUNE_OPT, 23.1, 7309,
           lambda: _single_device_3b(optimizer_in_backward=True), active_memory=True),
    Anchor("FLUX.1-schnell, 2x8 H100, 64 img/GPU, full AC", NEBIUS_FLUX, 76.8, 7.9,
           lambda: plan("flux_schnell", 2, 8, "h100"),
           "rate in images/s/GPU = logged tps 1.55M / 196,608 pixels per 256x256x3 image (inferred)"),
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
        rows.append(Row(a, p,
                        None if a.published_gib is None else _planned_gib(a, p) / a.published_gib,
                        None if a.published_rate is None else p.tokens_per_s_per_gpu / a.published_rate))
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[Row]) -> str:
    out = ["| configuration | source | published GiB | planner GiB | ratio | published /s/GPU | planner /s/GPU"
           " | ratio |", "|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        a, p = r.anchor, r.plan
        out.append(f"| {a.what.strip()} | {a.source} | {_fmt(a.published_gib, '.1f')} | {_planned_gib(a, p):.1f} | "
                   f"{_fmt(r.memory_ratio, '.2f')} | {_fmt(a.published_rate, ',.1f')} | "
                   f"{p.tokens_per_s_per_gpu:,.1f} | {_fmt(r.rate_ratio, '.2f')} |")
    notes = [f"- {r.anchor.what.strip()}: {r.anchor.note}" for r in rows if r.anchor.note]
    return "\n".join(out + ([""] + notes if notes else []))


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
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{table}\n{end}", text,
                      flags=re.S)
        readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
