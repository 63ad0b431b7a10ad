"""Tiny torchtitan 0.3.0 configs for CPU runs: llama3 and FLUX sized to the tiny assets.

torchtitan 0.3.0 configs are Python functions (no TOML), and model sizes cannot be changed from the command
line, so a tiny run needs its own config functions (the local-cpu flux_schnell recipe uses tiny_flux_spec)::

    torchrun ... -m cookbook.local.compat.cpu torchtitan --module cookbook.local.compat.titan_tiny_configs \\
        --config tiny_llama3 --hf_assets_path DIR --dataloader.dataset_path DIR ...

Defaults point at the default tiny-asset root (``cookbook tiny``); pass the paths on the command line for
another root (local-cpu sbatch scripts export TINY_DIR).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from cookbook.local.compat.cpu import apply_shims

# torchtitan must be imported under the shims (device type, triton) when this file is the first to import
# it. When torchtitan is already loaded (under `python -m cookbook.local.compat.cpu torchtitan`, or by the recipe
# engine validating a config on the login node), the configs below only build dataclasses.
if "torchtitan" not in sys.modules:
    apply_shims("torchtitan")

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss, MSELoss  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.components.validate import Validator  # noqa: E402
from torchtitan.config import ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # noqa: E402
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm  # noqa: E402
from torchtitan.models.llama3 import _build_llama3_layers  # noqa: E402
from torchtitan.models.llama3 import model_registry as llama3_registry  # noqa: E402
from torchtitan.models.llama3.model import Llama3Model  # noqa: E402
from torchtitan.protocols.model_spec import ModelSpec  # noqa: E402
from torchtitan.tools.profiler import Profiler  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from cookbook.local.assets import tiny_flux as flux_assets  # noqa: E402
from cookbook.local.assets import tiny_llama  # noqa: E402
from cookbook.local.assets.tiny import TinyAssets, default_root  # noqa: E402

# The sbatch scripts of local-cpu jobs export TINY_DIR; default: the `cookbook tiny` root.
_ASSETS = TinyAssets(Path(os.environ.get("TINY_DIR") or default_root()))


def tiny_llama3_spec(dims: tiny_llama.LlamaDims = tiny_llama.DIMS) -> ModelSpec:
    """torchtitan's llama3 ModelSpec with the tiny Llama's sizes (same as the tiny HF model)."""
    from functools import partial

    import torch.nn as nn

    base = llama3_registry("debugmodel")
    out_std = dims.dim**-0.5
    model = Llama3Model.Config(
        dim=dims.dim,
        vocab_size=dims.vocab_size,
        tok_embeddings=Embedding.Config(
            num_embeddings=dims.vocab_size,
            embedding_dim=dims.dim,
            param_init={"weight": partial(nn.init.normal_, std=1.0)},
        ),
        norm=RMSNorm.Config(normalized_shape=dims.dim, param_init={"weight": nn.init.ones_}),
        lm_head=Linear.Config(
            in_features=dims.dim,
            out_features=dims.vocab_size,
            param_init={
                "weight": partial(nn.init.trunc_normal_, std=out_std, a=-3 * out_std, b=3 * out_std),
                "bias": nn.init.zeros_,
            },
        ),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=dims.n_layers,
            dim=dims.dim,
            n_heads=dims.n_heads,
            n_kv_heads=dims.n_kv_heads,
            hidden_dim=dims.ffn_dim,
            rope=ComplexRoPE.Config(
                dim=dims.dim // dims.n_heads, max_seq_len=dims.max_seq_len, theta=dims.rope_theta, scaling="llama"
            ),
            attn_backend="flex",
        ),
    )
    return ModelSpec(
        name=base.name,
        flavor="tiny",
        model=model,
        parallelize_fn=base.parallelize_fn,
        pipelining_fn=base.pipelining_fn,
        post_optimizer_build_fn=base.post_optimizer_build_fn,
        state_dict_adapter=base.state_dict_adapter,
    )


def tiny_llama3() -> Trainer.Config:
    """Tiny llama3 on the C4-like folder: checkpoints every 5 steps, profiling and TensorBoard on."""
    spec = tiny_llama3_spec()
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=tiny_llama.DIMS.vocab_size)),
        hf_assets_path=str(_ASSETS.hf_tokenizer_dir),
        model_spec=spec,
        optimizer=default_adamw(lr=3e-3),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.1
        ),
        training=TrainingConfig(local_batch_size=2, seq_len=128, steps=10),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4", dataset_path=str(_ASSETS.c4_dir)),
        metrics=MetricsProcessor.Config(log_freq=1, enable_tensorboard=True, disable_color_printing=True),
        profiler=Profiler.Config(enable_profiling=True, profile_freq=5, profiler_warmup=1, profiler_active=1),
        checkpoint=CheckpointManager.Config(enable=True, interval=5, last_save_model_only=False),
        validator=Validator.Config(enable=False),
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor"),
    )


def tiny_flux_spec(dims: flux_assets.FluxDims = flux_assets.DIMS) -> ModelSpec:
    """torchtitan's flux-debug ModelSpec shrunk to the tiny FLUX assets' widths."""
    from copy import deepcopy

    from torchtitan.models.flux import _make_double_block_config, _make_single_block_config
    from torchtitan.models.flux import model_registry as flux_registry
    from torchtitan.models.flux.model.hf_embedder import FluxEmbedder
    from torchtitan.models.flux.model.layers import EmbedND

    base = flux_registry("flux-debug")
    cfg = base.model
    hidden, heads = 64, 2
    axes = (8, 12, 12)  # sums to head_dim = hidden // heads

    double = _make_double_block_config(hidden_size=hidden, num_heads=heads, mlp_ratio=2.0, qkv_bias=True)
    single = _make_single_block_config(hidden_size=hidden, num_heads=heads, mlp_ratio=2.0)
    model = dataclasses.replace(
        cfg,
        vec_in_dim=dims.clip_dim,
        context_in_dim=dims.t5_dim,
        hidden_size=hidden,
        mlp_ratio=2.0,
        num_heads=heads,
        depth=1,
        depth_single_blocks=1,
        axes_dim=axes,
        img_in=_resize(cfg.img_in, out_f=hidden),
        txt_in=_resize(cfg.txt_in, in_f=dims.t5_dim, out_f=hidden),
        autoencoder=flux_assets.autoencoder_config(dims),
        clip_encoder=FluxEmbedder.Config(version=str(_ASSETS.flux_clip_dir)),
        t5_encoder=FluxEmbedder.Config(version=str(_ASSETS.flux_t5_dir)),
        pe_config=EmbedND.Config(dim=hidden // heads, theta=10_000, axes_dim=axes),
        double_blocks=[deepcopy(double)],
        single_blocks=[deepcopy(single)],
        **_tiny_flux_mlps(cfg, dims, hidden),
    )
    return dataclasses.replace(base, flavor="tiny", model=model)


def _resize(linear: Linear.Config, in_f: int | None = None, out_f: int | None = None) -> Linear.Config:
    """``linear`` with new input/output widths (None keeps the old one)."""
    return dataclasses.replace(
        linear, in_features=in_f or linear.in_features, out_features=out_f or linear.out_features
    )


def _tiny_flux_mlps(cfg: Any, dims: flux_assets.FluxDims, hidden: int) -> dict[str, Any]:
    """The FLUX config's timestep and CLIP-vector input MLPs and its final layer, resized to ``hidden``."""
    return {
        "time_in_config": dataclasses.replace(
            cfg.time_in_config,
            hidden_dim=hidden,
            in_layer=_resize(cfg.time_in_config.in_layer, out_f=hidden),
            out_layer=_resize(cfg.time_in_config.out_layer, hidden, hidden),
        ),
        "vector_in_config": dataclasses.replace(
            cfg.vector_in_config,
            in_dim=dims.clip_dim,
            hidden_dim=hidden,
            in_layer=_resize(cfg.vector_in_config.in_layer, dims.clip_dim, hidden),
            out_layer=_resize(cfg.vector_in_config.out_layer, hidden, hidden),
        ),
        "final_layer_config": dataclasses.replace(
            cfg.final_layer_config,
            hidden_size=hidden,
            linear=_resize(cfg.final_layer_config.linear, in_f=hidden),
            adaln_linear=_resize(cfg.final_layer_config.adaln_linear, hidden, 2 * hidden),
        ),
    }


def tiny_flux() -> Any:  # FluxTrainer.Config (torchtitan imported inside)
    """Tiny FLUX on the cc12m-like shards with local T5/CLIP and autoencoder; checkpoints, profiling, TB on."""
    from torchtitan.models.flux.configs import FluxEncoderConfig
    from torchtitan.models.flux.flux_datasets import FluxDataLoader
    from torchtitan.models.flux.tokenizer import FluxTokenizerContainer
    from torchtitan.models.flux.trainer import FluxTrainer
    from torchtitan.models.flux.validate import FluxValidator

    dims = flux_assets.DIMS
    return FluxTrainer.Config(
        hf_assets_path=str(_ASSETS.flux_dir),
        loss=MSELoss.Config(),
        tokenizer=FluxTokenizerContainer.Config(
            t5_tokenizer_path=str(_ASSETS.flux_t5_dir),
            clip_tokenizer_path=str(_ASSETS.flux_clip_dir),
            max_t5_encoding_len=dims.max_t5_len,
        ),
        encoder=FluxEncoderConfig(
            autoencoder_path=str(_ASSETS.flux_autoencoder),
            t5_encoder=str(_ASSETS.flux_t5_dir),
            clip_encoder=str(_ASSETS.flux_clip_dir),
        ),
        metrics=MetricsProcessor.Config(log_freq=1, enable_tensorboard=True, disable_color_printing=True),
        model_spec=tiny_flux_spec(dims),
        optimizer=default_adamw(lr=1e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1, decay_ratio=0.0),
        training=TrainingConfig(local_batch_size=2, max_norm=2.0, steps=6, disable_cuda_graphs=True),
        dataloader=FluxDataLoader.Config(
            dataset="cc12m-test", dataset_path=str(_ASSETS.cc12m_dir), prompt_dropout_prob=0.0, img_size=dims.image_size
        ),
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor"),
        profiler=Profiler.Config(enable_profiling=True, profile_freq=3, profiler_warmup=1, profiler_active=1),
        checkpoint=CheckpointManager.Config(enable=True, interval=3, last_save_model_only=False),
        validator=FluxValidator.Config(enable=False),
    )


def flux_schnell_tiny() -> Any:
    """local-cpu ``flux_schnell``: :func:`tiny_flux` (torchtitan's flux_debugmodel expects the real autoencoder's
    widths) for a few steps, with the runtime's checkpointing and stop-save trainer
    (``cookbook_runtime.programs.cookbook_titan``, on the job's path:
    ``--module cookbook.local.compat.titan_tiny_configs --config flux_schnell_tiny``)."""
    from cookbook_runtime.programs.cookbook_titan import checkpointed  # the runtime's, on PYTHONPATH

    cfg = tiny_flux()
    cfg.training.steps = 4
    cfg.checkpoint.interval = 2
    cfg.validator.enable = False
    cfg.debug.seed = 0  # a fixed seed: a resumed run and an uninterrupted one are comparable step by step
    return checkpointed(cfg)
