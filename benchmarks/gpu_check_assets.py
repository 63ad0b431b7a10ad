"""The GPU check's inputs (#31), made locally with random weights in each framework's own format: no hub.

    python benchmarks/gpu_check_assets.py tune OUT DIMS_JSON SEQ_LENS N_RECORDS  # torchtune: HF Llama folder + data
    python benchmarks/gpu_check_assets.py flux OUT CONFIG DIMS_JSON              # torchtitan FLUX: AE, T5, CLIP, images

``tune``: a Hugging Face Llama folder (``config.json`` from ``cookbook.local.assets.tiny_llama.hf_config``, one
``model-00001-of-00001.safetensors``) whose tensor names and shapes come from torchtune's own ``llama3_1`` builder
(on the meta device) through its ``tune_to_hf`` converter, filled with random bf16 (made on the GPU when there is
one): what ``FullModelHFCheckpointer`` loads. Any width: the real 70B width with a few layers, or the tiny one. Also
``alpaca_SEQ.json`` for each SEQ of SEQ_LENS (comma-separated): Alpaca records whose outputs are longer than SEQ
tokens of the tiny tokenizer (the real width reuses it), so every unpacked sample is a full SEQ and every pack full.

``flux``: the autoencoder of the given torchtitan config function (``gpu_check_titan.flux``: FLUX.1's own; CPU mode
``flux_tiny``), random, in torchtitan's key layout; T5 and CLIP text encoders of the widths FLUX reads (4096 and
768 for FLUX.1; one layer each) and cc12m-style image shards, written by ``cookbook.local.assets.tiny_flux``.
Each prints ``gpu_check: assets {...}`` with the parameter counts (the planner's FLUX shape takes the encoders').
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SHARD = "model-00001-of-00001.safetensors"


def _say(value: dict[str, Any]) -> None:
    print(f"gpu_check: assets {json.dumps(value)}", flush=True)


def write_llama(folder: Path, dims: Any) -> int:
    """Random bf16 weights of torchtune's ``llama3_1(dims)`` in HF layout; returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from torchtune.models.convert_weights import tune_to_hf

    from cookbook.local.assets.tiny_llama import hf_config, torchtune_model

    with torch.device("meta"):
        model = torchtune_model(dims)
        meta = tune_to_hf(model.state_dict(), num_heads=dims.n_heads, num_kv_heads=dims.n_kv_heads, dim=dims.dim)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    state = {}
    for name, value in sorted(meta.items()):
        if value.dim() == 2:  # small init: the loss starts near ln(vocab)
            t = torch.randn(value.shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(0.02)
        else:
            t = torch.ones(value.shape, device=device, dtype=torch.bfloat16)
        state[name] = t.cpu().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / SHARD), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(state, SHARD)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (folder / "config.json").write_text(json.dumps(hf_config(dims), indent=2) + "\n")
    return sum(v.numel() for v in state.values())


def write_alpaca(path: Path, seq_len: int, records: int) -> None:
    """``records`` Alpaca rows, each output ~4 characters per wanted token of the tiny training text (>= 1.5 x
    ``seq_len`` tokens with the tiny BPE), cut at different places so packs differ."""
    from cookbook.local.assets.tiny_text import training_text

    text = training_text()
    size = 4 * seq_len
    while len(text) < 2 * size:
        text += " " + text
    rows = []
    for i in range(records):
        start = (i * 997) % (len(text) - size)
        rows.append({"instruction": f"Continue text {i}.", "input": "", "output": text[start : start + size]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))


def tune(out: Path, dims_json: str, seq_lens: list[int], records: int) -> None:
    from cookbook.local.assets.tiny_llama import LlamaDims

    dims = LlamaDims(**json.loads(dims_json))
    params = write_llama(out / "llama", dims)
    for seq_len in seq_lens:
        write_alpaca(out / f"alpaca_{seq_len}.json", seq_len, records)
    _say({"llama_params": params, "alpaca_records": records, "seq_lens": seq_lens})


def _count(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def flux(out: Path, config: str, dims_json: str) -> None:
    import torch

    if not torch.cuda.is_available():  # CPU mode: torchtitan imports under the local bench's shims
        from cookbook.local.compat.cpu import apply_shims

        apply_shims("torchtitan")
    import gpu_check_titan
    from safetensors.torch import save_file
    from transformers import CLIPTextModel, T5EncoderModel

    from cookbook.local.assets import tiny_flux

    dims = tiny_flux.FluxDims(**json.loads(dims_json))
    cfg = getattr(gpu_check_titan, config)()
    torch.manual_seed(0)
    ae = cfg.model_spec.model.autoencoder.build()
    if hasattr(ae, "init_weights"):
        ae.init_weights()
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().float().contiguous() for k, v in sorted(ae.state_dict().items())}, str(out / "ae.safetensors")
    )
    tiny_flux.write_t5(out / "t5", dims)
    tiny_flux.write_clip(out / "clip", dims)
    tiny_flux.write_cc12m(out / "cc12m", dims)
    counts = {
        "autoencoder_params": _count(ae),
        "text_encoder_params": _count(T5EncoderModel.from_pretrained(str(out / "t5"))),
        "clip_params": _count(CLIPTextModel.from_pretrained(str(out / "clip"))),
    }
    _say({**counts, "images": dims.n_images, "image_size": dims.image_size})


def main(argv: list[str]) -> int:
    what, out = argv[0], Path(argv[1])
    if what == "tune":
        tune(out, argv[2], [int(n) for n in argv[3].split(",")], int(argv[4]))
    elif what == "flux":
        flux(out, argv[2], argv[3])
    else:
        print(f"unknown asset kind {what!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
