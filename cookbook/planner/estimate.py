"""Per-GPU memory and throughput estimates for one training configuration.

Activation memory follows the method of Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (arXiv:2205.05198, sec. 4): count the bytes every op saves for backward, per
token and layer. Their 34*s*b*h (+5*a*s^2*b) is for GPT (GELU MLP, dropout, materialised attention); for
the Llama block (RMSNorm, SwiGLU, GQA, flash/SDPA attention that saves no s^2 matrix, no dropout) the
same count in bf16 gives, per token and layer:

- none:      12h + 4*kv + 8f bytes  (norm in/out x2: 8h, Q 2h, K/V 4kv, attention out 2h, w1/w3 out,
             silu(w1), product: 8f)
- selective: 8h + 2*kv + 2f bytes   (torchtitan's "op" policy: keep the block input, SDPA output and
             every other matmul output -- wq, wv, w1, w2 -- recompute the rest)
- full:      2h bytes               (only the block input; the block is recomputed in backward)

With selective/full AC one block's full activations are live again during its backward. Tensor
parallelism with sequence parallelism divides activations by the TP degree (Korthikanti, table 2).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from cookbook.planner.hardware import COMPILE_ACTIVATION_FACTOR, COMPILE_SPEEDUP, GIB, GpuSpec
from cookbook.planner.models import FluxShape, ModelShape, get_model, shape_from_config

Checkpointing = Literal["none", "selective", "full"]
CHECKPOINTING_MODES: tuple[str, ...] = ("none", "selective", "full")

# FLUX: the only published run (Nebius, 2x8 H100, full AC; its batch: FluxSchnell.images_per_gpu in
# cookbook/recipes/torchtitan.py) logs ~7.9 images/s/GPU (a rate: the batch size does not enter it), i.e.
# ~24% MFU by flops_per_sample(): 0.64 of what the LLM anchors give with full AC. Calibrated, not
# independently checked.
FLUX_MFU_FACTOR = 0.64
# Forward FLOPs recomputed in backward, in units of N (parameters) per token: selective op AC recomputes
# about every other matmul (torchtitan's "op" policy keeps wq, wv, w1, w2 outputs): ~1N of the 2N forward;
# full AC the whole forward: 2N. The MFU anchors are selective-op runs (6N useful of ~7N executed), so a
# mode's MFU is anchor x 7/6 x useful / (useful + recomputed), useful = 6N (4N for LoRA: no weight
# gradients of the frozen base). Full AC is then 0.875 of selective (was 6/8 = 0.75, 0.73-0.75 of the
# published 70B full-AC runs); torchtitan's 13B A100 table has no-AC 61.1% vs selective op 53.8% (x1.14,
# this gives x1.17).
RECOMPUTED_N: dict[str, float] = {"none": 0.0, "selective": 1.0, "full": 2.0}
# LoRA: torchtune's optimisation-flags table (Llama 3.2 3B, A100, same flags) gives 8.5 GiB peak active for
# LoRA r64 vs 21.8 GiB for the full fine-tune: activations + loss temporaries of ~2.0 GiB against ~3.9 GiB.
# The planner's loss temporaries (bf16 logits + one fp32 chunk) over-count that by ~2x for LoRA; the cause is
# not derived here (frozen tied output projection: no output-weight gradient is formed). Empirical, fitted on
# that one row (its ratio was 1.27); the 70B LoRA row checks it (1.05 -> 1.02).
LORA_LOSS_FACTOR = 0.5
# Assumption (no published anchor in this project's sources): each doubling of the TP degree costs 5%.
TP_PENALTY_PER_DOUBLING = 0.05


@dataclass(frozen=True)
class Settings:
    """Everything about a run that changes memory or speed (defaults per recipe in ``recipes.py``)."""

    seq_len: int = 2048  # tokens per sample (LLM); ignored for FLUX (image + text tokens)
    micro_batch: int = 1  # samples per GPU per forward/backward
    grad_accum: int = 1
    checkpointing: Checkpointing = "full"
    activation_offloading: bool = False
    lora_rank: int = 0  # 0 = full fine-tune
    lora_mlp: bool = True  # LoRA on the MLP projections too (torchtune 70B_lora: yes)
    tp: int = 1  # tensor-parallel degree
    shard_group: int = 0  # HSDP: GPUs one copy is sharded over (0 = all data-parallel ranks)
    fsdp_cpu_offload: bool = False  # params, grads and optimizer states live in CPU memory
    fused_optimizer: bool = True  # False: foreach AdamW's temporaries (~1 fp32 copy of the shard)
    optimizer_in_backward: bool = False  # gradients freed per parameter (torchtune optimizer_in_bwd)
    master_weights_fp32: bool = True  # torchtitan/FSDP MixedPrecision: fp32 params+grads, bf16 compute
    optimizer_state_bytes: int = 4  # AdamW m and v: 4 (fp32) or 2 (torchtune bf16: follow param dtype)
    reshard_after_forward: bool = True  # False keeps every gathered bf16 weight until backward
    loss: Literal["fp32", "chunked"] = "fp32"  # fp32 logits (torchtitan/HF) or torchtune chunked CE
    compile: bool = False
    image_size: int = 256  # FLUX: pixels per side; image tokens = (image_size/16)**2
    text_tokens: int = 256  # FLUX: T5 tokens per sample
    fragmentation: float = 0.10  # caching-allocator overhead on top of live tensors
    fixed_overhead_gib: float = 1.0  # NCCL buffers, cuBLAS workspaces, CUDA graphs pools

    def with_overrides(self, **overrides: object) -> Settings:
        names = {f.name for f in fields(self)}
        if unknown := sorted(set(overrides) - names):
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return replace(self, **overrides)  # type: ignore[arg-type]

    def validate(self) -> None:
        if self.checkpointing not in CHECKPOINTING_MODES:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING_MODES}, not {self.checkpointing!r}")
        for name in ("seq_len", "micro_batch", "grad_accum", "tp"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank={self.lora_rank}: must be > 0 (0: a full fine-tune)")
        if self.optimizer_state_bytes not in (1, 2, 4):
            raise ValueError("optimizer_state_bytes must be 1, 2 or 4")
        if self.loss not in ("fp32", "chunked"):
            raise ValueError("loss must be 'fp32' or 'chunked'")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU, by what holds them."""

    params: float
    grads: float
    optimizer: float
    activations: float
    loss: float  # logits and cross-entropy temporaries at the start of backward
    buffers: float  # FSDP all-gather/reduce-scatter buffers, frozen encoders, optimizer temporaries
    overhead: float = field(default=0.0)  # fragmentation + fixed workspaces

    @property
    def live(self) -> float:
        """Peak bytes held by tensors (torch's "active" memory).

        Gradients and activations do not peak together: at the start of backward every activation and
        the loss temporaries are live but no gradient is; by the optimizer step the activations are gone.
        """
        return self.params + self.optimizer + self.buffers + max(self.grads, self.activations + self.loss)

    @property
    def total(self) -> float:
        """Peak bytes the caching allocator reserves (torchtitan's "memory: X GiB")."""
        return self.live + self.overhead

    def rows_gib(self) -> list[tuple[str, float]]:
        return [(f.name, getattr(self, f.name) / GIB) for f in fields(self)]


def tokens_per_sample(model: ModelShape | FluxShape, s: Settings) -> int:
    if isinstance(model, FluxShape):
        return (s.image_size // 16) ** 2 + s.text_tokens
    return s.seq_len


def lora_params(model: ModelShape, s: Settings) -> int:
    """Adapter parameters: rank*(in+out) for every adapted linear in every block."""
    if s.lora_rank <= 0:
        return 0
    h, kv, f = model.hidden, model.kv_dim, model.intermediate
    attn = 2 * (h + h) + 2 * (h + kv)
    mlp = model.experts * 3 * (h + f) if s.lora_mlp else 0
    return s.lora_rank * (attn + mlp) * model.layers


def _activation_bytes_per_token_layer(model: ModelShape | FluxShape, mode: str) -> float:
    h = model.hidden
    if isinstance(model, FluxShape):
        # Same op-by-op count for an MM-DiT block (modulated LayerNorm, fused QKV+MLP linear, QK-norm,
        # RoPE, GELU-tanh): ~48h bytes/token without AC.
        return {"none": 48 * h, "selective": 20 * h, "full": 2 * h}[mode]
    kv = model.kv_dim
    f = model.intermediate * model.experts_per_token
    return {"none": 12 * h + 4 * kv + 8 * f, "selective": 8 * h + 2 * kv + 2 * f, "full": 2 * h}[mode]


def estimate_memory(model: ModelShape | FluxShape, s: Settings, world: int) -> MemoryBreakdown:
    """Peak bytes per GPU for one training step of ``model`` over ``world`` GPUs with settings ``s``."""
    s.validate()
    dp = max(1, world // s.tp)
    shard = s.shard_group or dp
    per_tp = model.total_params / s.tp
    sharded = per_tp / shard
    block = (model.layer_params if isinstance(model, ModelShape) else model.single_block_params) / s.tp

    if s.lora_rank > 0 and isinstance(model, ModelShape):
        adapters = lora_params(model, s) / s.tp / shard
        params = 2 * sharded + 2 * adapters  # frozen bf16 base + bf16 adapters
        grads = 2 * adapters
        optimizer = 2 * s.optimizer_state_bytes * adapters
        grad_buffer = 0.0
    else:
        weight_bytes = 4 if s.master_weights_fp32 else 2
        params = weight_bytes * sharded
        grads = 0.0 if s.optimizer_in_backward else weight_bytes * sharded
        optimizer = 2 * s.optimizer_state_bytes * sharded
        if not s.fused_optimizer:
            optimizer += 4 * sharded  # foreach AdamW materialises one fp32 temporary per parameter
        grad_buffer = (4 if s.master_weights_fp32 else 2) * block  # one unsharded block before reduce-scatter
    if s.fsdp_cpu_offload:
        params = grads = optimizer = 0.0

    # FSDP working set: the current and the prefetched block gathered in bf16, plus the largest
    # separately-wrapped unit (the output projection, vocab x hidden) for LLMs.
    gathered = 2 * 2 * block
    if isinstance(model, ModelShape):
        gathered += 2 * model.embedding_params / s.tp
    if not s.reshard_after_forward:
        gathered = 2 * per_tp  # every block stays gathered from its forward to its backward
    buffers = gathered + grad_buffer if shard > 1 else 0.0  # one GPU per copy: nothing to gather
    if isinstance(model, FluxShape):
        buffers += 2 * model.frozen_params / shard  # frozen T5/CLIP/AE in bf16, sharded like the model

    tokens = s.micro_batch * tokens_per_sample(model, s)
    per_layer = _activation_bytes_per_token_layer(model, s.checkpointing)
    stored = tokens * per_layer * model.layers / s.tp
    if s.activation_offloading:
        stored *= min(1.0, 2 / model.layers)  # only the blocks in flight stay on the GPU
    recompute = 0.0 if s.checkpointing == "none" else tokens * _activation_bytes_per_token_layer(model, "none") / s.tp
    activations = (stored + recompute) * (COMPILE_ACTIVATION_FACTOR if s.compile else 1.0)

    loss = 0.0
    if isinstance(model, ModelShape):
        # fp32: at backward start the fp32 log-softmax output, the dense nll grad and its softmax grad are
        # live (3 x 4V bytes/token). chunked: bf16 logits (2V) + one of 8 chunks upcast (12V/8).
        per_token = 12 * model.vocab_size if s.loss == "fp32" else 2 * model.vocab_size + 1.5 * model.vocab_size
        loss = tokens * per_token / s.tp
        if s.lora_rank > 0:
            loss *= LORA_LOSS_FACTOR

    held = MemoryBreakdown(params, grads, optimizer, activations, loss, buffers)
    overhead = s.fragmentation * held.live + s.fixed_overhead_gib * GIB
    return replace(held, overhead=overhead)


def flops_per_token(model: ModelShape | FluxShape, s: Settings) -> float:
    """Model training FLOPs per token: 6N (4N with LoRA: no weight gradients) plus attention 12*L*h*s."""
    if isinstance(model, FluxShape):
        n, width = model.per_token_params, model.hidden
    else:
        n, width = model.non_embedding_active_params, model.heads * model.head_dim
    return (4 if s.lora_rank > 0 else 6) * n + 12 * model.layers * width * tokens_per_sample(model, s)


def flops_per_sample(model: ModelShape | FluxShape, s: Settings) -> float:
    """FLOPs per training sample; FLUX adds the frozen encoders' forward (2N per token)."""
    total = flops_per_token(model, s) * tokens_per_sample(model, s)
    if isinstance(model, FluxShape):
        total += 2 * model.text_encoder_params * s.text_tokens + 2 * model.clip_params * 77
    return total


def hf_config_flops_per_token(config: Mapping[str, object] | str | os.PathLike[str], seq_len: int) -> float:
    """FLOPs per token of a Llama-style model from its Hugging Face ``config.json`` (dict or path),
    counted by :func:`flops_per_token` (the one count of the package: 6N + 12 * layers * heads * head_dim * s)."""
    p = Path() if isinstance(config, Mapping) else Path(config)
    values = config if isinstance(config, Mapping) else json.loads((p / "config.json" if p.is_dir() else p).read_text())
    return flops_per_token(shape_from_config(values), Settings(seq_len=seq_len))


# torchtitan's FLUX trainer (2025, e.g. ``tps: 1,541,366`` in the Nebius FLUX.1-schnell guide,
# https://github.com/nebius/ml-cookbook) counted ``labels.numel()`` as tokens: the pixel values of each
# image, 3 * image_size**2. Later versions count seq_len per image instead.
FLUX_TPS_PER_IMAGE_PIXEL = 3


def planner_flops(model: str, seq_len: int | None = None, image_size: int | None = None) -> tuple[float, float]:
    """(FLOPs per unit of the logged ``tokens_per_second_per_gpu``, FLOPs per sample) of a planner model.

    ``model`` is a planner key (``llama3_1_8b``, ``flux_schnell`` ...), counted by :func:`flops_per_sample` (unset
    sizes: the ``Settings`` defaults). An LLM's unit is a token; FLUX trains on images, so its unit is one
    pixel value (see ``FLUX_TPS_PER_IMAGE_PIXEL``): FLOPs per image / (3 * image_size**2)."""
    shape = get_model(model)
    s = Settings().with_overrides(**{k: v for k, v in (("seq_len", seq_len), ("image_size", image_size)) if v})
    per_sample = flops_per_sample(shape, s)
    if isinstance(shape, FluxShape):
        return per_sample / (FLUX_TPS_PER_IMAGE_PIXEL * s.image_size**2), per_sample
    return flops_per_token(shape, s), per_sample


def effective_mfu(gpu: GpuSpec, s: Settings, model: ModelShape | FluxShape | None = None) -> float:
    """The GPU's MFU anchor (selective AC) scaled for recompute (see ``RECOMPUTED_N``), plus compile's gain."""
    mfu = gpu.mfu
    if isinstance(model, FluxShape):
        mfu *= FLUX_MFU_FACTOR
    mfu *= recompute_factor(s)
    if s.compile:
        mfu *= COMPILE_SPEEDUP
    if s.tp > 1:
        mfu *= 1 - TP_PENALTY_PER_DOUBLING * math.log2(s.tp)  # TP all-gathers/reduce-scatters per block
    if s.fsdp_cpu_offload:
        mfu *= 0.5  # optimizer step and H2D/D2H copies on the critical path
    return mfu


def recompute_factor(s: Settings) -> float:
    """MFU of this AC mode relative to the selective-op anchor: 7/6 x useful / (useful + recomputed)."""
    useful = 4.0 if s.lora_rank > 0 else 6.0
    return (7 / 6) * useful / (useful + RECOMPUTED_N[s.checkpointing])


def samples_per_second_per_gpu(model: ModelShape | FluxShape, s: Settings, gpu: GpuSpec) -> float:
    return gpu.peak_bf16_tflops * 1e12 * effective_mfu(gpu, s, model) / flops_per_sample(model, s)
