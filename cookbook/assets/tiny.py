"""Deterministic tiny assets for local-cpu runs (no hub needed). INTERFACE STUB: see DESIGN.md.

Layout under ``root`` (default ``cache_dir()/"tiny"``); the field names are the contract the
recipe engine's ``local-cpu`` variants use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cookbook.paths import cache_dir


@dataclass(frozen=True)
class TinyAssets:
    root: Path

    @property
    def llama_dir(self) -> Path:            # HF layout: config.json, *.safetensors, index, original_repo_id.json
        return self.root / "llama3"

    @property
    def tokenizer_model(self) -> Path:      # tiktoken BPE file, as in meta-llama repos
        return self.llama_dir / "original" / "tokenizer.model"

    @property
    def special_tokens(self) -> Path:       # JSON with "added_tokens" (torchtune special_tokens_path)
        return self.llama_dir / "tokenizer.json"

    @property
    def chat_sharegpt(self) -> Path:
        return self.root / "data" / "chat_sharegpt.json"

    @property
    def chat_openai(self) -> Path:
        return self.root / "data" / "chat_openai.json"

    @property
    def alpaca(self) -> Path:
        return self.root / "data" / "alpaca.json"

    @property
    def hf_tokenizer_dir(self) -> Path:     # a full HF tokenizer (tokenizer.json + config) for torchtitan
        return self.root / "hf_tokenizer"

    @property
    def c4_dir(self) -> Path:               # C4-like local dataset folder (README.md with `en` config + en/*.json.gz)
        return self.root / "c4"

    @property
    def flux_dir(self) -> Path:             # ae.safetensors, t5/, clip/ (save_pretrained), cc12m/ (webdataset tars)
        return self.root / "flux"


def ensure_tiny_assets(root: Path | None = None) -> TinyAssets:
    """Build the tiny assets if missing (cached, deterministic) and return their paths."""
    raise NotImplementedError("cookbook.assets.tiny is being written")
