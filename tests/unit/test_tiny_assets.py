"""The tiny assets load with the real loaders (torchtune, transformers, datasets, tiktoken) and are deterministic."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from cookbook.local.assets.tiny import ASSETS_VERSION, TinyAssets, build_tiny_assets, ensure_tiny_assets
from cookbook.local.assets.tiny_llama import DIMS, N_BPE_RANKS, SPECIAL_TOKENS, special_token_ids


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_bytes_twice(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    again = build_tiny_assets(tmp_path / "again")
    assert _digest(again.root) == _digest(tiny_assets.root)


def test_cached_and_rebuilt_when_stale(tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    assets = ensure_tiny_assets(root)
    assert assets.marker.read_text().strip() == ASSETS_VERSION
    stamp = assets.alpaca.stat().st_mtime_ns
    assert ensure_tiny_assets(root).alpaca.stat().st_mtime_ns == stamp  # cached: not rewritten
    assets.marker.write_text("old-version\n")
    (root / "leftover").write_text("from an older layout")
    rebuilt = ensure_tiny_assets(root)
    assert rebuilt.is_current() and not (root / "leftover").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left behind


def test_torchtune_tokenizer_and_checkpointer(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    from torchtune.models.llama3 import llama3_tokenizer
    from torchtune.training import FullModelHFCheckpointer

    tok = llama3_tokenizer(str(tiny_assets.tokenizer_model), special_tokens_path=str(tiny_assets.special_tokens))
    ids = tok.encode("What is 3 plus 4? Also spell echo.", add_bos=True, add_eos=True)
    assert ids[0] == special_token_ids()["<|begin_of_text|>"] and ids[-1] == special_token_ids()["<|end_of_text|>"]
    assert tok.decode(ids[1:-1]) == "What is 3 plus 4? Also spell echo."
    assert max(ids) < DIMS.vocab_size

    ckpt = FullModelHFCheckpointer(
        checkpoint_dir=str(tiny_assets.llama_dir),
        checkpoint_files=["model-00001-of-00001.safetensors"],
        model_type="LLAMA3",
        output_dir=str(tmp_path / "out"),
    )
    state = ckpt.load_checkpoint()["model"]
    assert state["tok_embeddings.weight"].shape == (DIMS.vocab_size, DIMS.dim)
    assert len([k for k in state if k.startswith("layers.")]) > 0


def test_transformers_loads_model_and_tokenizer(tiny_assets: TinyAssets) -> None:
    import tiktoken
    import torch
    from tiktoken.load import load_tiktoken_bpe
    from torchtune.models.llama3._tokenizer import CL100K_PATTERN
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_assets.llama_dir))
    assert model.config.vocab_size == DIMS.vocab_size
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_assets.hf_tokenizer_dir))
    ranks = load_tiktoken_bpe(str(tiny_assets.tokenizer_model))
    assert len(ranks) == N_BPE_RANKS
    enc = tiktoken.Encoding("tiny", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={})
    text = "The red circle number 3 belongs to golf. What is 12 plus 7?"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == enc.encode(text)
    assert hf_tok.convert_tokens_to_ids(SPECIAL_TOKENS[0]) == special_token_ids()[SPECIAL_TOKENS[0]]
    with torch.no_grad():
        out = model(torch.tensor([enc.encode(text)]))
    assert torch.isfinite(out.logits).all()


def test_datasets_have_the_columns_torchtune_expects(tiny_assets: TinyAssets) -> None:
    sharegpt = json.loads(tiny_assets.chat_sharegpt.read_text())
    openai = json.loads(tiny_assets.chat_openai.read_text())
    alpaca = json.loads(tiny_assets.alpaca.read_text())
    assert len(sharegpt) == len(openai) == len(alpaca) == 64
    assert [m["from"] for m in sharegpt[0]["conversations"]] == ["system", "human", "gpt"]
    assert [m["role"] for m in openai[0]["messages"]] == ["system", "user", "assistant"]
    assert set(alpaca[0]) == {"instruction", "input", "output"}


def test_c4_folder_loads_like_allenai_c4(tiny_assets: TinyAssets) -> None:
    from datasets import load_dataset

    train = load_dataset(str(tiny_assets.c4_dir), name="en", split="train", streaming=True)
    first = next(iter(train))
    assert set(first) >= {"text", "timestamp", "url"} and first["text"]
    validation = load_dataset(str(tiny_assets.c4_dir), name="en", split="validation")
    assert len(validation) == 32


def test_flux_assets_load(tiny_assets: TinyAssets) -> None:
    from safetensors import safe_open
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer

    from cookbook.local.assets.tiny_flux import DIMS as FLUX

    t5_tok = T5Tokenizer.from_pretrained(str(tiny_assets.flux_t5_dir))
    clip_tok = CLIPTokenizer.from_pretrained(str(tiny_assets.flux_clip_dir))
    caption = "a red circle on a white background"
    assert t5_tok.unk_token_id not in t5_tok(caption)["input_ids"]
    clip_ids = clip_tok(caption)["input_ids"]
    assert clip_tok.unk_token_id not in clip_ids[1:-1] and len(clip_ids) == 2 + len(caption.split())
    t5 = T5EncoderModel.from_pretrained(str(tiny_assets.flux_t5_dir))
    clip = CLIPTextModel.from_pretrained(str(tiny_assets.flux_clip_dir))
    assert t5.config.d_model == FLUX.t5_dim and clip.config.hidden_size == FLUX.clip_dim
    with safe_open(str(tiny_assets.flux_autoencoder), "pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("encoder.") for k in keys) and any(k.startswith("decoder.") for k in keys)
    shards = sorted(tiny_assets.cc12m_dir.glob("*.tar"))
    assert len(shards) == FLUX.n_shards
    with tarfile.open(shards[0]) as tar:
        names = tar.getnames()
    assert {n.rsplit(".", 1)[1] for n in names} == {"jpg", "txt", "json"}


@pytest.mark.parametrize(
    "prop",
    [
        "llama_dir",
        "tokenizer_model",
        "special_tokens",
        "chat_sharegpt",
        "chat_openai",
        "alpaca",
        "hf_tokenizer_dir",
        "c4_dir",
        "flux_dir",
        "flux_autoencoder",
        "flux_t5_dir",
        "flux_clip_dir",
        "cc12m_dir",
        "flux_prompts",
    ],
)
def test_every_path_exists(tiny_assets: TinyAssets, prop: str) -> None:
    assert getattr(tiny_assets, prop).exists()


@pytest.mark.parametrize("config", ["tiny_full.yaml", "tiny_lora.yaml"])
def test_tiny_torchtune_configs_point_at_the_tiny_assets_layout(config: str) -> None:
    """The local-cpu torchtune configs name the tiny files by path (the engine never imports this bench)."""
    import yaml

    from cookbook.recipes.torchtune import _CONFIGS

    cfg = yaml.safe_load((_CONFIGS / config).read_text())
    t = TinyAssets(Path("${oc.env:TINY_DIR}"))
    assert cfg["tokenizer"]["path"] == str(t.tokenizer_model)
    assert cfg["tokenizer"]["special_tokens_path"] == str(t.special_tokens)
    assert cfg["checkpointer"]["checkpoint_dir"] == str(t.llama_dir)
    sharegpt = cfg["dataset"].get("conversation_style") == "sharegpt"
    assert cfg["dataset"]["data_files"] == str(t.chat_sharegpt if sharegpt else t.alpaca)
