"""The GPU check's parts (#31): each part's processes, what is read from them, the stop-save and its resume.

Every part runs its program in a process tree of its own (:func:`run_proc`: a session, so USR1 and a kill reach it
all; a time limit; its output to a log and back line by line with the time each line arrived) and records what it
measured in the :class:`Context`; a part that fails raises, with the process's own error lines.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gpu_check_figures as figures
import gpu_check_programs as progs

ROOT = progs.ROOT


# ------------------------------------------------------------------------------------------------ processes


@dataclass
class Proc:
    """One finished process tree: exit status, its output lines with their arrival (s after start), its log."""

    returncode: int | None
    seconds: float
    lines: list[tuple[float, str]]
    log: Path
    timed_out: bool = False

    def text(self) -> list[str]:
        return [line for _, line in self.lines]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_proc(argv: list[str], env: dict[str, str], log: Path, timeout: float,
             on_line: Callable[[str, subprocess.Popen[str]], None] | None = None) -> Proc:  # fmt: skip
    """Run ``argv`` in a session of its own (USR1 and a kill reach the whole tree), its output to ``log`` and back
    line by line; killed at ``timeout``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                             env={**os.environ, **env}, cwd=ROOT, start_new_session=True)  # fmt: skip
        feed: queue.Queue[str | None] = queue.Queue()
        assert p.stdout is not None
        threading.Thread(target=_pump, args=(p.stdout, feed), daemon=True).start()
        timed_out = False
        while True:
            left = timeout - (time.monotonic() - start)
            try:
                line = feed.get(timeout=max(left, 0.01))
            except queue.Empty:
                timed_out = True
                _kill(p)
                break
            if line is None:
                break
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            out.write(line)
            if on_line is not None:
                on_line(line, p)
        code = p.wait()
        _kill(p)  # anything the tree left behind
        if timed_out:
            out.write(f"\ngpu_check: killed after {timeout:.0f} s\n")
    return Proc(code, time.monotonic() - start, lines, log, timed_out)


def _pump(stream: Any, feed: queue.Queue[str | None]) -> None:
    """Every line of ``stream`` into ``feed``, then None (text mode: tqdm's carriage returns end lines too)."""
    for line in stream:
        feed.put(line)
    feed.put(None)


def _kill(p: subprocess.Popen[str]) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def failure(proc: Proc) -> str:
    """Why a process failed, in a line or a few: the last error-looking lines, else its last lines."""
    if proc.timed_out:
        return f"timed out after {proc.seconds:.0f} s (log {proc.log.name})"
    text = proc.text()
    errors = [x for x in text if re.search(r"Error|Exception|error:|Traceback|CUDA out of memory", x)]
    tail = (errors[-3:] or text[-5:]) if text else ["no output"]
    return f"exit {proc.returncode}: " + " | ".join(x.strip() for x in tail)[:600]


# -------------------------------------------------------------------------------------------------- context


@dataclass
class Context:
    mode: str
    nproc: int
    paths: progs.Paths
    work: Path
    deadline: float  # time.monotonic() value
    gpu_key: str = "h100"
    peak: float | None = None
    flux_counts: dict[str, int] = field(default_factory=dict)
    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    stop_saves: list[dict[str, Any]] = field(default_factory=list)
    found: dict[str, Any] = field(default_factory=dict)  # versions, device, matmul
    keep_runs: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def start(
        self,
        launch: progs.Launch,
        log: Path,
        timeout: float,
        on_line: Callable[[str, subprocess.Popen[str]], None] | None = None,
        extra: list[str] | None = None,
    ) -> Proc:
        env = launch.env | progs.rank_env(self.nproc, free_port())
        return run_proc(progs.wrapper_command(self.nproc) + launch.args + (extra or []), env, log, timeout, on_line)

    def plain(self, name: str, args: list[str], timeout: float, script: Path = progs.RUN) -> Proc:
        env = progs.base_env(self.mode, self.work / "runs" / name, self.paths.tiny)
        return run_proc([sys.executable, str(script), *args], env, self.work / "logs" / f"{name}.log", timeout)


# -------------------------------------------------------------------------------------------------- parts


def part_versions(ctx: Context, slot: figures.Slot) -> None:
    proc = ctx.plain("versions", ["versions"], slot.timeout_s)
    found = progs.check_values(proc.text()).get("versions")
    if not found:
        raise RuntimeError(failure(proc))
    ctx.found.update(found)
    print(f"gpu_check: versions {json.dumps(found)}", flush=True)


def part_matmul(ctx: Context, slot: figures.Slot) -> None:
    seconds = "1.0" if ctx.mode == "gpu" else "0.2"
    proc = ctx.plain("matmul", ["matmul", "5", seconds], slot.timeout_s)
    m = progs.check_values(proc.text()).get("matmul")
    if not m:
        raise RuntimeError(failure(proc))
    values = m["tflops"]
    median = sorted(values)[len(values) // 2]
    m |= {"median": median, "spread": figures.spread(values), "peak": ctx.peak,
          "fraction_of_peak": median / ctx.peak if ctx.peak else None}  # fmt: skip
    ctx.found["matmul"] = m


def part_telemetry(ctx: Context, slot: figures.Slot) -> None:
    """The runtime's telemetry sampler against this machine's NVML (#32): what one sample reads on each GPU, what
    the gate's GPU health says, and the CPU a sample costs with a driver's NVML (the bench measures only ours)."""
    from cookbook_runtime import telemetry  # noqa: PLC0415  (slurm-recipes/ is on sys.path)

    nvml, why = telemetry.open_nvml()
    if nvml is None:
        ctx.found["telemetry"] = {"nvml": why}
        return
    rows, began = nvml.rows(time.time()), time.process_time()
    for _ in range(20):
        nvml.rows(time.time())
    cost = (time.process_time() - began) / 20
    ctx.found["telemetry"] = {"nvml": "ok", "gpus": len(rows), "cpu_ms_per_sample": round(cost * 1e3, 3),
                              "faults": telemetry.gpu_faults(nvml), "sample": rows}  # fmt: skip


def importable(ctx: Context, framework: str) -> None:
    """On a GPU, a framework the versions probe could not import fails its parts at once, with the probe's error
    (the program would fail the same way, a start-up later)."""
    found = (ctx.found.get("imports") or {}).get(framework)
    if ctx.mode == "gpu" and found not in (None, "ok"):
        raise RuntimeError(f"{framework} does not import here (versions): {found}")


def _tune_programs() -> list[progs.Program]:
    return [p for p in progs.PROGRAMS.values() if p.assets == "tune"]


def part_assets_tune(ctx: Context, slot: figures.Slot) -> None:
    importable(ctx, "torchtune")
    tune = _tune_programs()
    dims = {json.dumps(asdict(progs.llama_dims(p, ctx.mode)), sort_keys=True) for p in tune}
    if len(dims) != 1:
        raise RuntimeError(f"the torchtune programs want different model sizes: {sorted(dims)}")
    seqs = sorted({progs.settings(p, ctx.mode).seq_len for p in tune})
    batch = max(progs.settings(p, ctx.mode).micro_batch for p in tune)
    records = max(64, 2 * batch * progs.STEPS[ctx.mode].total)
    args = ["tune", str(ctx.paths.assets / "tune"), dims.pop(), ",".join(map(str, seqs)), str(records)]
    proc = ctx.plain("assets-tune", args, slot.timeout_s, progs.BENCH / "gpu_check_assets.py")
    if proc.returncode != 0 or "assets" not in progs.check_values(proc.text()):
        raise RuntimeError(failure(proc))


def part_assets_flux(ctx: Context, slot: figures.Slot) -> None:
    importable(ctx, "torchtitan")
    s = progs.settings(progs.PROGRAMS["flux"], ctx.mode)
    if ctx.mode == "gpu":  # FLUX.1's text widths (T5-XXL 4096, CLIP-L 768), one layer each; the recipe's images
        dims = {"image_size": s.image_size, "t5_dim": 4096, "clip_dim": 768, "max_t5_len": s.text_tokens,
                "n_images": 128, "n_shards": 2}  # fmt: skip
        config = "flux"
    else:
        dims, config = {}, "flux_tiny"
    args = ["flux", str(ctx.paths.assets / "flux"), config, json.dumps(dims)]
    proc = ctx.plain("assets-flux", args, slot.timeout_s, progs.BENCH / "gpu_check_assets.py")
    found = progs.check_values(proc.text()).get("assets")
    if proc.returncode != 0 or not found:
        raise RuntimeError(failure(proc))
    ctx.flux_counts = {k: int(v) for k, v in found.items() if k.endswith("_params")}


def measure(ctx: Context, program: progs.Program, variant: progs.Variant | None, proc: Proc, steps: progs.Steps,
            log_files: list[Path]) -> dict[str, Any]:  # fmt: skip
    """One row: the rate after warm-up, peak memory, MFU, the planner beside it, the published anchor."""
    name = variant.name if variant else "base"
    s = progs.settings(program, ctx.mode, variant)
    lines = proc.text() + [x for f in log_files for x in f.read_text(errors="replace").splitlines()]
    rows = progs.step_rows(lines)
    values = progs.check_values(proc.text())
    titan = values.get("titan", {})
    per_unit = float(titan.get("seq_len") or 1) if program.name == "flux" else 1.0  # torchtitan FLUX: seq_len/image
    rates = {k: r["tokens_per_second_per_gpu"] / per_unit for k, r in rows.items() if "tokens_per_second_per_gpu" in r}
    rate = figures.steady_rate(rates, steps.warmup)
    units = s.micro_batch * (1 if program.name == "flux" else s.seq_len)  # per GPU and step
    wall = figures.wall_rate(step_times(proc), steps.warmup, units)
    memories = [r["memory_gib"] for r in rows.values() if "memory_gib" in r]
    memories += [values["peak_memory"]["reserved_gib"]] if "peak_memory" in values else []
    shape = progs.planner_shape(program, ctx.mode, ctx.flux_counts)
    planned = figures.planner_estimate(shape, s, ctx.gpu_key, ctx.nproc)
    peak_gib = max(memories) if memories else None
    ok = proc.returncode == 0 and rate is not None
    blocks = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in program.blocks.items())
    row = {
        "program": program.name,
        "variant": name,
        "title": program.title,
        "status": "ok" if ok else "failed",
        "shape": (f"{blocks} of {program.full_depth}" if ctx.mode == "gpu" else "tiny (CPU mode)"),
        "settings": {k: getattr(s, k) for k in ("seq_len", "micro_batch", "checkpointing", "compile", "lora_rank")}
        | ({"image_size": s.image_size, "text_tokens": s.text_tokens} if program.name == "flux" else {}),
        "steps": len(rows),
        "rate": rate,
        "wall_rate": wall,
        "unit": planned["unit"],
        "mfu": figures.mfu(rate, planned["flops_per_unit"], ctx.peak),
        "peak_gib": peak_gib,
        "planner": planned,
        "compare": figures.compare(rate, peak_gib, planned),
        "anchor": figures.anchor(program.name, name),
        "error": None if ok else failure(proc) if proc.returncode != 0 else "no step rate in the logs",
        "log": proc.log.name,
        "seconds": round(proc.seconds, 1),
        "note": program.note,
        "reported": {k: v for k, v in values.items() if k in ("titan", "shape", "peak_memory")},
    }
    text = "\n".join(proc.text())
    saves = [float(x) for x in progs.TUNE_SAVE.findall(text)]
    sizes = [float(x) for x in progs.TUNE_SIZE.findall(text)]
    if saves:  # torchtune's own epoch-end save: rank 0 writes alone (the lead time's assumption)
        row["final_save"] = {"seconds": saves[-1], "gib": sizes[-1] if sizes else None}
    return row


def _log_files(run_dir: Path, launch: progs.Launch, before: set[Path]) -> list[Path]:
    return [f for g in launch.log_globs for f in sorted(run_dir.glob(g)) if f not in before]


def part_program(ctx: Context, program: progs.Program, variant: progs.Variant | None, slot: figures.Slot) -> None:
    """One program's run, measured; a failure is a row. The stop-save programs' base run ends in the stop-save at
    step ``stop_at`` and keeps its folder for their resume part (:func:`part_resume`)."""
    if program.framework in ("torchtitan", "torchtune"):
        importable(ctx, program.framework)
    key = (program.name, variant.name if variant else "base")
    tag = f"{program.name}-{key[1]}"
    run_dir = ctx.work / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    stop = variant is None and program.name in progs.STOP_SAVE_PROGRAMS
    steps = (progs.STEPS if variant is None else progs.VARIANT_STEPS)[ctx.mode]
    launch = progs.launch(program, ctx.mode, ctx.paths, run_dir, steps.total, variant, checkpoint=stop)
    try:
        if stop:
            proc, save = stop_run(ctx, program, launch, steps, slot)
            with ctx.lock:
                ctx.stop_saves.append(save)
        else:
            proc = ctx.start(launch, ctx.work / "logs" / f"{tag}.log", slot.timeout_s)
        files = _log_files(run_dir, launch, set())
        row = measure(ctx, program, variant, proc, steps, files)
        for f in files:  # torchtune's DiskLogger files: beside the logs (the run folder goes)
            shutil.copy(f, ctx.work / "logs" / f"{tag}.{f.name}")
    finally:
        if not (ctx.keep_runs or stop):
            shutil.rmtree(run_dir, ignore_errors=True)
    with ctx.lock:
        ctx.rows[key] = row
    if row["status"] != "ok":
        raise RuntimeError(row["error"])


def stop_run(ctx: Context, program: progs.Program, launch: progs.Launch, steps: progs.Steps,
             slot: figures.Slot) -> tuple[Proc, dict[str, Any]]:  # fmt: skip
    """Run to step ``stop_at`` and send USR1 to the process group there (the ranks hold at that step's boundary until
    it arrives: gpu_check_run.py); the stop-save's seconds (stop agreed -> saved line) and bytes."""
    from cookbook_runtime import files as rt_files

    sent: list[float] = []
    start = time.monotonic()

    def on_line(line: str, p: subprocess.Popen[str]) -> None:
        if "gpu_check: holding at step" in line and not sent:
            os.killpg(p.pid, signal.SIGUSR1)
            sent.append(time.monotonic() - start)

    held = progs.Launch(launch.args, launch.env | {"GPU_CHECK_HOLD_AT": str(steps.stop_at)}, launch.run_dir,
                        launch.log_globs, launch.framework)  # fmt: skip
    proc = ctx.start(held, ctx.work / "logs" / f"{program.name}-base.log", slot.timeout_s, on_line)
    save: dict[str, Any] = {"program": program.name, "stop_at": steps.stop_at, "signal_s": sent[0] if sent else None,
                            "status": "saved", "error": None, "first_step_s": _first_step_s(proc)}  # fmt: skip
    saved = next(((t, m) for t, x in proc.lines if (m := rt_files.SAVED.search(x))), None)
    if saved is None:
        return proc, save | {"status": "failed", "error": f"no stop-save line ({failure(proc)})"}
    t_saved, m = saved
    t_asked = next((t for t, x in proc.lines if "stop requested" in x), sent[0] if sent else t_saved)
    path = Path(m[2])
    written = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else None
    save_s = t_saved - t_asked
    titan_save = [float(x) for x in progs.TITAN_SAVE.findall("\n".join(proc.text()))]
    return proc, save | {
        "saved_step": int(m[1]),
        "path": str(path),
        "save_s": save_s,
        "bytes": written,
        "gb_per_s": written / 1e9 / save_s if written and save_s > 0 else None,
        "framework_save_s": titan_save[-1] if titan_save else None,
    }


def part_resume(ctx: Context, program: progs.Program, slot: figures.Slot) -> None:
    """Resume the stop-saved run as the job runtime would (``cookbook_runtime.resume``'s arguments) and count the steps
    trained again; the run folder goes afterwards."""
    from cookbook_runtime import resume

    save = next((s for s in ctx.stop_saves if s["program"] == program.name), None)
    if save is None or save["status"] != "saved":
        raise RuntimeError(f"no stop-save of {program.name} to resume")
    run_dir = ctx.work / "runs" / f"{program.name}-base"
    steps = progs.STEPS[ctx.mode]
    launch = progs.launch(program, ctx.mode, ctx.paths, run_dir, steps.total, checkpoint=True)
    try:
        lora = bool(progs.settings(program, ctx.mode).lora_rank)
        extra, said = resume.resume(launch.framework, run_dir, adapter=lora)
        before = set(_log_files(run_dir, launch, set()))
        proc = ctx.start(launch, ctx.work / "logs" / f"{program.name}-resume.log", slot.timeout_s, extra=extra)
        later = _log_files(run_dir, launch, before)
        lines = proc.text() + [x for f in later for x in f.read_text(errors="replace").splitlines()]
        for f in later:
            shutil.copy(f, ctx.work / "logs" / f"{program.name}-resume.{f.name}")
    finally:
        if not ctx.keep_runs:
            shutil.rmtree(run_dir, ignore_errors=True)
    resumed = min(progs.step_rows(lines), default=None)
    load = [float(x) for x in progs.TITAN_LOAD.findall("\n".join(proc.text()))]
    ok = proc.returncode == 0 and resumed is not None
    with ctx.lock:
        save |= {
            "resume_args": extra,
            "resume_said": said,
            "resumed_at": resumed,
            "steps_redone": None if resumed is None else save["saved_step"] - (resumed - 1),
            "resume_first_step_s": _first_step_s(proc),
            "load_s": load[-1] if load else None,
            "status": "ok" if ok else "failed",
            "error": None if ok else f"resume: {failure(proc)}",
            "resume_log": proc.log.name,
        }
    if not ok:
        raise RuntimeError(save["error"])


def step_times(proc: Proc) -> dict[int, float]:
    """When each step's first line arrived (seconds after the start)."""
    times: dict[int, float] = {}
    for t, line in proc.lines:
        for step in progs.step_rows([line]):
            times.setdefault(step, t)
    return times


def _first_step_s(proc: Proc) -> float | None:
    """Seconds from the start to the first line of a training step (torchtune: its progress bar)."""
    for t, line in proc.lines:
        if progs.step_rows([line]):
            return round(t, 1)
    return None
