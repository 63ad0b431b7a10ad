"""A tiny random Llama-3.x model in Hugging Face layout, with its tiktoken tokenizer.

Layout (as ``tune download meta-llama/Llama-3.3-70B-Instruct`` leaves it, minus consolidated weights):
``config.json``, ``generation_config.json``, ``model-00001-of-00001.safetensors`` + index,
``original/tokenizer.model`` (tiktoken BPE ranks), ``tokenizer.json`` (a full HF tokenizer, the same
vocabulary; torchtune reads only its ``added_tokens`` via ``special_tokens_path``), ``tokenizer_config.json``
and ``original_repo_id.json``. torchtune 0.6.1 (``llama3_tokenizer``, ``FullModelHFCheckpointer``),
transformers and torchtitan's HF tokenizer all load it.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

N_BPE_RANKS = 384  # 256 single bytes + 128 learned merges
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
    "<|video|>",
)
SHARD = "model-00001-of-00001.safetensors"
REPO_ID = "cookbook/tiny-llama3_3"


@dataclass(frozen=True)
class LlamaDims:
    """Model sizes; torchtune configs and torchtitan test configs read them from here."""

    vocab_size: int = 512  # >= BPE ranks + special tokens
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 256
    max_seq_len: int = 512
    rope_theta: float = 500_000.0
    rope_scale: float = 8.0
    norm_eps: float = 1e-5


DIMS = LlamaDims()


def special_token_ids() -> dict[str, int]:
    """Special tokens get the ids right after the BPE ranks (Llama 3 does the same at 128000)."""
    return {tok: N_BPE_RANKS + i for i, tok in enumerate(SPECIAL_TOKENS)}


def train_bpe_ranks(text: str, n_ranks: int = N_BPE_RANKS) -> dict[bytes, int]:
    """Byte-level BPE ranks learned on ``text`` with Llama 3's split pattern.

    Trains on the distinct pre-tokenized words weighted by count (fast), breaking ties by the pair's bytes,
    so the result is deterministic.
    """
    import regex
    from torchtune.models.llama3._tokenizer import CL100K_PATTERN

    word_counts = Counter(regex.findall(CL100K_PATTERN, text))
    words = [([bytes([b]) for b in w.encode()], n) for w, n in sorted(word_counts.items())]
    ranks = {bytes([i]): i for i in range(256)}
    while len(ranks) < n_ranks:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for parts, n in words:
            for pair in zip(parts, parts[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merged = best[0] + best[1]
        ranks[merged] = len(ranks)
        for parts, _ in words:
            i = 0
            while i < len(parts) - 1:
                if parts[i] == best[0] and parts[i + 1] == best[1]:
                    parts[i : i + 2] = [merged]
                i += 1
    if len(ranks) != n_ranks:
        raise RuntimeError(f"tiny BPE training stopped at {len(ranks)} ranks (wanted {n_ranks}): too little text")
    return ranks


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> None:
    """The ``original/tokenizer.model`` format: one ``base64(token) rank`` per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n")


def hf_tokenizer_from_ranks(ranks: dict[bytes, int]):
    """The same tokenizer as a ``tokenizers.Tokenizer`` (byte-level BPE; merges recovered from the ranks)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from torchtune.models.llama3._tokenizer import CL100K_PATTERN
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_encoder = bytes_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(byte_encoder[x] for x in b)

    vocab = {as_str(tok): rank for tok, rank in ranks.items()}
    merges = sorted(
        (rank, ranks[tok[:i]], ranks[tok[i:]], tok[:i], tok[i:])
        for tok, rank in ranks.items()
        for i in range(1, len(tok))
        if tok[:i] in ranks and tok[i:] in ranks
    )
    tokenizer = Tokenizer(
        BPE(vocab, [(as_str(m[3]), as_str(m[4])) for m in merges], fuse_unk=False, ignore_merges=True)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    return tokenizer


def tokenizer_config() -> dict:
    """``tokenizer_config.json`` for transformers / torchtitan (BOS added by the caller, as in Llama 3)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|finetune_right_pad_id|>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": DIMS.max_seq_len,
        "clean_up_tokenization_spaces": False,
    }


def write_tokenizer_files(folder: Path, ranks: dict[bytes, int]) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` into ``folder`` (sorted keys: stable bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = hf_tokenizer_from_ranks(ranks)
    assert tok.token_to_id(SPECIAL_TOKENS[0]) == special_token_ids()[SPECIAL_TOKENS[0]]
    (folder / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")


def hf_config(dims: LlamaDims = DIMS) -> dict:
    """``config.json`` of a ``LlamaForCausalLM`` with Llama 3.3's rope scaling."""
    sp = special_token_ids()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.dim,
        "intermediate_size": dims.ffn_dim,
        "num_hidden_layers": dims.n_layers,
        "num_attention_heads": dims.n_heads,
        "num_key_value_heads": dims.n_kv_heads,
        "head_dim": dims.dim // dims.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,  # as Llama 3.3; torchtune takes max_seq_len from its YAML
        "rms_norm_eps": dims.norm_eps,
        "rope_theta": dims.rope_theta,
        "rope_scaling": {
            "factor": dims.rope_scale,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": sp["<|begin_of_text|>"],
        "eos_token_id": [sp["<|end_of_text|>"], sp["<|eom_id|>"], sp["<|eot_id|>"]],
        "torch_dtype": "bfloat16",
    }


def torchtune_model(dims: LlamaDims) -> Any:
    """torchtune's Llama 3.1 builder with ``dims`` (on the current device: ``torch.device("meta")`` for shapes)."""
    from torchtune.models.llama3_1 import llama3_1

    return llama3_1(
        vocab_size=dims.vocab_size,
        num_layers=dims.n_layers,
        num_heads=dims.n_heads,
        num_kv_heads=dims.n_kv_heads,
        embed_dim=dims.dim,
        max_seq_len=dims.max_seq_len,
        intermediate_dim=dims.ffn_dim,
        rope_base=dims.rope_theta,
        norm_eps=dims.norm_eps,
        scale_factor=dims.rope_scale,
    )


def write_model(folder: Path, dims: LlamaDims = DIMS, seed: int = 0) -> None:
    """Random weights (small init, so the loss starts near ln(vocab)), converted with torchtune's tune_to_hf."""
    import torch
    from safetensors.torch import save_file
    from torchtune.models.convert_weights import tune_to_hf

    torch.manual_seed(seed)
    model = torchtune_model(dims)
    gen = torch.Generator().manual_seed(seed)
    state = {  # matrices drawn in name order from one generator
        name: torch.randn(value.shape, generator=gen) * 0.02 if value.dim() == 2 else value
        for name, value in sorted(model.state_dict().items())
    }
    hf_state = tune_to_hf(state, num_heads=dims.n_heads, num_kv_heads=dims.n_kv_heads, dim=dims.dim)
    hf_state = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(hf_state.items())}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(hf_state, str(folder / SHARD), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in hf_state.values())
    config = hf_config(dims)
    for name, content in (
        (
            "model.safetensors.index.json",
            {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(hf_state, SHARD)},
        ),
        ("config.json", config),
        ("generation_config.json", {k: config[k] for k in ("bos_token_id", "eos_token_id")}),
    ):
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")
    (folder / "original_repo_id.json").write_text(json.dumps({"repo_id": REPO_ID}, indent=4) + "\n")


def write_llama(folder: Path, tokenizer_text: str) -> dict[bytes, int]:
    """The whole tiny Llama folder; returns the BPE ranks (reused for the torchtitan tokenizer folder)."""
    ranks = train_bpe_ranks(tokenizer_text)
    write_tiktoken_model(folder / "original" / "tokenizer.model", ranks)
    write_tokenizer_files(folder, ranks)
    write_model(folder)
    return ranks
