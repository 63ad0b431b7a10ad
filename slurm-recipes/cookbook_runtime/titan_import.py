"""Import torchtitan 0.3.0 where triton is not installed (a login node's CPU or aarch64 torch).

torchtitan imports ``triton`` at module level only to *define* GPU kernels
(``torchtitan/distributed/minimal_async_ep/kernels.py:10 import triton``, on the import path of
``torchtitan.trainer``; also ``overrides/fused_swiglu.py`` and ``overrides/fused_mla.py``). triton is an
undeclared, GPU-only dependency (a 691 MB wheel), so a login node whose torch has none cannot import
torchtitan, nor check a job's overrides with torchtitan's own parser: ``No module named 'triton'``.

:func:`import_torchtitan_without_triton` lets torch import its compiler stack first (so torch caches "no
triton"), then puts an inert ``triton`` / ``triton.language`` in ``sys.modules`` only while those torchtitan
modules are imported, and removes it afterwards (one left there would break torch, which then tries
``triton.backends.compiler``). The kernels are never called. Where triton is installed nothing is patched.
Part of the runtime (standard library at import; torch only inside the call) because a node uses it: the
rehearsal's parse in the training interpreter (:mod:`cookbook_runtime.rehearsal`) and the local CPU bench's
jobs; the engine's parser child (:mod:`cookbook.recipes.titan_parse`) imports it from here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

# torch modules that probe for triton at import time: import them while triton is really absent.
_TORCH_MODULES_FIRST = (
    "torch._dynamo",
    "torch._inductor.utils",
    "torch._inductor.runtime.triton_compat",
    "torch._inductor.codecache",
    "torch._inductor.compile_fx",
    "torch._functorch.aot_autograd",
    "torch._dynamo.backends.debugging",
    "torch._dynamo.repro.after_dynamo",
    "torch._higher_order_ops.flex_attention",
    "torch.nn.attention.flex_attention",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
)
# torchtitan modules that `import triton` (directly or through their imports).
TORCHTITAN_TRITON_IMPORTERS = (
    "torchtitan.trainer",
    "torchtitan.distributed.minimal_async_ep.kernels",
    "torchtitan.overrides.fused_swiglu",
    "torchtitan.overrides.fused_mla",
)


class _Inert:
    """Any attribute, call or decorator use returns something harmless."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a bare decorator
        return _Inert()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


def _module_getattr(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert()


def _make_standin() -> tuple[types.ModuleType, types.ModuleType]:
    triton = types.ModuleType("triton")
    triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)  # type: ignore[attr-defined]
    triton.autotune = triton.heuristics = lambda *a, **kw: lambda f: f  # type: ignore[attr-defined]
    triton.Config = _Inert  # type: ignore[attr-defined]
    triton.__getattr__ = _module_getattr  # type: ignore[attr-defined,method-assign]  # a stand-in module
    language = types.ModuleType("triton.language")
    language.constexpr = _Inert()  # type: ignore[attr-defined]
    language.__getattr__ = _module_getattr  # type: ignore[attr-defined,method-assign]  # a stand-in module
    triton.language = language  # type: ignore[attr-defined]
    return triton, language


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def import_torchtitan_without_triton() -> bool:
    """Import torchtitan's triton-importing modules with the stand-in; True where it was needed (no triton
    installed), False where triton is installed (nothing is patched then)."""
    if triton_available():
        return False
    if all(m in sys.modules for m in TORCHTITAN_TRITON_IMPORTERS):
        return True  # done already in this process
    import torch
    import torch.utils._triton as torch_triton

    for name in _TORCH_MODULES_FIRST:
        importlib.import_module(name)
    torch_triton.has_triton_package()  # cache "no triton" before the stand-in appears
    torch.compile(lambda x: x)  # loads the inductor backend entry point now
    triton, language = _make_standin()
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        for name in TORCHTITAN_TRITON_IMPORTERS:
            importlib.import_module(name)
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]
    return True
