"""Model shapes and exact parameter counts, from published configs, a config dict or a module.

Shapes are the Hugging Face ``config.json`` values of each model (the model table of AWS's FSDP test case,
https://github.com/aws-samples/awsome-distributed-training/tree/main/3.test_cases/pytorch/FSDP/slurm,
lists Llama 3.2 3B's intermediate size as 11008; its real config says 8192, which is what gives the
published 3.21B parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only Llama/Mistral/Mixtral-style transformer (RMSNorm, SwiGLU, GQA, RoPE)."""

    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied_embeddings: bool = False
    experts: int = 1  # MoE: experts per layer (1 = dense)
    experts_per_token: int = 1
    max_seq_len: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts if self.experts > 1 else 0

    @property
    def layer_params(self) -> int:
        """One transformer block: attention, all experts' MLPs, router, two RMSNorm weights."""
        return self.attention_params + self.experts * self.expert_params + self.router_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    @property
    def total_params(self) -> int:
        output = 0 if self.tied_embeddings else self.embedding_params
        return self.embedding_params + output + self.layers * self.layer_params + self.hidden

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: only ``experts_per_token`` experts)."""
        inactive = (self.experts - self.experts_per_token) * self.expert_params * self.layers
        return self.total_params - inactive

    @property
    def non_embedding_active_params(self) -> int:
        """What the 6N FLOPs rule counts (torchtitan excludes the input embedding lookup)."""
        return self.active_params - self.embedding_params

    @property
    def kind(self) -> str:
        return "llm"


@dataclass(frozen=True)
class FluxShape:
    """The FLUX.1 MM-DiT (black-forest-labs/flux ``FluxParams``) plus its frozen encoders."""

    name: str
    hidden: int = 3072
    heads: int = 24
    double_blocks: int = 19
    single_blocks: int = 38
    mlp_ratio: float = 4.0
    in_channels: int = 64
    context_dim: int = 4096
    vec_dim: int = 768
    guidance_embed: bool = False
    text_encoder_params: int = 4_762_310_656  # google/t5-v1_1-xxl encoder, frozen
    clip_params: int = 123_060_480  # openai/clip-vit-large-patch14 text model, frozen
    autoencoder_params: int = 83_819_683  # FLUX ae.safetensors, frozen

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden * self.mlp_ratio)

    @property
    def layers(self) -> int:
        return self.double_blocks + self.single_blocks

    def _linear(self, n_in: int, n_out: int) -> int:
        return n_in * n_out + n_out

    @property
    def stream_params(self) -> int:
        """One stream (image or text) of a double block."""
        h, m = self.hidden, self.mlp_hidden
        qk_norm = 2 * self.hidden // self.heads
        return (
            self._linear(h, 6 * h)
            + self._linear(h, 3 * h)
            + qk_norm
            + self._linear(h, h)
            + self._linear(h, m)
            + self._linear(m, h)
        )

    @property
    def single_block_params(self) -> int:
        h, m = self.hidden, self.mlp_hidden
        qk_norm = 2 * self.hidden // self.heads
        return self._linear(h, 3 * h + m) + self._linear(h + m, h) + qk_norm + self._linear(h, 3 * h)

    @property
    def total_params(self) -> int:
        h = self.hidden
        embedders = (
            self._linear(self.in_channels, h)
            + self._linear(256, h)
            + self._linear(h, h)
            + self._linear(self.vec_dim, h)
            + self._linear(h, h)
            + self._linear(self.context_dim, h)
        )
        if self.guidance_embed:
            embedders += self._linear(256, h) + self._linear(h, h)
        final = self._linear(h, self.in_channels) + self._linear(h, 2 * h)
        return (
            embedders
            + self.double_blocks * 2 * self.stream_params
            + self.single_blocks * self.single_block_params
            + final
        )

    @property
    def active_params(self) -> int:
        return self.total_params

    @property
    def per_token_params(self) -> int:
        """Weights one token's matmuls use: one stream of each double block, every single block."""
        return self.double_blocks * self.stream_params + self.single_blocks * self.single_block_params

    @property
    def frozen_params(self) -> int:
        return self.text_encoder_params + self.clip_params + self.autoencoder_params

    @property
    def kind(self) -> str:
        return "flux"


def _llama3(
    name: str, hidden: int, layers: int, heads: int, intermediate: int, tied: bool = False, max_seq_len: int = 8192
) -> ModelShape:
    return ModelShape(name, 128_256, hidden, layers, heads, 8, intermediate, tied, max_seq_len=max_seq_len)


MODELS: dict[str, ModelShape | FluxShape] = {
    "llama3_1_8b": _llama3("Llama 3.1 8B", 4096, 32, 32, 14336),
    "llama3_1_70b": _llama3("Llama 3.1 70B", 8192, 80, 64, 28672),
    "llama3_3_70b": _llama3("Llama 3.3 70B", 8192, 80, 64, 28672),
    "llama3_2_1b": _llama3("Llama 3.2 1B", 2048, 16, 32, 8192, tied=True),
    "llama3_2_3b": _llama3("Llama 3.2 3B", 3072, 28, 24, 8192, tied=True),
    "llama2_7b": ModelShape("Llama 2 7B", 32_000, 4096, 32, 32, 32, 11008, max_seq_len=4096),
    "llama2_13b": ModelShape("Llama 2 13B", 32_000, 5120, 40, 40, 40, 13824, max_seq_len=4096),
    "llama2_70b": ModelShape("Llama 2 70B", 32_000, 8192, 80, 64, 8, 28672, max_seq_len=4096),
    "mistral_7b": ModelShape("Mistral 7B", 32_000, 4096, 32, 32, 8, 14336, max_seq_len=32768),
    "mathstral_7b": ModelShape("Mathstral 7B", 32_768, 4096, 32, 32, 8, 14336, max_seq_len=32768),
    "mixtral_8x7b": ModelShape(
        "Mixtral 8x7B", 32_000, 4096, 32, 32, 8, 14336, experts=8, experts_per_token=2, max_seq_len=32768
    ),
    "flux_schnell": FluxShape("FLUX.1-schnell"),
    "flux_dev": FluxShape("FLUX.1-dev", guidance_embed=True),
}


def get_model(key: str) -> ModelShape | FluxShape:
    """Look a model up by key (``llama3_1_8b``, ``mixtral_8x7b``, ``flux_schnell`` ...)."""
    try:
        return MODELS[key]
    except KeyError:
        raise KeyError(f"unknown model {key!r}; known: {', '.join(sorted(MODELS))}") from None


_CONFIG_KEYS = {  # our field: (HF config.json key, torchtune builder argument)
    "vocab_size": ("vocab_size", "vocab_size"),
    "hidden": ("hidden_size", "embed_dim"),
    "layers": ("num_hidden_layers", "num_layers"),
    "heads": ("num_attention_heads", "num_heads"),
    "intermediate": ("intermediate_size", "intermediate_dim"),
}


def shape_from_config(config: Mapping[str, Any], name: str = "custom") -> ModelShape:
    """A shape from a Hugging Face ``config.json`` dict or torchtune ``llama3_1(...)`` arguments."""
    values: dict[str, Any] = {}
    for field, keys in _CONFIG_KEYS.items():
        found = [config[k] for k in keys if k in config]
        if not found:
            raise ValueError(f"config has neither {keys[0]!r} nor {keys[1]!r}")
        values[field] = int(found[0])
    kv = config.get("num_key_value_heads", config.get("num_kv_heads")) or values["heads"]
    experts = int(config.get("num_local_experts", config.get("num_experts", 1)) or 1)
    return ModelShape(
        name=name,
        kv_heads=int(kv),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        experts=experts,
        experts_per_token=int(config.get("num_experts_per_tok", 1) if experts > 1 else 1),
        max_seq_len=int(config.get("max_position_embeddings", config.get("max_seq_len", 8192))),
        **values,
    )


def count_parameters(module: Any, trainable_only: bool = False) -> int:
    """Exact parameter count of an ``nn.Module`` (shared tensors counted once)."""
    unique = {id(p): p for p in module.parameters() if p.requires_grad or not trainable_only}
    return sum(p.numel() for p in unique.values())
