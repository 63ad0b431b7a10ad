"""Tiny FLUX assets for torchtitan 0.3.0's flux trainer, all local.

``ae.safetensors``: a randomly initialised torchtitan ``AutoEncoder`` (its own key layout), small but with
16 latent channels and an 8x downsampling, the two numbers torchtitan's flux code hard-codes
(``models/flux/utils.py``: ``LATENT_CHANNELS, IMAGE_LATENT_SIZE_RATIO = 16, 8``).
``t5/`` and ``clip/``: tiny ``T5EncoderModel`` / ``CLIPTextModel`` + tokenizers, written with
``save_pretrained`` (torchtitan loads both with ``from_pretrained(folder)``; the CLIP folder name must contain
"clip", the T5 one must not). ``cc12m/``: a webdataset of tar shards (``jpg`` + ``txt`` + ``json``), the
layout of torchtitan's ``cc12m-test``.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cookbook.data.titan import add_to_tar
from cookbook.local.assets.tiny_text import caption_vocabulary, captions

AE_FILE = "ae.safetensors"


@dataclass(frozen=True)
class FluxDims:
    """Sizes shared by the assets and the tiny torchtitan flux config (they must agree)."""

    image_size: int = 64  # images are written at this size; use --dataloader.img_size 64
    ae_channels: int = 32  # GroupNorm(32) needs a multiple of 32
    ae_ch_mult: tuple[int, ...] = (1, 1, 2, 2)  # 4 levels = 8x downsampling, as torchtitan assumes
    ae_res_blocks: int = 1
    z_channels: int = 16  # torchtitan's LATENT_CHANNELS
    t5_dim: int = 64  # -> flux context_in_dim
    clip_dim: int = 64  # -> flux vec_in_dim (CLIP pooler_output width)
    max_t5_len: int = 32  # -> tokenizer.max_t5_encoding_len
    n_images: int = 32
    n_shards: int = 2


DIMS = FluxDims()


def autoencoder_config(dims: FluxDims = DIMS):
    """torchtitan's ``AutoEncoder.Config`` for the tiny autoencoder (imports torchtitan)."""
    from cookbook_runtime.titan_import import import_torchtitan_without_triton

    import_torchtitan_without_triton()
    from torchtitan.models.flux.model.autoencoder import AutoEncoder

    return AutoEncoder.Config(
        resolution=dims.image_size,
        in_channels=3,
        ch=dims.ae_channels,
        out_ch=3,
        ch_mult=dims.ae_ch_mult,
        num_res_blocks=dims.ae_res_blocks,
        z_channels=dims.z_channels,
        scale_factor=0.3611,
        shift_factor=0.1159,
    )


def write_autoencoder(path: Path, dims: FluxDims = DIMS, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    config = autoencoder_config(dims)
    torch.manual_seed(seed)
    ae = config.build()
    if hasattr(ae, "init_weights"):
        ae.init_weights()
    state = {k: v.detach().float().contiguous() for k, v in sorted(ae.state_dict().items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt"})


def _t5_vocab() -> list[tuple[str, float]]:
    """SentencePiece-style unigram pieces: whole caption words, then single characters as fallback."""
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"))
    return [
        ("<pad>", 0.0),
        ("</s>", 0.0),
        ("<unk>", 0.0),
        ("\u2581", -2.0),
        *((f"\u2581{w}", -1.0) for w in caption_vocabulary()),
        *((c, -5.0) for c in chars),
        *((f"\u2581{c}", -4.0) for c in chars),
    ]


def write_t5(folder: Path, dims: FluxDims = DIMS, seed: int = 0) -> None:
    import torch
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    tokenizer = T5Tokenizer(vocab=_t5_vocab(), extra_ids=0)
    tokenizer.save_pretrained(str(folder))
    config = T5Config(  # type: ignore[call-arg]  # decoder_start_token_id: a PretrainedConfig kwarg T5Config's signature omits
        vocab_size=len(tokenizer),
        d_model=dims.t5_dim,
        d_kv=16,
        d_ff=2 * dims.t5_dim,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    T5EncoderModel(config).save_pretrained(str(folder))


def _clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP-style BPE: byte-level alphabet (+ ``</w>`` forms), then merges that spell each caption word."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [c + "</w>" for c in alphabet]
    merges: list[tuple[str, str]] = []
    for word in caption_vocabulary():
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            merged = parts[0] + parts[1]
            if merged not in tokens:
                merges.append((parts[0], parts[1]))
                tokens.append(merged)
            parts = [merged] + parts[2:]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, merges


def write_clip(folder: Path, dims: FluxDims = DIMS, seed: int = 0) -> None:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = _clip_vocab_and_merges()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges)  # type: ignore[arg-type]  # transformers 5 takes (a, b) pairs; its hint says str
    tokenizer.save_pretrained(str(folder))
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=dims.clip_dim,
        intermediate_size=2 * dims.clip_dim,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=dims.clip_dim,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(seed)
    CLIPTextModel(config).save_pretrained(str(folder))


_RGB = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (40, 60, 220),
    "yellow": (240, 220, 40),
    "purple": (140, 50, 170),
    "orange": (250, 140, 20),
}


def _image_jpeg(color: str, shape: str, size: int) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    lo, hi = size // 5, size - size // 5
    fill = _RGB[color]
    if shape == "circle":
        draw.ellipse((lo, lo, hi, hi), fill=fill)
    elif shape == "square":
        draw.rectangle((lo, lo, hi, hi), fill=fill)
    elif shape == "triangle":
        draw.polygon([(size // 2, lo), (lo, hi), (hi, hi)], fill=fill)
    else:
        c, r = size // 2, (hi - lo) // 2
        draw.polygon(
            [
                (c, c - r),
                (c + r // 3, c - r // 3),
                (c + r, c),
                (c + r // 3, c + r // 3),
                (c, c + r),
                (c - r // 3, c + r // 3),
                (c - r, c),
                (c - r // 3, c - r // 3),
            ],
            fill=fill,
        )
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_cc12m(folder: Path, dims: FluxDims = DIMS) -> None:
    """Webdataset shards ``{key}.jpg/.txt/.json`` (what ``load_dataset(folder, data_files="*.tar")`` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = captions(dims.n_images)
    per_shard = -(-len(rows) // dims.n_shards)
    for shard in range(dims.n_shards):
        with tarfile.open(folder / f"{shard:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(shard * per_shard, min(len(rows), (shard + 1) * per_shard)):
                text, color, shape = rows[i]
                key = f"{shard:05d}{i:04d}"
                meta = {"key": key, "caption": text, "width": dims.image_size, "height": dims.image_size}
                add_to_tar(tar, f"{key}.jpg", _image_jpeg(color, shape, dims.image_size))
                add_to_tar(tar, f"{key}.txt", text.encode())
                add_to_tar(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())


def write_prompts(path: Path) -> None:
    """A prompts file for torchtitan's flux inference (``--inference.prompts_path``)."""
    path.write_text("\n".join(text for text, _, _ in captions(4, seed=5)) + "\n")


def write_flux(folder: Path, dims: FluxDims = DIMS) -> None:
    write_autoencoder(folder / AE_FILE, dims)
    write_t5(folder / "t5", dims)
    write_clip(folder / "clip", dims)
    write_cc12m(folder / "cc12m", dims)
    write_prompts(folder / "prompts.txt")
