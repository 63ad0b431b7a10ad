"""The planner's view of each recipe: model, default job size and the settings its config ships with."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from cookbook.planner.estimate import Settings
from cookbook.planner.models import MODELS


@dataclass(frozen=True)
class RecipeDefaults:
    name: str
    model: str  # key into MODELS
    framework: str
    nodes: int
    gpus_per_node: int
    gpu: str
    settings: Settings
    source: str


# torchtune keeps params in bf16 (dtype: bf16) and AdamW's m/v follow the param dtype: 8 bytes/param.
_TORCHTUNE = Settings(master_weights_fp32=False, optimizer_state_bytes=2, loss="chunked", checkpointing="full")
# torchtitan: FSDP2 MixedPrecision (fp32 params/grads/AdamW, bf16 compute), fp32 cross-entropy.
_TORCHTITAN = Settings(master_weights_fp32=True, optimizer_state_bytes=4, loss="fp32")
# AWS FSDP test case: HF-style model, FSDP MixedPrecision bf16, activation checkpointing + offloading.
_AWS_FSDP = Settings(master_weights_fp32=True, optimizer_state_bytes=4, loss="fp32", checkpointing="full",
                     activation_offloading=True, fused_optimizer=False)

RECIPES: dict[str, RecipeDefaults] = {
    "llama3_3_70b_full": RecipeDefaults(
        "llama3_3_70b_full", "llama3_3_70b", "torchtune", 2, 8, "h100",
        replace(_TORCHTUNE, seq_len=1024, micro_batch=4, compile=True),
        "torchtune llama3_3/70B_full_multinode.yaml (max_seq_len 1024 packed, batch_size 4, AC, compile, fused AdamW)"),
    "llama3_3_70b_lora": RecipeDefaults(
        "llama3_3_70b_lora", "llama3_3_70b", "torchtune", 2, 8, "h100",
        replace(_TORCHTUNE, seq_len=2048, micro_batch=2, lora_rank=16),
        "torchtune llama3_3/70B_lora.yaml (rank 16, batch_size 2, AC; max_seq_len null -> planner assumes 2048)"),
    "llama3_8b_c4": RecipeDefaults(
        "llama3_8b_c4", "llama3_1_8b", "torchtitan", 2, 8, "h100",
        replace(_TORCHTITAN, seq_len=8192, micro_batch=2, checkpointing="selective"),
        "torchtitan llama3_8b (seq 8192, selective op AC); bs 2 as in torchtitan docs/performance.md"),
    "flux_schnell": RecipeDefaults(
        "flux_schnell", "flux_schnell", "torchtitan", 2, 8, "h100",
        replace(_TORCHTITAN, micro_batch=64, checkpointing="full", shard_group=8, reshard_after_forward=False,
                image_size=256, text_tokens=256),
        "Nebius flux_schnell_model.toml (img 256, T5 256 tokens, full AC, HSDP 2x8, no reshard after forward);"
        " 64 images/GPU/step inferred from its log (tps x step time)"),
}

# AWS FSDP test case (seed 003): one recipe per model; max_context_width is the model's context.
for _key, _model in MODELS.items():
    if _model.kind == "llm" and _key != "llama3_3_70b":
        RECIPES[f"fsdp_{_key}"] = RecipeDefaults(
            f"fsdp_{_key}", _key, "fsdp", 4, 8, "h100",
            replace(_AWS_FSDP, seq_len=_model.max_seq_len, micro_batch=1),
            "awsome-distributed-training FSDP test case (train_batch_size 1, max_context_width = model context,"
            " activation_checkpointing=1, offload_activations=1, sharding full)")


# Config keys users pass as --set / recipe overrides, mapped onto Settings fields.
ALIASES: dict[str, str] = {
    "batch_size": "micro_batch", "training.local_batch_size": "micro_batch", "train_batch_size": "micro_batch",
    "local_batch_size": "micro_batch",
    "seq_len": "seq_len", "tokenizer.max_seq_len": "seq_len", "max_seq_len": "seq_len",
    "training.seq_len": "seq_len", "max_context_width": "seq_len",
    "gradient_accumulation_steps": "grad_accum", "training.gradient_accumulation_steps": "grad_accum",
    "enable_activation_checkpointing": "checkpointing", "activation_checkpoint.mode": "checkpointing",
    "activation_checkpointing": "checkpointing", "ac": "checkpointing",
    "enable_activation_offloading": "activation_offloading", "offload_activations": "activation_offloading",
    "model.lora_rank": "lora_rank", "rank": "lora_rank",
    "tensor_parallel_dim": "tp", "parallelism.tensor_parallel_degree": "tp",
    "parallelism.data_parallel_shard_degree": "shard_group",
    "optimizer.fused": "fused_optimizer", "optimizer_in_bwd": "optimizer_in_backward",
    "training.compile": "compile", "compile.enable": "compile",
    "parallelism.fsdp_reshard_after_forward": "reshard_after_forward",
    "training.img_size": "image_size", "encoder.max_t5_encoding_len": "text_tokens",
}

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False}


def _coerce(field: str, value: Any) -> Any:
    """Turn a config value (often a string from the command line) into the Settings field's type."""
    default = getattr(Settings(), field)
    if field == "checkpointing":
        text = str(value).lower()
        if text in _BOOL_WORDS:
            return "full" if _BOOL_WORDS[text] else "none"
        return text
    if field == "reshard_after_forward" and str(value).lower() in ("always", "never", "default"):
        return str(value).lower() != "never"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text not in _BOOL_WORDS:
            raise ValueError(f"{field}: expected true/false, got {value!r}")
        return _BOOL_WORDS[text]
    if isinstance(default, int):
        if str(value).lower() in ("none", "null", "-1") and field == "tp":
            return 1
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{field}: expected a whole number, got {value!r}") from None
        if number != int(number):
            raise ValueError(f"{field}: expected a whole number, got {value!r}")
        return max(int(number), 1) if field == "tp" else int(number)
    if isinstance(default, float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{field}: expected a number, got {value!r}") from None
    return str(value)


def settings_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``{config key or Settings field: value}`` to typed Settings fields; unknown keys raise."""
    known = set(Settings.__dataclass_fields__)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        field = key if key in known else ALIASES.get(key)
        if field is None:
            raise ValueError(f"unknown setting {key!r}; use one of: {', '.join(sorted(known | set(ALIASES)))}")
        out[field] = _coerce(field, value)
    return out


def ignorable_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Like :func:`settings_overrides` but silently drops keys that do not change memory or speed."""
    known = set(Settings.__dataclass_fields__) | set(ALIASES)
    return settings_overrides({k: v for k, v in raw.items() if k in known})


def get_recipe(name: str) -> RecipeDefaults:
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None
