"""Deterministic tiny assets for local-cpu runs (no hub needed), built in seconds and cached.

Layout under ``root`` (default ``cache_dir()/"tiny"``); the property names are the contract the recipe
engine's ``local-cpu`` variants use. ``ensure_tiny_assets`` builds into a temporary sibling folder and
renames it into place, so a reader never sees a half-written tree; a ``VERSION`` marker holding
:data:`ASSETS_VERSION` tells a complete, current build from a stale one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cookbook.paths import cache_dir


def _source_version() -> str:
    """A digest of the code that writes the assets: any change to it rebuilds cached copies."""
    import hashlib

    here = Path(__file__).parent
    sources = ("tiny.py", "tiny_llama.py", "tiny_text.py", "tiny_flux.py", "../../data/titan.py")
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in sources))
    return f"tiny-assets-{digest.hexdigest()[:12]}"


ASSETS_VERSION = _source_version()
MARKER = "VERSION"


class _Under:
    """A path under :attr:`TinyAssets.root`."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, assets: TinyAssets, owner: type) -> Path:
        return assets.root.joinpath(*self.parts)


@dataclass(frozen=True)
class TinyAssets:
    root: Path

    llama_dir = _Under("llama3")  # HF layout: config.json, *.safetensors, index, original_repo_id.json
    tokenizer_model = _Under("llama3", "original", "tokenizer.model")  # tiktoken BPE file, as in meta-llama repos
    # a full HF tokenizer.json: torchtune reads its "added_tokens" (special_tokens_path)
    special_tokens = _Under("llama3", "tokenizer.json")
    chat_sharegpt = _Under("data", "chat_sharegpt.json")
    chat_openai = _Under("data", "chat_openai.json")
    alpaca = _Under("data", "alpaca.json")
    hf_tokenizer_dir = _Under("hf_tokenizer")  # a full HF tokenizer (tokenizer.json + config) for torchtitan
    c4_dir = _Under("c4")  # C4-like local dataset folder (README.md with `en` config + en/*.json.gz)
    flux_dir = _Under("flux")  # ae.safetensors, t5/, clip/ (save_pretrained), cc12m/ (webdataset tars)
    flux_autoencoder = _Under("flux", "ae.safetensors")  # --encoder.autoencoder_path
    flux_t5_dir = _Under("flux", "t5")  # --encoder.t5_encoder and --tokenizer.t5_tokenizer_path
    flux_clip_dir = _Under("flux", "clip")  # --encoder.clip_encoder and --tokenizer.clip_tokenizer_path
    cc12m_dir = _Under("flux", "cc12m")  # --dataloader.dataset cc12m-test --dataloader.dataset_path DIR
    flux_prompts = _Under("flux", "prompts.txt")  # --inference.prompts_path
    marker = _Under(MARKER)

    def is_current(self) -> bool:
        """True when a complete build of this :data:`ASSETS_VERSION` is in place."""
        try:
            return self.marker.read_text().strip() == ASSETS_VERSION
        except OSError:
            return False


class TinyRootTaken(ValueError):
    """The root given for the tiny assets holds files the cookbook did not write there (no ``VERSION`` marker):
    building would replace, and so delete, them."""


def default_root() -> Path:
    return cache_dir() / "tiny"


def build_tiny_assets(root: Path) -> TinyAssets:
    """Write every asset under ``root`` (which should be empty). Deterministic: same bytes every time."""
    from cookbook.local.assets import tiny_flux, tiny_llama, tiny_text

    assets = TinyAssets(root)
    pairs = tiny_text.chat_rows()
    tiny_text.write_json(assets.chat_sharegpt, tiny_text.sharegpt_records(pairs))
    tiny_text.write_json(assets.chat_openai, tiny_text.openai_records(pairs))
    tiny_text.write_json(assets.alpaca, tiny_text.alpaca_records())
    tiny_text.write_c4(assets.c4_dir)
    ranks = tiny_llama.write_llama(assets.llama_dir, tiny_text.training_text())
    tiny_llama.write_tokenizer_files(assets.hf_tokenizer_dir, ranks)
    tiny_flux.write_flux(assets.flux_dir)
    assets.marker.write_text(ASSETS_VERSION + "\n")
    return assets


def _check_ours(root: Path, given: Path) -> None:
    """Refuse (:class:`TinyRootTaken`, naming ``given``: ``root`` as the caller wrote it) a ``root`` that is a
    file, or a folder that is not empty and has no ``VERSION`` marker: only a tree a build wrote (of this
    layout or an older one) or an empty folder may be replaced."""
    if not root.exists() or (root / MARKER).is_file():
        return
    if not root.is_dir():
        raise TinyRootTaken(f"{given}: is a file, not a folder; give a new or empty folder")
    names = sorted(p.name for p in root.iterdir())
    if names:
        raise TinyRootTaken(
            f"{given}: holds files the cookbook did not write ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            f"; no {MARKER} file of a tiny build) and a build replaces the whole folder; give a new or empty folder"
        )


def ensure_tiny_assets(root: Path | None = None, *, force: bool = False) -> TinyAssets:
    """Build the tiny assets if missing or stale (``force``: in any case; cached, deterministic) and return their
    paths. A ``root`` holding anything but a tiny build (or nothing) is refused with :class:`TinyRootTaken`: a
    rebuild replaces the whole folder.

    Safe against concurrent callers: each builds in its own temporary folder and renames it into place;
    a caller that loses the race discards its copy and uses the winner's.
    """
    given = Path(root) if root is not None else default_root()
    assets = TinyAssets(given.absolute())
    if assets.is_current() and not force:
        return assets
    _check_ours(assets.root, given)
    parent = assets.root.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{assets.root.name}.building-", dir=parent))
    try:
        build_tiny_assets(tmp)
        if assets.is_current() and not force:  # someone else finished first
            return assets
        if assets.root.exists():  # a stale build or an empty folder: move it aside, then swap the new tree in
            _check_ours(assets.root, given)
            old = Path(tempfile.mkdtemp(prefix=f".{assets.root.name}.old-", dir=parent))
            os.replace(assets.root, old / "tree")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, assets.root)
        except OSError:
            if not assets.is_current():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return assets
