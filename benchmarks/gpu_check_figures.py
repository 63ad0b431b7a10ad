"""The GPU check's arithmetic and report (#31): MFU, planner beside measured, published anchors, the time budget,
the results file's schema and its Markdown tables. Pure functions: no torch, no processes.

MFU = measured units/s per GPU x the planner's FLOPs per unit (:func:`cookbook.planner.estimate.flops_per_sample`)
/ the bf16 peak of the project's one GPU table (:mod:`cookbook.gpus`). The planner's estimate for the same shape
comes from its public functions (``estimate_memory``, ``samples_per_second_per_gpu``); a ratio planner / measured
off by more than the planner's throughput tolerance (``RATE_TOLERANCE`` of ``benchmarks/planner_vs_published.py``,
25%) is flagged: the planner needs recalibrating there. The published anchors are read from that same file.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from cookbook.planner import FluxShape, ModelShape, Settings, estimate_memory, get_gpu
from cookbook.planner.estimate import flops_per_sample, samples_per_second_per_gpu, tokens_per_sample
from cookbook.planner.hardware import GIB

SCHEMA = "cookbook-gpu-check/1"
PUBLISHED = Path(__file__).with_name("planner_vs_published.py")


@cache
def published() -> ModuleType:
    """``benchmarks/planner_vs_published.py``: the published anchors and the planner's tolerances live there."""
    spec = importlib.util.spec_from_file_location("planner_vs_published", PUBLISHED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def rate_tolerance() -> float:
    return float(published().RATE_TOLERANCE)


def memory_tolerance() -> float:
    return float(published().MEMORY_TOLERANCE)


# ------------------------------------------------------------------------------------------------ arithmetic


def flops_per_unit(model: ModelShape | FluxShape, s: Settings) -> float:
    """Training FLOPs per token (LLM) or per image (FLUX), the planner's count."""
    per_sample = flops_per_sample(model, s)
    return per_sample if isinstance(model, FluxShape) else per_sample / tokens_per_sample(model, s)


def mfu(rate_per_gpu: float | None, flops_per_unit: float, peak_tflops: float | None) -> float | None:
    """Model-FLOPs utilisation: achieved FLOP/s over the dense bf16 peak (None without a rate or a peak)."""
    if rate_per_gpu is None or not peak_tflops or rate_per_gpu <= 0:
        return None
    return rate_per_gpu * flops_per_unit / (peak_tflops * 1e12)


def ratio(planned: float | None, measured: float | None) -> float | None:
    """planner / measured (None when either is missing or the measurement is zero)."""
    if planned is None or measured is None or measured <= 0:
        return None
    return planned / measured


def off(r: float | None, tolerance: float) -> bool:
    """A ratio further than ``tolerance`` from 1 (a missing ratio is not flagged: there is nothing to compare)."""
    return r is not None and abs(r - 1) > tolerance + 1e-9


def steady_rate(rates: Mapping[int, float], warmup: int) -> float | None:
    """Median units/s over the steps after the first ``warmup`` (all steps when no later one was logged)."""
    later = [v for step, v in rates.items() if step > warmup]
    values = later or list(rates.values())
    return statistics.median(values) if values else None


def wall_rate(step_times: Mapping[int, float], warmup: int, units_per_step: float) -> float | None:
    """Units/s between the first and the last step after ``warmup``, by when their log lines arrived: everything
    between two steps counts (a stop check after a step's timer, a save), which a framework's own per-step rate
    may leave out. None with fewer than two such steps."""
    later = sorted((step, t) for step, t in step_times.items() if step > warmup)
    if len(later) < 2 or later[-1][1] <= later[0][1]:
        return None
    return (later[-1][0] - later[0][0]) * units_per_step / (later[-1][1] - later[0][1])


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / median of repeated measurements."""
    if not values:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else None


def planner_estimate(model: ModelShape | FluxShape, s: Settings, gpu_key: str, world: int) -> dict[str, Any]:
    """What the planner says for this shape on ``world`` GPUs of kind ``gpu_key``: rate per GPU, memory, MFU."""
    gpu = get_gpu(gpu_key)
    memory = estimate_memory(model, s, world)
    sps = samples_per_second_per_gpu(model, s, gpu)
    unit_rate = sps if isinstance(model, FluxShape) else sps * tokens_per_sample(model, s)
    per_unit = flops_per_unit(model, s)
    return {
        "gpu": gpu.key,
        "rate": unit_rate,
        "unit": "images" if isinstance(model, FluxShape) else "tokens",
        "peak_gib": memory.total / GIB,
        "live_gib": memory.live / GIB,
        "flops_per_unit": per_unit,
        "mfu": mfu(unit_rate, per_unit, gpu.peak_bf16_tflops),
        "params": model.total_params,
    }


def compare(measured_rate: float | None, measured_gib: float | None, planned: Mapping[str, Any]) -> dict[str, Any]:
    """planner / measured for rate and memory, each with its flag (rate: 25%, memory: 15%, the planner's goals)."""
    rate_r = ratio(planned["rate"], measured_rate)
    mem_r = ratio(planned["peak_gib"], measured_gib)
    return {
        "rate_ratio": rate_r,
        "rate_off": off(rate_r, rate_tolerance()),
        "memory_ratio": mem_r,
        "memory_off": off(mem_r, memory_tolerance()),
    }


# -------------------------------------------------------------------------------------------- published anchors

# Which anchor of planner_vs_published.ANCHORS stands beside which run: (program, variant) -> (source, label).
ANCHOR_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    ("titan_llama3", "base"): ("TORCHTITAN_PERF", "Llama 3.1 8B, 8x H100, FSDP, bs 2, seq 8192, selective AC"),
    ("titan_llama3", "compile"): ("TORCHTITAN_PERF", "same + torch.compile"),
    ("tune_lora", "base"): ("NEMO", "Llama 3 70B LoRA, 16x H100, TP 2 x FSDP 8, bs 2, seq 4096"),
}


def anchor(program: str, variant: str) -> dict[str, Any] | None:
    """The published figure for this run's recipe, from ``planner_vs_published.ANCHORS``: its rate, its MFU (the
    planner's FLOPs count on the anchor's own shape and GPU) and what the planner says for it."""
    key = ANCHOR_KEYS.get((program, variant))
    if key is None:
        return None
    bench = published()
    source = getattr(bench, key[0])
    found = [a for a in bench.ANCHORS if a.source == source and a.what.strip() == key[1]]
    if len(found) != 1:
        raise LookupError(f"planner_vs_published.py has {len(found)} anchors {key[1]!r} of {source!r}")
    a = found[0]
    p = a.make_plan()
    return {
        "what": a.what.strip(),
        "source": a.source,
        "rate": a.published_rate,
        "gpu": p.gpu.key,
        "world": p.world,
        "mfu": mfu(a.published_rate, flops_per_unit(p.model, p.settings), p.gpu.peak_bf16_tflops),
        "planner_rate": p.tokens_per_s_per_gpu,
    }


# ------------------------------------------------------------------------------------------------ time budget


@dataclass(frozen=True)
class Slot:
    """A part's place in the budget: what it is expected to take and the wall-clock limit of its processes."""

    run: bool
    timeout_s: float
    reason: str


def slot(estimate_s: float, remaining_s: float, reserve_s: float = 10.0, slack_s: float = 60.0) -> Slot:
    """Run a part only when its estimate fits what is left of the deadline (less ``reserve_s`` for writing the
    results); its processes may then take twice the estimate (at least ``slack_s`` more: CPU mode shares its cores
    with a test suite), never past the deadline."""
    usable = remaining_s - reserve_s
    if estimate_s > usable:
        return Slot(False, 0.0, f"does not fit the deadline: needs ~{estimate_s:.0f} s, {max(usable, 0):.0f} s left")
    return Slot(True, min(usable, max(2 * estimate_s, estimate_s + slack_s)), "")


def plan_budget(estimates: Sequence[tuple[str, float]], deadline_s: float, reserve_s: float = 10.0,
                jobs: int = 1) -> list[tuple[str, float, float, bool]]:  # fmt: skip
    """The plan printed before anything runs: (part, estimate, expected end, fits) in priority order, ``jobs`` parts
    at a time (each to the least busy of ``jobs`` lanes)."""
    lanes = [0.0] * max(1, jobs)
    out = []
    for name, est in estimates:
        i = lanes.index(min(lanes))
        fits = lanes[i] + est <= deadline_s - reserve_s
        if fits:
            lanes[i] += est
        out.append((name, est, lanes[i], fits))
    return out


# ---------------------------------------------------------------------------------------------------- schema

REQUIRED: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "mode": str,
    "started": str,
    "seconds": (int, float),
    "deadline_s": (int, float),
    "command": str,
    "device": dict,
    "versions": dict,
    "budget": list,
    "matmul": dict,
    "programs": list,
    "stop_saves": list,
    "ab": list,
}
PROGRAM_KEYS = ("program", "variant", "title", "status", "shape", "settings", "steps", "rate", "unit", "mfu",
                "peak_gib", "planner", "compare", "anchor", "error", "log")  # fmt: skip
STATUSES = ("ok", "failed", "skipped")


def validate(result: Mapping[str, Any]) -> list[str]:
    """What is wrong with a results dict (empty: it has the schema's keys and types)."""
    problems = [f"{k}: missing or not {t}" for k, t in REQUIRED.items() if not isinstance(result.get(k), t)]
    if result.get("schema") != SCHEMA:
        problems.append(f"schema is {result.get('schema')!r}, not {SCHEMA!r}")
    if result.get("mode") not in ("gpu", "cpu"):
        problems.append(f"mode {result.get('mode')!r}")
    for row in result.get("programs") or []:
        missing = [k for k in PROGRAM_KEYS if k not in row]
        if missing:
            problems.append(f"program row {row.get('program')}/{row.get('variant')}: no {', '.join(missing)}")
        if row.get("status") not in STATUSES:
            problems.append(f"program row {row.get('program')}: status {row.get('status')!r}")
        if row.get("status") == "ok" and not row.get("rate"):
            problems.append(f"program row {row.get('program')}/{row.get('variant')}: ok without a rate")
        if row.get("status") == "failed" and not row.get("error"):
            problems.append(f"program row {row.get('program')}/{row.get('variant')}: failed without an error")
    for part in result.get("budget") or []:
        if part.get("status") not in ("ran", "failed", "skipped"):
            problems.append(f"budget part {part.get('part')}: status {part.get('status')!r}")
    return problems


# ---------------------------------------------------------------------------------------------------- tables


def _f(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _gb(n: int | None) -> float | None:
    return None if n is None else n / 1e9


def _ratio(value: float | None, flagged: bool) -> str:
    return "-" if value is None else f"{value:.2f}" + (" **off**" if flagged else "")


def markdown(result: Mapping[str, Any]) -> str:
    """The tables of ``benchmarks/README.md``'s GPU check section, from a results dict."""
    head = [_summary(result), "", *_program_table(result["programs"])]
    head += _matmul_table(result["matmul"]) + _stop_save_table(result["stop_saves"]) + _ab_table(result["ab"])
    skipped = [p for p in result["budget"] if p["status"] != "ran"]
    if skipped:
        head += [""] + [f"- {p['part']}: {p['status']} ({p.get('reason') or '-'})" for p in skipped]
    return "\n".join(head)


def _summary(result: Mapping[str, Any]) -> str:
    """The first line: mode, device, peak and its source, versions, when, time against the deadline, command."""
    dev, ver = result["device"], result["versions"]
    return (
        f"Mode **{result['mode']}**, {dev.get('count', 0)} x {dev.get('name', '?')} (driver {dev.get('driver') or '-'},"
        f" peak {_f(dev.get('peak_bf16_tflops'), 'g')} TFLOP/s bf16 from `{dev.get('peak_source', '-')}`); torch "
        f"{ver.get('torch', '-')} (CUDA {ver.get('cuda') or '-'}), torchtune {ver.get('torchtune') or '-'}, "
        f"torchtitan {ver.get('torchtitan') or '-'}, torchao {ver.get('torchao') or '-'}; {result['started']}, "
        f"{result['seconds']:.0f} s of a {result['deadline_s']:.0f} s deadline; `{result['command']}`."
    )


def _program_table(programs: list[dict[str, Any]]) -> list[str]:
    """One row per program run: measured against the planner and the published figure; a failed run its error."""
    lines = [
        "| program | run | shape (of the real model) | steps | /s/GPU | MFU | peak GiB | planner /s/GPU | planner/"
        "measured | planner GiB | planner/measured | published /s/GPU (MFU) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in programs:
        if r["status"] != "ok":
            lines.append(
                f"| {r['program']} | {r['variant']} | {r['shape']} | - | **{r['status']}**: "
                f"{(r.get('error') or '').splitlines()[0][:120] if r.get('error') else ''} ||||||||"
            )
            continue
        p, c, a = r["planner"], r["compare"], r["anchor"]
        published_text = "-" if not a else f"{a['rate']:,.0f} ({_pct(a['mfu'])}, {a['world']}x {a['gpu']})"
        lines.append(
            f"| {r['program']} | {r['variant']} | {r['shape']} | {r['steps']} | {r['rate']:,.1f} {r['unit']} | "
            f"{_pct(r['mfu'])} | {_f(r['peak_gib'], '.1f')} | {p['rate']:,.1f} | "
            f"{_ratio(c['rate_ratio'], c['rate_off'])} | {p['peak_gib']:.1f} | "
            f"{_ratio(c['memory_ratio'], c['memory_off'])} | {published_text} |"
        )
    return lines


def _matmul_table(m: Mapping[str, Any]) -> list[str]:
    """The pre-flight matmul's repeats, median, fraction of peak and spread (nothing when it did not run)."""
    if not m.get("tflops"):
        return []
    return ["", "| pre-flight matmul | repeats | TFLOP/s (each) | median | fraction of peak | spread |",
            "|---|--:|---|--:|--:|--:|",
            f"| {m.get('device')} | {len(m['tflops'])} | {', '.join(f'{v:.1f}' for v in m['tflops'])} | "
            f"{m['median']:.1f} | {_pct(m.get('fraction_of_peak'))} | {_pct(m.get('spread'))} |"]  # fmt: skip


def _stop_save_table(stop_saves: list[dict[str, Any]]) -> list[str]:
    """One row per stop-save: where it held and saved, how fast, where it resumed, steps redone, its status."""
    if not stop_saves:
        return []
    lines = ["", "| stop-save | USR1 held at step | saved at step | save s | GB written | GB/s | resumed at step | "
             "steps redone | first step after start s: run / resume | status |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]  # fmt: skip
    for s in stop_saves:
        status = s["status"] + (f": {(s.get('error') or '')[:160]}" if s["status"] != "ok" else "")
        lines.append(
            f"| {s['program']} | {s['stop_at']} | {_f(s.get('saved_step'), 'd')} | {_f(s.get('save_s'), '.1f')} | "
            f"{_f(_gb(s.get('bytes')), '.2f')} | {_f(s.get('gb_per_s'), '.2f')} | {_f(s.get('resumed_at'), 'd')} | "
            f"{_f(s.get('steps_redone'), 'd')} | {_f(s.get('first_step_s'), '.0f')} / "
            f"{_f(s.get('resume_first_step_s'), '.0f')} | {status} |"
        )
    return lines


def _ab_table(ab_rows: list[dict[str, Any]]) -> list[str]:
    """One row per A/B variant beside its base run: settings, rates, their ratios and memory."""
    if not ab_rows:
        return []
    title = "| A/B | program | base | variant | /s/GPU base -> variant | variant / base: wall (logged) | GiB |"
    lines = ["", title, "|---|---|---|---|--:|--:|--:|"]
    for ab in ab_rows:
        lines.append(
            f"| {ab['variant']} | {ab['program']} | {ab['base_setting']} | {ab['variant_setting']} | "
            f"{_f(ab['base_rate'], ',.1f')} -> {_f(ab['variant_rate'], ',.1f')} | {_f(ab['ratio'], '.3f')} "
            f"({_f(ab.get('log_ratio'), '.3f')}) | "
            f"{_f(ab['base_gib'], '.1f')} -> {_f(ab['variant_gib'], '.1f')} |"
        )
    return lines
