"""``make gpu-check``: every recipe's training program on this machine's GPUs, against the planner and the published
figures (issue #31). One prepared call: versions first, then each part in its own processes, within a deadline.

    python benchmarks/gpu_check.py [--deadline 480] [--out FILE] [--copy-to DIR]   # on the GPUs of one machine
    python benchmarks/gpu_check.py --cpu [--jobs 2] [--out FILE]                     # tiny shapes, 3 steps (the tests)
    python benchmarks/gpu_check.py --table RESULTS.json [--write-readme]             # the README's tables

Parts, most wanted first (each skipped, and said so, when its estimate no longer fits the deadline): the versions
(torch, CUDA, driver, the frameworks, whether each imports); the pre-flight gate's matmul, five times; the inputs
(random weights in each framework's format, long local samples); each training program at the real width with
fewer blocks (``gpu_check_programs.PROGRAMS``), the recipe's settings, ~20 steps: tokens/s/GPU, MFU, peak memory,
the planner's estimate of the same shape and the published anchor where there is one; for torchtitan Llama 3 and
torchtune LoRA a USR1 mid-run (the save's seconds and bytes, the resume, the steps redone); then the A/B runs
(the runtime's per-step stop check and the flight recorder off, compile and activation checkpointing flipped).
A program that fails is a row with its error, never the end of the check. Results: ``--out`` (JSON, schema in
``gpu_check_figures``) and its Markdown beside it; GPU runs default to ``benchmarks/results/``, CPU mode to the
ignored ``out/gpu_check/`` and says ``"mode": "cpu"``: no figure that did not come from a GPU lands in results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# benchmarks/ (no package), the checkout (cookbook) and slurm-recipes/ (cookbook_runtime): a device machine has the
# working tree, not an installed cookbook
sys.path[:0] = [p for p in (str(_HERE), str(_HERE.parent), str(_HERE.parent / "slurm-recipes")) if p not in sys.path]
import gpu_check_figures as figures  # noqa: E402
import gpu_check_programs as progs  # noqa: E402
from gpu_check_parts import (  # noqa: E402
    Context,
    part_assets_flux,
    part_assets_tune,
    part_matmul,
    part_program,
    part_resume,
    part_telemetry,
    part_versions,
)

ROOT = progs.ROOT
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
TABLE_BEGIN, TABLE_END = "<!-- gpu-check-table:begin -->", "<!-- gpu-check-table:end -->"
# Seconds per part: (GPU, CPU). GPU: guessed for one H100 before any device run (start-up ~15-25 s a process,
# compile ~40 s, saves at ~1-2 GB/s): replace with the first device run's `budget` seconds. CPU: the 2-core bench.
ESTIMATES: dict[str, tuple[float, float]] = {
    "versions": (15, 8), "matmul": (20, 5), "telemetry": (5, 1), "assets:tune": (40, 8), "assets:flux": (30, 14),
    "titan_llama3": (70, 14), "tune_lora": (45, 7), "tune_full": (90, 8), "fsdp": (40, 12), "flux": (50, 14),
    "titan_llama3:resume": (50, 14), "tune_lora:resume": (40, 7),
    "titan_llama3:compile": (90, 20), "titan_llama3:ac": (40, 14), "tune_full:compile": (80, 12),
    "tune_full:stop-check-off": (60, 8), "tune_full:flight-recorder-off": (60, 8), "tune_lora:ac": (40, 8),
    "tune_lora:compile": (60, 10), "fsdp:stop-check-off": (35, 12), "fsdp:flight-recorder-off": (35, 12),
    "fsdp:ac": (35, 12), "flux:ac": (45, 14),
}  # fmt: skip
GPU_ORDER = ("titan_llama3", "tune_lora", "tune_full", "fsdp", "flux")


# ------------------------------------------------------------------------------------------------- schedule


@dataclass
class Task:
    name: str
    estimate: float
    run: Callable[[figures.Slot], None]
    after: tuple[str, ...] = ()


def execute(ctx: Context, tasks: list[Task], jobs: int, done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``tasks`` in order, ``jobs`` at a time, each once its ``after`` parts are ``done`` and only while its
    estimate fits the deadline; a part whose prerequisite failed or was skipped is skipped too. The budget's records."""
    pending = list(tasks)
    running: dict[Future[None], tuple[Task, float]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            ready = [t for t in pending if all(a in done for a in t.after)]
            while ready and len(running) < jobs:
                task = ready.pop(0)
                pending.remove(task)
                bad = [a for a in task.after if done[a]["status"] != "ran"]
                s = figures.slot(task.estimate, ctx.remaining(), slack_s=60.0 if ctx.mode == "gpu" else 300.0)
                if bad or not s.run:
                    reason = f"needs {', '.join(bad)}, which did not run" if bad else s.reason
                    done[task.name] = _record(task, "skipped", 0.0, reason)
                    print(f"gpu_check: skip {task.name}: {reason}", flush=True)
                    continue
                print(
                    f"gpu_check: start {task.name} (~{task.estimate:.0f} s, {ctx.remaining():.0f} s left)", flush=True
                )
                running[pool.submit(task.run, s)] = (task, time.monotonic())
            if not running:
                if pending and not ready:  # a prerequisite that is no part of this check
                    for task in pending:
                        done[task.name] = _record(task, "skipped", 0.0, f"needs {', '.join(task.after)}")
                    pending.clear()
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                task, began = running.pop(fut)
                error = fut.exception()
                status = "ran" if error is None else "failed"
                done[task.name] = _record(task, status, time.monotonic() - began, str(error or ""))
                print(f"gpu_check: {status} {task.name} in {time.monotonic() - began:.0f} s"
                      + (f": {str(error)[:300]}" if error else ""), flush=True)  # fmt: skip
    return [done[t.name] for t in tasks]


def _record(task: Task, status: str, seconds: float, reason: str) -> dict[str, Any]:
    return {"part": task.name, "estimate_s": task.estimate, "status": status, "seconds": round(seconds, 1),
            "reason": reason[:600]}  # fmt: skip


def build_tasks(ctx: Context, variants: list[tuple[str, str]]) -> list[Task]:
    """The parts in priority order, with what each needs first."""
    est = 0 if ctx.mode == "gpu" else 1

    def t(name: str, fn: Callable[[figures.Slot], None], after: tuple[str, ...] = ()) -> Task:
        return Task(name, ESTIMATES[name][est], fn, after)

    first: tuple[str, ...] = ("versions",) if ctx.mode == "gpu" else ()  # CPU mode: the versions run beside

    def program_task(p: progs.Program, v: progs.Variant | None = None) -> Task:
        name = p.name if v is None else f"{p.name}:{v.name}"
        after = first + ((f"assets:{p.assets}",) if p.assets else ()) + ((p.name,) if v else ())
        return t(name, lambda s: part_program(ctx, p, v, s), after)

    tasks = [t("versions", lambda s: part_versions(ctx, s)), t("matmul", lambda s: part_matmul(ctx, s), first),
             t("telemetry", lambda s: part_telemetry(ctx, s), first),
             t("assets:tune", lambda s: part_assets_tune(ctx, s), first)]  # fmt: skip
    for name in GPU_ORDER:
        if name == "flux":
            tasks.append(t("assets:flux", lambda s: part_assets_flux(ctx, s), first))
        tasks.append(program_task(progs.PROGRAMS[name]))
    for name in progs.STOP_SAVE_PROGRAMS:  # after every program's throughput: the resumes of the stop-saves
        p = progs.PROGRAMS[name]
        tasks.append(t(f"{name}:resume", lambda s, p=p: part_resume(ctx, p, s), (name,)))  # type: ignore[misc]
    for program, variant in variants:
        p, v = progs.PROGRAMS[program], progs.VARIANTS[variant]
        progs.check_variant(p, v)
        tasks.append(program_task(p, v))
    return tasks


# ---------------------------------------------------------------------------------------------------- report


def ab_rows(ctx: Context) -> list[dict[str, Any]]:
    """Each variant beside its program's base run: variant / base of the wall-clock rate (when the step lines arrived:
    the stop check runs after the FSDP script's step timer) and of the frameworks' own rates, and both memories."""
    out = []
    for (program, name), row in sorted(ctx.rows.items()):
        base = ctx.rows.get((program, "base"))
        if name == "base" or base is None:
            continue
        v = progs.VARIANTS[name]
        if v.kind == "overhead":
            what = name.removesuffix("-off").replace("-", " ")
            settings = (f"{what} on", f"{what} off")
        else:
            key = v.setting
            settings = (f"{key} {base['settings'][key]}", f"{key} {row['settings'][key]}")
        both = row["status"] == base["status"] == "ok"
        out.append({"program": program, "variant": name, "base_setting": settings[0], "variant_setting": settings[1],
                    "base_rate": base["rate"], "variant_rate": row["rate"],
                    "ratio": figures.ratio(row.get("wall_rate"), base.get("wall_rate")) if both else None,
                    "log_ratio": row["rate"] / base["rate"] if both else None, "base_gib": base["peak_gib"],
                    "variant_gib": row["peak_gib"], "status": "ok" if both else "failed"})  # fmt: skip
    return out


def device_record(ctx: Context) -> dict[str, Any]:
    dev = dict(ctx.found.get("device") or {"count": 0})
    dev["name"] = dev.get("name") or "cpu"
    dev |= {"peak_bf16_tflops": ctx.peak, "planner_gpu": ctx.gpu_key, "nproc": ctx.nproc}
    return dev


def set_device(ctx: Context, peak_arg: float | None, planner_gpu: str | None) -> str:
    """The peak (the one GPU table, or ``--peak-tflops``) and the planner's GPU kind; returns where the peak is from."""
    from cookbook.gpus import UnknownGpu, gpu_kind
    from cookbook.planner import GPUS

    name = (ctx.found.get("device") or {}).get("name")
    kind = None
    if name:
        try:
            kind = gpu_kind(name)
        except UnknownGpu:
            kind = None
    ctx.gpu_key = planner_gpu or (kind.key if kind is not None and kind.key in GPUS else "h100")
    if peak_arg:
        ctx.peak = peak_arg
        return "--peak-tflops" + (" (nominal: CPU mode)" if ctx.mode == "cpu" else "")
    ctx.peak = kind.peak_bf16_tflops if kind is not None else None
    return "cookbook.gpus (cookbook_runtime/gpus.py)" if kind is not None else "none: not in the table"


def write_outputs(result: dict[str, Any], out: Path, copy_to: Path | None, work: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = figures.markdown(result)
    out.with_suffix(".md").write_text(table + "\n")
    print(table, flush=True)
    print(f"gpu_check: wrote {out} and {out.with_suffix('.md')}", flush=True)
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, copy_to / out.name)
        shutil.copy(out.with_suffix(".md"), copy_to / out.with_suffix(".md").name)
        with tarfile.open(copy_to / f"{out.stem}.logs.tar.gz", "w:gz") as tar:
            tar.add(work / "logs", arcname=f"{out.stem}.logs")


def default_out(mode: str, kind: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if mode == "cpu":
        return ROOT / "out" / "gpu_check" / f"cpu_{stamp}.json"
    return RESULTS / f"gpu_check_{kind}_{stamp}.json"


def program_rows(ctx: Context, tasks: list[Task], budget: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per program part in GPU_ORDER, base first; a part that measured nothing gets its missing row."""
    order = {name: i for i, name in enumerate(GPU_ORDER)}
    rows = sorted(ctx.rows.values(), key=lambda r: (order.get(r["program"], 99), r["variant"] != "base", r["variant"]))
    for task in tasks:  # a part that never produced a row (skipped, or failed before measuring) still gets one
        program, _, variant = task.name.partition(":")
        if program in progs.PROGRAMS and variant != "resume" and (program, variant or "base") not in ctx.rows:
            rows.append(_missing_row(program, variant or "base", budget))
    return rows


def mark_unresumed(ctx: Context, budget: list[dict[str, Any]]) -> None:
    """A stop-save whose resume part did not run says so, with that part's reason."""
    for save in ctx.stop_saves:  # saved, but its resume part did not run
        if save["status"] == "saved":
            part = next((b for b in budget if b["part"] == f"{save['program']}:resume"), {})
            save |= {"status": "not resumed", "error": part.get("reason") or "the resume part did not run"}


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """The whole check: returns the results dict (also written to ``--out``)."""
    from cookbook.local.assets.tiny import ensure_tiny_assets

    began = time.monotonic()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    mode = "cpu" if args.cpu else "gpu"
    work = Path(args.work) if args.work else ROOT / "out" / "gpu_check" / f"work-{mode}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    tiny = ensure_tiny_assets().root
    paths = progs.Paths(tiny=tiny, assets=work / "assets", runs=work / "runs")
    ctx = Context(mode, 1, paths, work, began + args.deadline, keep_runs=args.keep_runs)
    variants = progs.DEFAULT_VARIANTS[mode] if args.variants is None else _pairs(args.variants)
    tasks = build_tasks(ctx, list(variants))
    if args.only:
        tasks = only(tasks, set(args.only.split(",")))
    budget: list[dict[str, Any]] = []
    if mode == "gpu":  # versions first: what the device is decides the rest
        budget.append(_versions_first(ctx, tasks.pop(0)))
        if not (ctx.found.get("device") or {}).get("count"):
            why = budget[0]["reason"] or "the versions probe saw none"
            raise SystemExit(f"gpu_check: no CUDA device here ({why}); --cpu runs the tiny CPU mode")
    ctx.nproc = args.nproc or int((ctx.found.get("device") or {}).get("count") or 1)
    peak_source = set_device(ctx, args.peak_tflops or (1.0 if mode == "cpu" else None), args.planner_gpu)
    jobs = args.jobs or (1 if mode == "gpu" else 2)
    print_plan(ctx, tasks, jobs)
    budget += execute(ctx, tasks, jobs, {b["part"]: b for b in budget})
    rows = program_rows(ctx, tasks, budget)
    mark_unresumed(ctx, budget)
    result = {
        "schema": figures.SCHEMA,
        "mode": mode,
        "started": started,
        "seconds": round(time.monotonic() - began, 1),
        "deadline_s": args.deadline,
        "command": args.command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "device": device_record(ctx) | {"peak_source": peak_source},
        "versions": ctx.found.get("versions", {}),
        "imports": ctx.found.get("imports", {}),
        "budget": budget,
        "matmul": ctx.found.get("matmul", {}),
        "telemetry": ctx.found.get("telemetry", {}),
        "programs": rows,
        "stop_saves": ctx.stop_saves,
        "ab": ab_rows(ctx),
        "steps": {"run": asdict(progs.STEPS[mode]), "variant": asdict(progs.VARIANT_STEPS[mode])},
    }
    out = Path(args.out) if args.out else default_out(mode, ctx.gpu_key)
    if mode == "cpu" and RESULTS in out.resolve().parents:
        raise SystemExit(f"gpu_check: a CPU-mode result does not go to {RESULTS} (figures there come from a GPU)")
    write_outputs(result, out, Path(args.copy_to) if args.copy_to else None, work)
    if not args.keep_runs:
        shutil.rmtree(work / "assets", ignore_errors=True)
        shutil.rmtree(work / "runs", ignore_errors=True)
    return result


def only(tasks: list[Task], wanted: set[str]) -> list[Task]:
    """The ``wanted`` parts, the parts they need (transitively) and the versions, in their order."""
    by_name = {t.name: t for t in tasks}
    if unknown := sorted(wanted - by_name.keys()):
        raise SystemExit(f"gpu_check: no part {', '.join(unknown)}; parts: {', '.join(by_name)}")
    keep, todo = {"versions"}, list(wanted)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo += by_name[name].after
    return [t for t in tasks if t.name in keep]


def _versions_first(ctx: Context, task: Task) -> dict[str, Any]:
    began = time.monotonic()
    try:
        task.run(figures.slot(task.estimate, ctx.remaining()))
        return _record(task, "ran", time.monotonic() - began, "")
    except Exception as e:
        return _record(task, "failed", time.monotonic() - began, str(e))


def _missing_row(program: str, variant: str, budget: list[dict[str, Any]]) -> dict[str, Any]:
    part = next((b for b in budget if b["part"] == (program if variant == "base" else f"{program}:{variant}")), {})
    status = "skipped" if part.get("status") == "skipped" else "failed"
    keys = dict.fromkeys(figures.PROGRAM_KEYS)
    return keys | {"program": program, "variant": variant, "title": progs.PROGRAMS[program].title, "status": status,
                   "shape": "-", "error": part.get("reason") or "no row", "log": None}  # fmt: skip


def _pairs(text: str) -> list[tuple[str, str]]:
    if text in ("", "none"):
        return []
    return [(a, b) for a, _, b in (x.partition(":") for x in text.split(","))]


def print_plan(ctx: Context, tasks: list[Task], jobs: int) -> None:
    plan = figures.plan_budget([(t.name, t.estimate) for t in tasks], ctx.remaining(), jobs=jobs)
    print(f"gpu_check: plan ({ctx.mode}, {ctx.nproc} process(es) a run, {jobs} part(s) at a time, "
          f"{ctx.remaining():.0f} s left):", flush=True)  # fmt: skip
    for name, est, end, fits in plan:
        print(f"  {name:<32} ~{est:>4.0f} s  ends ~{end:>4.0f} s  {'' if fits else 'expected NOT to fit'}", flush=True)


# ----------------------------------------------------------------------------------------------------- main


def write_readme(result: dict[str, Any], readme: Path = README) -> None:
    """Put a GPU run's tables between the README's gpu-check markers (a CPU-mode result is refused)."""
    if result.get("mode") != "gpu":
        raise SystemExit("gpu_check: only a GPU run's figures go to the README")
    text = readme.read_text()
    if TABLE_BEGIN not in text:
        raise SystemExit(f"{readme}: no {TABLE_BEGIN} marker")
    table = figures.markdown(result)
    between = re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END)
    text = re.sub(between, lambda _: f"{TABLE_BEGIN}\n{table}\n{TABLE_END}", text, flags=re.S)
    readme.write_text(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="tiny shapes on CPU (automatic when no CUDA device)")
    p.add_argument("--deadline", type=float, default=480.0, help="seconds for the whole check (default 8 min)")
    p.add_argument("--out", help="results JSON (default benchmarks/results/gpu_check_<gpu>_<time>.json; CPU: out/)")
    p.add_argument("--copy-to", help="also copy the JSON, its Markdown and the logs (tar.gz) here (e.g. $OUT)")
    p.add_argument("--work", help="folder for runs, inputs and logs (default out/gpu_check/work-<mode>-<pid>)")
    p.add_argument("--jobs", type=int, default=0, help="parts at a time (default: 1 on GPU, 2 in CPU mode)")
    p.add_argument("--nproc", type=int, default=0, help="processes (GPUs) a run (default: every GPU, 1 on CPU)")
    p.add_argument("--only", help="comma-separated parts to run (names as in the plan; versions always runs)")
    p.add_argument("--variants", help="PROGRAM:VARIANT,... A/B runs (default per mode; 'none' for none)")
    p.add_argument("--peak-tflops", type=float, help="the device's bf16 peak when the table has none (CPU: 1.0)")
    p.add_argument("--planner-gpu", help="the planner's GPU kind (default: the device's, from cookbook.gpus)")
    p.add_argument("--keep-runs", action="store_true", help="keep checkpoints and inputs (default: removed)")
    p.add_argument("--command", help="the command to record (make gpu-check passes its own)")
    p.add_argument("--table", metavar="RESULTS_JSON", help="print the Markdown of a results file and exit")
    p.add_argument("--write-readme", action="store_true", help="with --table: put it in benchmarks/README.md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.table:
        result = json.loads(Path(args.table).read_text())
        if problems := figures.validate(result):
            print("\n".join(problems), file=sys.stderr)
            return 1
        print(figures.markdown(result))
        if args.write_readme:
            write_readme(result)
        return 0
    if not args.cpu and not _has_cuda():
        print("gpu_check: no CUDA device: CPU mode (tiny shapes)", flush=True)
        args.cpu = True
    result = run_check(args)
    problems = figures.validate(result)
    for problem in problems:
        print(f"gpu_check: schema: {problem}", file=sys.stderr)
    failed = [r for r in result["programs"] if r["status"] != "ok"]
    return 1 if problems or failed else 0


def _has_cuda() -> bool:
    """Whether a CUDA device is visible, asked of nvidia-smi (this process imports no torch)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return smi.returncode == 0 and "GPU" in smi.stdout


if __name__ == "__main__":
    sys.exit(main())
