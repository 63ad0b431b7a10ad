"""CPU compatibility for torchtune's distributed recipes and torchtitan: the ONLY place with CPU shims.

Used only by ``local-cpu`` jobs (the local Slurm cluster has no GPU). Entry points::

    python -m cookbook.local.compat.cpu torchtune RECIPE [--config FILE key=value ...]
    python -m cookbook.local.compat.cpu torchtune MODULE RECIPE [--config FILE key=value ...]  (cookbook_tune)
    python -m cookbook.local.compat.cpu torchtitan [torchtitan.train args: --module M --config F --a.b v ...]

both also under ``torchrun ... -m cookbook.local.compat.cpu ...``. Each applies its framework's shims, then runs
the framework's own, unmodified training entry point as ``__main__`` (torchtune's built-in recipe file;
``torchtitan.train``). Every shim is a :class:`Shim` below saying what breaks on CPU, where upstream, and
what the shim does; ``cookbook/local/compat/README.md`` lists them and the commands proven with them.

The shims were checked against :data:`VERIFIED_VERSIONS` only; on other versions the entry point stops with
a clear message (set ``COOKBOOK_COMPAT_ANY_VERSION=1`` to try anyway).
"""

from __future__ import annotations

import logging
import os
import resource
import runpy
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from cookbook import versions

FRAMEWORKS = ("torchtune", "torchtitan")
# torchtitan's FLUX sampling (the ``flux_schnell_use`` recipe): ``... cpu torchtitan-flux-infer [torchtitan args]``
FLUX_INFER_WORD, FLUX_INFER = "torchtitan-flux-infer", "torchtitan.models.flux.inference.infer"
VERIFIED_VERSIONS: dict[str, str] = {p: versions.exact_version(p) or "" for p in ("torch", "torchtune", "torchtitan")}
PACKAGES_CHECKED: dict[str, tuple[str, ...]] = {
    "torchtune": ("torch", "torchtune"),
    "torchtitan": ("torch", "torchtitan"),
}
ANY_VERSION_ENV = "COOKBOOK_COMPAT_ANY_VERSION"
ENTRY_MODULE = "cookbook.local.compat.cpu"
# torchtitan arguments this module adds unless the caller gives them (see README: spmd_backend).
TORCHTITAN_DEFAULT_ARGS: dict[str, str] = {"--parallelism.spmd_backend": "partial_dtensor"}


class CompatError(RuntimeError):
    """The CPU shims cannot be applied here (wrong versions, unknown recipe)."""


@dataclass(frozen=True)
class Shim:
    name: str
    breaks: str  # what fails on CPU without it
    upstream: str  # where, upstream
    fix: str  # what the shim does
    apply: Callable[[], None]


# ----------------------------------------------------------------------------------------- versions


def installed_version(package: str) -> str | None:
    """The installed distribution's version without a local tag (``2.13.0+cpu`` -> ``2.13.0``)."""
    try:
        return metadata.version(package).split("+", 1)[0]
    except metadata.PackageNotFoundError:
        return None


def version_problems(framework: str) -> list[str]:
    """One line per package whose installed version differs from the verified one."""
    problems = []
    for package in PACKAGES_CHECKED[framework]:
        have, want = installed_version(package), VERIFIED_VERSIONS[package]
        if have != want:
            problems.append(f"{package} {have or 'not installed'} (shims verified with {want})")
    return problems


def check_versions(framework: str) -> None:
    """Raise :class:`CompatError` unless the installed versions are the verified ones."""
    problems = version_problems(framework)
    if not problems:
        return
    text = (
        f"cookbook.local.compat.cpu: the {framework} CPU shims were verified only with "
        + ", ".join(f"{p}=={v}" for p, v in VERIFIED_VERSIONS.items() if p in PACKAGES_CHECKED[framework])
        + "; found "
        + "; ".join(problems)
        + ". Install the verified versions (requirements/constraints.txt) "
        + f"or set {ANY_VERSION_ENV}=1 to try the shims anyway."
    )
    if os.environ.get(ANY_VERSION_ENV) == "1":
        warnings.warn(text, stacklevel=2)
        return
    raise CompatError(text)


# ------------------------------------------------------------------------------------- shared shims


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class _CpuProperties:
    name = "cpu"
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_memory_stats(device: object = None) -> dict[str, int]:
    peak = _peak_rss_bytes()
    return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}


def _add_cpu_memory_api() -> None:
    import torch

    functions: dict[str, Callable[..., object]] = {
        "empty_cache": lambda: None,
        "reset_peak_memory_stats": lambda device=None: None,
        "memory_stats": _cpu_memory_stats,
        "max_memory_allocated": lambda device=None: _peak_rss_bytes(),
        "max_memory_reserved": lambda device=None: _peak_rss_bytes(),
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: _CpuProperties(),
    }
    for name, fn in functions.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


CPU_MEMORY_API = Shim(
    name="cpu-memory-api",
    breaks="torch.cpu has no empty_cache / reset_peak_memory_stats / memory_stats / get_device_properties: "
    "AttributeError in torchtune's cleanup_before_training and torchtitan's DeviceMemoryMonitor",
    upstream="torchtune/training/memory.py:51 get_torch_device_namespace().empty_cache(); "
    "torchtitan/components/metrics.py DeviceMemoryMonitor (device_module.memory_stats(), ...)",
    fix="adds the missing functions to torch.cpu (only those missing): cache calls are no-ops, memory stats "
    "report the process's peak RSS, device properties report 'cpu' and the machine's RAM",
    apply=_add_cpu_memory_api,
)


# ---------------------------------------------------------------------------------- torchtune shims


def _gloo_when_no_nccl() -> None:
    import torch
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_cookbook_cpu", False):
        return

    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        if (
            isinstance(backend, str)
            and ("nccl" in backend or "," in backend)
            and not (dist.is_nccl_available() and torch.cuda.is_available())
        ):
            backend = "gloo"
        return original(backend, *args, **kwargs)

    init_process_group._cookbook_cpu = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


GLOO_BACKEND = Shim(
    name="gloo-backend",
    breaks='lora_finetune_distributed hard-codes the NCCL backend: RuntimeError "Distributed package '
    "doesn't have NCCL built in\"; fsdp_cpu_offload=True with device=cpu asks for 'cpu:gloo,cpu:gloo': "
    'ValueError "Duplicate device type cpu"',
    upstream='recipes/lora_finetune_distributed.py:918 init_process_group("cuda:nccl,cpu:gloo"); '
    "torchtune/training/_distributed.py get_distributed_backend(offload_ops_to_cpu=True)",
    fix="wraps torch.distributed.init_process_group (before the recipe imports it): a backend string naming "
    "nccl, or a device:backend list, becomes plain 'gloo' when CUDA/NCCL is unusable",
    apply=_gloo_when_no_nccl,
)


def _cpu_memory_stats_in_torchtune() -> None:
    import torchtune.training as training
    import torchtune.training.memory as memory

    original = memory.get_memory_stats
    if getattr(original, "_cookbook_cpu", False):
        return

    def get_memory_stats(device, reset_stats: bool = True) -> dict:  # type: ignore[no-untyped-def]
        if device.type != "cpu":
            return original(device, reset_stats=reset_stats)
        peak_gib = _peak_rss_bytes() / 1024**3
        return {"peak_memory_active": peak_gib, "peak_memory_alloc": peak_gib, "peak_memory_reserved": peak_gib}

    get_memory_stats._cookbook_cpu = True  # type: ignore[attr-defined]
    training.get_memory_stats = memory.get_memory_stats = get_memory_stats


TORCHTUNE_MEMORY_STATS = Shim(
    name="torchtune-memory-stats",
    breaks="full/lora_finetune_distributed log memory stats on rank 0 unconditionally: ValueError "
    '"Logging memory stats is not supported on CPU devices"',
    upstream="torchtune/training/memory.py:262 get_memory_stats (raises for cpu); called from "
    "recipes/full_finetune_distributed.py:628,874 and recipes/lora_finetune_distributed.py:544,855",
    fix="torchtune.training.get_memory_stats returns the process's peak RSS (GiB) for a cpu device",
    apply=_cpu_memory_stats_in_torchtune,
)

TORCHTUNE_SHIMS: tuple[Shim, ...] = (CPU_MEMORY_API, GLOO_BACKEND, TORCHTUNE_MEMORY_STATS)


# --------------------------------------------------------------------------------- torchtitan shims


def _cpu_device_type() -> None:
    import torch._utils

    original = torch._utils._get_available_device_type
    if getattr(original, "_cookbook_cpu", False):
        return
    if "torchtitan.tools.utils" in sys.modules:
        raise CompatError("apply the torchtitan CPU shims before importing torchtitan")

    def available_device_type() -> str:
        return original() or "cpu"

    available_device_type._cookbook_cpu = True  # type: ignore[attr-defined]
    torch._utils._get_available_device_type = available_device_type


CPU_DEVICE_TYPE = Shim(
    name="cpu-device-type",
    breaks="with no accelerator torchtitan falls back to 'cuda' and fails in set_device",
    upstream='torchtitan/tools/utils.py:55 device_type = _get_available_device_type() or "cuda"; '
    "trainer.py:301 device_module.set_device(...)",
    fix="torch._utils._get_available_device_type returns 'cpu' instead of None (before torchtitan is imported), "
    "so torchtitan picks torch.cpu and the 'gloo' process-group backend",
    apply=_cpu_device_type,
)


def _import_without_triton() -> None:
    from cookbook_runtime.titan_import import import_torchtitan_without_triton

    import_torchtitan_without_triton()


TRITON_STANDIN = Shim(
    name="triton-standin",
    breaks="ModuleNotFoundError: No module named 'triton' (undeclared, GPU-only dependency)",
    upstream="torchtitan/distributed/minimal_async_ep/kernels.py:10 import triton (via torchtitan.trainer); "
    "overrides/fused_swiglu.py, overrides/fused_mla.py",
    fix="imports those modules with an inert triton stand-in in sys.modules, then removes it "
    "(slurm-recipes/cookbook_runtime/titan_import.py); the GPU kernels are never called",
    apply=_import_without_triton,
)


def _eager_flex_attention() -> None:
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common import attention

    original = flex._validate_device
    if getattr(original, "_cookbook_cpu", False):
        return

    def validate_device(query, key, value):  # type: ignore[no-untyped-def]
        if query.device.type != "cpu":
            return original(query, key, value)

    validate_device._cookbook_cpu = True  # type: ignore[attr-defined]
    flex._validate_device = validate_device
    attention.FlexAttention._compiled_flex_attn = flex.flex_attention
    # the document mask, built every step: compiled, its first call is ~5 s of dynamo tracing in every rank
    attention._compiled_create_block_mask = flex.create_block_mask


EAGER_FLEX_ATTENTION = Shim(
    name="eager-flex-attention",
    breaks='RuntimeError "FlexAttention does not support backward on CPU"; torch.compile of flex_attention '
    "also needs a GPU toolchain (sdpa is rejected for llama3, varlen needs CUDA flash attention)",
    upstream="torch/nn/attention/flex_attention.py _validate_device; torchtitan/models/common/attention.py:277 "
    "FlexAttention._compiled_flex_attn = torch.compile(flex_attention), :622 _compiled_create_block_mask = "
    "torch.compile(create_block_mask)",
    fix="uses eager flex_attention (unfused: materialises the score matrix, fine for tiny seq_len) and skips "
    "the CPU check for CPU tensors; builds the document mask eagerly too (its compile is ~5 s of dynamo tracing "
    "per rank on CPU, the mask of a tiny seq_len a few ms)",
    apply=_eager_flex_attention,
)


def _sum_reductions_for_gloo() -> None:
    from torch.distributed.fsdp import FSDPModule

    original = FSDPModule.set_gradient_divide_factor
    if getattr(original, "_cookbook_cpu", False):
        return

    def set_gradient_divide_factor(self, factor: float) -> None:  # type: ignore[no-untyped-def]
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    set_gradient_divide_factor._cookbook_cpu = True  # type: ignore[attr-defined]
    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor  # type: ignore[method-assign]  # the shim


GLOO_SUM_REDUCTION = Shim(
    name="gloo-sum-reduction",
    breaks='FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM: ValueError "Cannot use ReduceOp.PREMUL_SUM with Gloo"',
    upstream="torchtitan/distributed/fsdp.py:41 module.set_gradient_divide_factor(1.0)",
    fix="after set_gradient_divide_factor, also set_force_sum_reduction_for_comms(True): plain SUM, same result "
    "for factor 1.0",
    apply=_sum_reductions_for_gloo,
)


def _barrier_without_cpu_device_ids() -> None:
    import torch.distributed as dist

    original = dist.barrier
    if getattr(original, "_cookbook_cpu", False):
        return

    def barrier(*args, device_ids=None, **kwargs):  # type: ignore[no-untyped-def]
        if device_ids is not None and not all(isinstance(d, int) for d in device_ids):
            device_ids = None
        return original(*args, device_ids=device_ids, **kwargs)

    barrier._cookbook_cpu = True  # type: ignore[attr-defined]
    dist.barrier = barrier


BARRIER_DEVICE_IDS = Shim(
    name="barrier-device-ids",
    breaks="torch.cpu.current_device() is the string 'cpu': TypeError \"incompatible function arguments\" in "
    "BarrierOptions",
    upstream="torchtitan/distributed/utils.py:586 "
    "torch.distributed.barrier(device_ids=[device_module.current_device()])",
    fix="torch.distributed.barrier drops device_ids that are not ints",
    apply=_barrier_without_cpu_device_ids,
)


def _set_timeout_on_torch_2_13() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = _set_pg_timeout  # type: ignore[attr-defined]


SET_TIMEOUT = Shim(
    name="set-timeout",
    breaks="AttributeError: torch.distributed has no set_timeout (added in torch 2.14; 2.13 has _set_pg_timeout)",
    upstream="torchtitan/distributed/utils.py:595 torch.distributed.set_timeout(timeout, group)",
    fix="torch.distributed.set_timeout = torch.distributed.distributed_c10d._set_pg_timeout when missing",
    apply=_set_timeout_on_torch_2_13,
)


def _plain_cpu_local_device() -> None:
    import torch
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.tools.utils as tool_utils

    def get_local_device() -> torch.device:
        return torch.device("cpu")

    tool_utils.get_local_device = get_local_device
    dist_utils.get_local_device = get_local_device


PLAIN_CPU_DEVICE = Shim(
    name="plain-cpu-device",
    breaks="get_local_device() returns torch.device('cpu', 0); safetensors rejects it: SafetensorError "
    '"device cpu:0 is invalid" (FLUX autoencoder load)',
    upstream="torchtitan/tools/utils.py:63 get_local_device; models/flux/model/autoencoder.py:463 "
    "load_sft(ckpt_path, device=str(device))",
    fix="get_local_device returns torch.device('cpu') (in tools.utils and distributed.utils)",
    apply=_plain_cpu_local_device,
)

TORCHTITAN_SHIMS: tuple[Shim, ...] = (
    CPU_DEVICE_TYPE,
    CPU_MEMORY_API,
    TRITON_STANDIN,
    EAGER_FLEX_ATTENTION,
    GLOO_SUM_REDUCTION,
    BARRIER_DEVICE_IDS,
    SET_TIMEOUT,
    PLAIN_CPU_DEVICE,
)

SHIMS: dict[str, tuple[Shim, ...]] = {"torchtune": TORCHTUNE_SHIMS, "torchtitan": TORCHTITAN_SHIMS}


def apply_shims(framework: str, check: bool = True) -> None:
    """Check versions (unless ``check`` is False) and apply ``framework``'s shims, in order. Idempotent."""
    if framework not in SHIMS:
        raise CompatError(f"unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")
    if check:
        check_versions(framework)
    for shim in SHIMS[framework]:
        shim.apply()


# ------------------------------------------------------------------------------------------ running


def torchtune_recipe_names() -> list[str]:
    from torchtune._recipe_registry import get_all_recipes

    return sorted(r.name for r in get_all_recipes())


def torchtune_recipe_path(name: str) -> Path:
    """The built-in recipe file for ``name`` (what ``tune run NAME`` executes)."""
    import torchtune
    from torchtune._recipe_registry import get_all_recipes

    for recipe in get_all_recipes():
        if recipe.name == name:
            return Path(torchtune.__file__).parent.parent / "recipes" / recipe.file_path
    raise CompatError(f"unknown torchtune recipe {name!r}; built-in recipes: {', '.join(torchtune_recipe_names())}")


def with_torchtitan_defaults(args: Sequence[str]) -> list[str]:
    """``args`` plus :data:`TORCHTITAN_DEFAULT_ARGS` the caller did not give (either ``--k v`` or ``--k=v``)."""
    out = list(args)
    for flag, value in TORCHTITAN_DEFAULT_ARGS.items():
        if not any(a == flag or a.startswith(flag + "=") for a in args):
            out += [flag, value]
    return out


def run_torchtune(recipe: str, args: Sequence[str]) -> int:
    """Apply the torchtune shims and run ``recipe`` as ``__main__`` with ``args``: a built-in recipe's file, or
    (as ``tune run`` does for a name it does not know) a module on the path, e.g.
    ``cookbook_runtime.programs.cookbook_tune``, the cookbook's recipe subclass in the job runtime. Returns the
    module's exit code."""
    apply_shims("torchtune")
    if recipe in torchtune_recipe_names():
        path = torchtune_recipe_path(recipe)
        sys.argv = [str(path), *args]
        runpy.run_path(str(path), run_name="__main__")
        return 0
    import importlib.util

    try:
        found = importlib.util.find_spec(recipe) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        torchtune_recipe_path(recipe)  # raises: unknown recipe, with the built-in names
    sys.argv = [recipe, *args]
    try:
        runpy.run_module(recipe, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # leave through exit_now (see its docstring), not the interpreter's teardown
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_torchtitan(args: Sequence[str], module: str = "torchtitan.train") -> None:
    """Apply the torchtitan shims and run ``module`` (``torchtitan.train``, or FLUX's sampling
    :data:`FLUX_INFER`) as ``__main__`` with ``args``."""
    apply_shims("torchtitan")
    sys.argv = [module, *with_torchtitan_defaults(args)]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def cpu_launch_args(framework: str, recipe: str | None = None) -> list[str]:
    """Arguments after ``python`` / ``torchrun [opts]`` that start ``framework`` under the CPU shims.

    ``cpu_launch_args("torchtune", "lora_finetune_distributed")`` ->
    ``["-m", "cookbook.local.compat.cpu", "torchtune", "lora_finetune_distributed"]``; append ``--config F k=v``.
    ``cpu_launch_args("torchtitan")`` -> ``["-m", "cookbook.local.compat.cpu", "torchtitan"]``; append
    ``--module M --config F ...``.
    """
    if framework == "torchtune":
        if not recipe:
            raise CompatError("torchtune needs a recipe name, e.g. full_finetune_distributed")
        return ["-m", ENTRY_MODULE, "torchtune", recipe]
    if framework == "torchtitan":
        if recipe:
            raise CompatError("torchtitan takes no recipe name: pass --module/--config after the launch args")
        return ["-m", ENTRY_MODULE, "torchtitan"]
    raise CompatError(f"unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")


USAGE = """usage: python -m cookbook.local.compat.cpu torchtune RECIPE [--config FILE key=value ...]
       python -m cookbook.local.compat.cpu torchtitan [--module M --config F --section.key value ...]
       python -m cookbook.local.compat.cpu torchtitan-flux-infer [the same torchtitan arguments]"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    framework, rest = argv[0], argv[1:]
    try:
        if framework == "torchtune":
            if not rest or rest[0].startswith("-"):
                raise CompatError("torchtune needs a recipe name first, e.g. full_finetune_distributed")
            return run_torchtune(rest[0], rest[1:])
        elif framework == "torchtitan":
            run_torchtitan(rest)
        elif framework == FLUX_INFER_WORD:
            run_torchtitan(rest, FLUX_INFER)
        else:
            raise CompatError(f"unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")
    except CompatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's C++ teardown. After a finished run (checkpoints written, process
    group destroyed) torch 2.13 on CPU/gloo now and then aborts in static destructors ("terminate called
    without an active exception", SIGABRT), and torchrun reports the run FAILED. Logs are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
