"""One process of the GPU check (#31): the A/B switches and the stop-save hold, then a training program itself.

    [python -m cookbook_runtime.launch torchrun ...] python benchmarks/gpu_check_run.py KIND ARGS...

KIND is one of

- ``fsdp PATH ARGS``: the FSDP ``fsdp_train.py`` at PATH, imported as a module so that ``GPU_CHECK_FSDP_SHAPE``
  (``{"model": "llama3_1_8b", "layers": 4}``) can give a shape of its table fewer layers, then its ``main(ARGS)``;
- ``tune RECIPE ARGS``: the runtime's ``cookbook_tune`` (what ``tune run cookbook_runtime.programs.cookbook_tune
  RECIPE ARGS`` runs on a GPU cluster);
- ``titan ARGS``: ``torchtitan.train`` as ``__main__`` (``-m torchtitan.train ARGS``);
- ``cpu FRAMEWORK ARGS``: the local bench's CPU entry point (``python -m cookbook.local.compat.cpu FRAMEWORK ARGS``,
  the only place with CPU shims): CPU mode only;
- ``matmul REPEATS SECONDS``: the pre-flight gate's matmul check (``cookbook_runtime.nodecheck``), REPEATS times;
- ``versions``: the versions of torch, CUDA, the driver and the frameworks, the device, and whether each framework's
  training module imports (on CPU under the local bench's shims, as its runs do).

The environment switches the runtime's per-step stop agreement off (``GPU_CHECK_STOP_CHECK=0``, the A/B of its cost)
or holds the ranks at step N's boundary until the check's USR1 has arrived (``GPU_CHECK_HOLD_AT=N``: the stop-save
then lands exactly at step N, also where steps take milliseconds). At the end the process prints
``gpu_check: peak_memory {...}`` (torch's peak reserved/allocated bytes, or the peak RSS on CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import runpy
import sys
import time
import traceback
from dataclasses import replace
from typing import Any

GIB = 1024**3
HOLD_TIMEOUT_S = 120.0  # the check sends USR1 within milliseconds of the hold line; this only bounds a lost signal
PREFIX = "gpu_check:"


def say(what: str, value: Any) -> None:
    """One ``gpu_check: WHAT {json}`` line, read back by the orchestrator (rank 0 only)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{PREFIX} {what} {json.dumps(value)}", flush=True)


def patch_stop_request() -> None:
    """Wrap ``cookbook_runtime.rank.StopRequest.should_stop`` for ``GPU_CHECK_STOP_CHECK`` / ``GPU_CHECK_HOLD_AT``."""
    off = os.environ.get("GPU_CHECK_STOP_CHECK") == "0"
    hold = int(os.environ.get("GPU_CHECK_HOLD_AT") or 0)
    if not off and not hold:
        return
    from cookbook_runtime import rank

    original = rank.StopRequest.should_stop
    calls = [0]

    def should_stop(self: Any, step: int | None = None) -> bool:
        calls[0] += 1
        if off:
            return False  # no agreement at all: what the runtime's check costs is the difference
        if hold and (step if step is not None else calls[0]) == hold:
            print(f"{PREFIX} holding at step {hold} for USR1", flush=True)
            end = time.monotonic() + HOLD_TIMEOUT_S
            while not self.requested_here() and time.monotonic() < end:
                time.sleep(0.005)
        return bool(original(self, step))

    rank.StopRequest.should_stop = should_stop  # type: ignore[method-assign]


def run_fsdp(path: str, args: list[str]) -> int:
    """``fsdp_train.py`` with the shape of ``GPU_CHECK_FSDP_SHAPE``; ``GPU_CHECK_FSDP_NO_SAVE=1``: no final save."""
    spec = importlib.util.spec_from_file_location("gpu_check_fsdp_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    change = json.loads(os.environ.get("GPU_CHECK_FSDP_SHAPE") or "{}")
    if change:
        name = change.pop("model")
        module.SHAPES[name] = replace(module.SHAPES[name], **change)
        say("shape", {"model": name, **change})
    if os.environ.get("GPU_CHECK_FSDP_NO_SAVE") == "1":

        def no_save(ckpt_dir: Any, state: Any, *rest: Any, **kw: Any) -> Any:
            return ckpt_dir / f"step-{state.step}-not-written"

        setattr(module, "save_checkpoint", no_save)  # noqa: B010  (the module's global, looked up at each save)
    return int(module.main(args) or 0)


def run_tune(args: list[str]) -> int:
    from cookbook_runtime.programs import cookbook_tune  # slurm-recipes/ on PYTHONPATH, as the job's $RUNTIME_DIR

    return int(cookbook_tune.main(args) or 0)


def run_module(module: str, args: list[str]) -> int:
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_cpu(args: list[str]) -> int:
    from cookbook.local.compat import cpu

    return int(cpu.main(args))


def run_matmul(repeats: int, seconds: float) -> int:
    """The gate's own check (``nodecheck.matmul_check``: bf16 8192^3 on a GPU timed >= ``seconds`` after warm-up,
    fp32 256^3 on CPU), ``repeats`` times; prints the TFLOP/s of each and the device's peak from the one table."""
    import torch

    from cookbook_runtime import nodecheck

    gpus = 1 if torch.cuda.is_available() else 0
    ns = argparse.Namespace(gpus=gpus, matmul_seconds=seconds, matmul_fraction=0.0, matmul_min_tflops=0.0)
    values, took = [], []
    for _ in range(repeats):
        measures: dict[str, Any] = {}
        start = time.perf_counter()
        nodecheck.matmul_check(ns, 0, measures)
        took.append(round(time.perf_counter() - start, 3))
        values.append(measures["matmul_tflops"])
    name = torch.cuda.get_device_name(0) if gpus else "cpu"
    timed = seconds if gpus else min(seconds, 0.2)  # the gate times CPUs 0.2 s at most
    say("matmul", {"tflops": values, "device": name, "peak": nodecheck.peak_tflops(name), "timed_s": timed,
                   "seconds_each": took})  # fmt: skip
    return 0


PACKAGES = (
    "torch",
    "torchtune",
    "torchtitan",
    "torchao",
    "transformers",
    "datasets",
    "tyro",
    "omegaconf",
    "safetensors",
    "tokenizers",
    "numpy",
)
IMPORTS = {"torchtune": "torchtune.training", "torchtitan": "torchtitan.trainer", "torchao": "torchao"}


def run_versions() -> int:
    """Versions first: what the check runs on, and which framework does not even import (reported, not hidden)."""
    import platform
    import subprocess
    from importlib import import_module, metadata

    versions: dict[str, Any] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    import torch

    versions["cuda"] = torch.version.cuda
    device: dict[str, Any] = {"count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if device["count"]:
        props = torch.cuda.get_device_properties(0)
        device |= {"name": props.name, "memory_gib": round(props.total_memory / GIB, 1),
                   "capability": f"{props.major}.{props.minor}"}  # fmt: skip
        try:
            smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            device["driver"] = subprocess.run(smi, capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError) as e:
            device["driver"] = f"unknown ({type(e).__name__})"
    imports = {}
    for framework, module in IMPORTS.items():
        try:
            if not device["count"] and framework != "torchao":
                from cookbook.local.compat.cpu import apply_shims

                apply_shims(framework)
            import_module(module)
            imports[framework] = "ok"
        except BaseException as e:  # an import that fails is a finding, whatever it raises
            imports[framework] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    say("versions", {"versions": versions, "device": device, "imports": imports})
    return 0


def peak_memory() -> dict[str, Any]:
    """Peak bytes of this process: torch's caching allocator on a GPU, the peak RSS on CPU (GiB)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "kind": "cuda",
            "reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
            "allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
        }
    return {"kind": "rss", "reserved_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    kind, rest = argv[0], argv[1:]
    patch_stop_request()
    if kind == "fsdp":
        code = run_fsdp(rest[0], rest[1:])
    elif kind == "tune":
        code = run_tune(rest)
    elif kind == "titan":
        code = run_module("torchtitan.train", rest)
    elif kind == "cpu":
        code = run_cpu(rest)
    elif kind == "matmul":
        code = run_matmul(int(rest[0]), float(rest[1]))
    elif kind == "versions":
        code = run_versions()
    else:
        print(f"gpu_check_run: unknown kind {kind!r}", file=sys.stderr)
        return 2
    if kind not in ("matmul", "versions"):
        say("peak_memory", peak_memory())
    return code


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:  # the traceback is the row's error; no teardown that could hang on a live process group
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: process-group destructors can abort after a finished run
