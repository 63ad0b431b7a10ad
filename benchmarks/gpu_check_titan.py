"""torchtitan config functions of the GPU check (#31): the recipes' own configs, fewer blocks, settings from the check.

    torchrun ... -m torchtitan.train --module gpu_check_titan --config llama3 ...   (GPU: cookbook_titan.llama3_8b_c4)
    torchrun ... -m torchtitan.train --module gpu_check_titan --config flux ...     (GPU: cookbook_titan.flux_schnell)
    ... cookbook.local.compat.cpu torchtitan --module gpu_check_titan --config llama3_tiny | flux_tiny   (CPU mode)

torchtitan 0.3.0 configs are Python functions whose model sizes no command-line flag changes, so each function here
calls the recipe's own (the runtime's ``programs/cookbook_titan.py``; CPU: the local bench's tiny configs, which
use the same stop-save trainer) and then applies ``GPU_CHECK_TITAN`` (JSON): ``layers`` (llama3: the first N
blocks), ``double_blocks``/``single_blocks`` (FLUX), ``local_batch_size``, ``seq_len``, ``steps``, ``ac``
(``none``/``selective``/``full``), ``compile`` (and ``compile_backend``), ``checkpoint`` (on/off; interval past the
run: only the stop-save writes), ``flux_dir`` (the check's FLUX encoders, autoencoder and images). Always: metrics
every step, no profiler, no validation (a hub dataset), seed 0. Rank 0 prints ``gpu_check: titan {...}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any


def _settings() -> dict[str, Any]:
    return dict(json.loads(os.environ.get("GPU_CHECK_TITAN") or "{}"))


def _activation_checkpoint(mode: str) -> Any:
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[mode]


def _flux_paths(cfg: Any, folder: str) -> None:
    """Encoders, tokenizers, autoencoder and images from ``folder`` (``gpu_check_assets.py flux`` wrote it)."""
    model = cfg.model_spec.model
    t5, clip = f"{folder}/t5", f"{folder}/clip"
    cfg.hf_assets_path = folder
    cfg.encoder.autoencoder_path = f"{folder}/ae.safetensors"
    cfg.encoder.t5_encoder, cfg.encoder.clip_encoder = t5, clip
    cfg.tokenizer.t5_tokenizer_path, cfg.tokenizer.clip_tokenizer_path = t5, clip
    cfg.dataloader.dataset, cfg.dataloader.dataset_path = "cc12m-test", f"{folder}/cc12m"
    for name, path in (("t5_encoder", t5), ("clip_encoder", clip)):
        if getattr(model, name, None) is not None:
            setattr(model, name, dataclasses.replace(getattr(model, name), version=path))


def _apply(cfg: Any) -> Any:
    s = _settings()
    model = cfg.model_spec.model
    if "layers" in s:
        model = dataclasses.replace(model, layers=list(model.layers[: s["layers"]]))
    if "double_blocks" in s:
        d, n = s["double_blocks"], s["single_blocks"]
        doubles, singles = list(model.double_blocks[:d]), list(model.single_blocks[:n])
        model = dataclasses.replace(model, depth=d, depth_single_blocks=n, double_blocks=doubles, single_blocks=singles)
    cfg.model_spec = dataclasses.replace(cfg.model_spec, model=model)
    for key in ("local_batch_size", "seq_len", "steps"):
        if key in s:
            setattr(cfg.training, key, s[key])
    if "ac" in s:
        cfg.activation_checkpoint = _activation_checkpoint(s["ac"])
    if "compile" in s:
        cfg.compile.enable = bool(s["compile"])
        cfg.compile.backend = s.get("compile_backend", cfg.compile.backend)
    if "flux_dir" in s:
        _flux_paths(cfg, s["flux_dir"])
    cfg.checkpoint.enable = bool(s.get("checkpoint", False))
    cfg.checkpoint.interval = 10**6  # only the stop-save (and torchtitan's last-step save) write
    cfg.metrics.log_freq = 1
    cfg.profiler.enable_profiling = False
    cfg.validator.enable = False
    cfg.debug.seed = 0
    if int(os.environ.get("RANK", "0")) == 0:
        ac = type(cfg.activation_checkpoint).__qualname__.split(".")[0] if cfg.activation_checkpoint else "none"
        blocks = len(model.layers) if hasattr(model, "layers") else [len(model.double_blocks), len(model.single_blocks)]
        shown = {"blocks": blocks, "local_batch_size": cfg.training.local_batch_size, "seq_len": cfg.training.seq_len,
                 "steps": cfg.training.steps, "ac": ac, "compile": cfg.compile.enable}  # fmt: skip
        print(f"gpu_check: titan {json.dumps(shown)}", flush=True)
    return cfg


def llama3() -> Any:
    """The ``llama3_8b_c4`` recipe's config (Llama 3.1 8B widths), its first ``layers`` blocks."""
    from cookbook_runtime.programs.cookbook_titan import llama3_8b_c4

    return _apply(llama3_8b_c4())


def flux() -> Any:
    """The ``flux_schnell`` recipe's config (FLUX.1-schnell widths), its first double and single blocks."""
    from cookbook_runtime.programs.cookbook_titan import flux_schnell

    return _apply(flux_schnell())


def llama3_tiny() -> Any:
    """CPU mode: the local bench's tiny Llama 3 (``cookbook/local/assets/tiny_llama.DIMS``), the recipe's trainer."""
    from cookbook.local.compat.titan_tiny_configs import tiny_llama3
    from cookbook_runtime.programs.cookbook_titan import checkpointed

    return _apply(checkpointed(tiny_llama3()))


def flux_tiny() -> Any:
    """CPU mode: the ``flux_schnell`` recipe's local-cpu config (tiny FLUX, the recipe's trainer)."""
    from cookbook.local.compat.titan_tiny_configs import flux_schnell_tiny

    return _apply(flux_schnell_tiny())
