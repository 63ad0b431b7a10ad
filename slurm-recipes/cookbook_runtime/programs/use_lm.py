"""Use a torchtune fine-tune: generations of the base and the fine-tuned model side by side, held-out loss and
perplexity before vs after, and (LoRA) the adapter merged into an HF folder that ``transformers`` loads.

Self-contained (torch, transformers, safetensors, omegaconf, torchtune; PEFT when installed): part of the job
runtime (``cookbook_runtime/programs/use_lm.py``), started by torchrun from the sbatch script of the ``*_use``
recipes (see :mod:`cookbook.recipes.use`); the engine's render checks and the notebooks' local runs import it.
Only global rank 0 works (one process with every GPU of its node, ``device_map="auto"``: a 70B model in bf16 spans
several GPUs); the other ranks exit.

The chat template is the training's own: the run's ``torchtune_config.yaml`` names the tokenizer and the dataset
(its message transform), so prompts and the loss are built exactly as in training. Prompts default to the held-out
rows of that dataset (``--heldout``, a datasets split such as ``train[90%:]``); ``--prompts FILE`` gives one user
message per line (UTF-8). Results: ``OUT/use.json`` (see :func:`run`).

A user error (no checkpoint in the run, an adapter of another model, a prompt file that is not UTF-8) is one line
on stderr, ``use_lm.py: error: ...``, and exit status 2. The same checks (:func:`checkpoint_of`, :func:`config_file`,
:func:`read_prompts`, :func:`check_lora`: cheap, safetensors headers only) run when the ``*_use`` recipes render,
on the login node, so the job meets them only where the login node could not see the files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROG = "use_lm.py"  # the name the *_use recipes write this file under; error lines start with it
RESULT = "use.json"
ADAPTER = "adapter_model.safetensors"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


class UseError(Exception):
    """A problem the user fixes (one line, exit status 2)."""


# ----------------------------------------------------------------------------------------- the run's files
def epoch_dirs(run: Path) -> list[Path]:
    """``epoch_N`` folders of a torchtune run, oldest first (torchtune writes one at the end of each epoch)."""
    found = [p for p in run.glob("epoch_*") if p.is_dir() and re.fullmatch(r"epoch_\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def is_adapter(folder: Path) -> bool:
    return (folder / ADAPTER).is_file() and (folder / "adapter_config.json").is_file()


def has_weights(folder: Path) -> bool:
    return any(p.name.startswith("model") and p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir())


def newest_checkpoint(run: Path) -> Path:
    """The newest ``epoch_N`` of ``run`` holding weights or an adapter; :class:`UseError` when there is none."""
    if not run.is_dir():
        raise UseError(f"{run}: no such run folder (give the training job's run folder, its RUN_DIR)")
    usable = [p for p in epoch_dirs(run) if is_adapter(p) or has_weights(p)]
    if not usable:
        raise UseError(
            f"no checkpoint in {run}: torchtune writes epoch_N/ at the end of each epoch (did the job finish one?)"
        )
    return usable[-1]


def checkpoint_of(run: Path, checkpoint: Path | None = None) -> Path:
    """The checkpoint the job loads (``checkpoint``, else the newest of ``run``) with the files loading it needs: a
    LoRA adapter (PEFT layout), or weights with their ``config.json`` (Hugging Face layout); else :class:`UseError`."""
    ckpt = checkpoint or newest_checkpoint(run)
    if not ckpt.is_dir():
        raise UseError(f"{ckpt}: no such checkpoint folder (give an epoch_N folder of the run, or leave it out)")
    if is_adapter(ckpt):
        return ckpt
    if not has_weights(ckpt):
        raise UseError(
            f"{ckpt}: neither a LoRA adapter ({ADAPTER} + adapter_config.json) nor weights (model*.safetensors)"
        )
    if not (ckpt / "config.json").is_file():
        raise UseError(f"{ckpt}: no config.json beside the weights (torchtune's HF checkpointer writes one)")
    return ckpt


def config_file(run: Path, config: Path | None = None) -> Path:
    """The run's torchtune config file (``config``, else ``torchtune_config.yaml`` of the run); :class:`UseError`
    when it is missing."""
    path = config or run / "torchtune_config.yaml"
    if not path.is_file():
        raise UseError(f"{path}: no training config (torchtune writes torchtune_config.yaml into the run folder)")
    return path


def training_config(run: Path, config: Path | None = None) -> Any:
    """The run's torchtune config (``torchtune_config.yaml``, which torchtune writes into the run folder)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(config_file(run, config))


def read_prompts(path: Path) -> list[str]:
    """One user message per non-empty line of a UTF-8 file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UseError(f"{path}: no such prompt file") from None
    except UnicodeDecodeError as e:
        raise UseError(
            f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): save it as UTF-8"
        ) from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UseError(f"{path}: no prompts (one per line)")
    return prompts


def heldout_split(train_split: str) -> tuple[str, bool]:
    """The held-out split for a training split, and whether its rows were trained on too.

    ``train[:90%]`` -> ``train[90%:]`` (not trained on); a whole split ``train`` -> its last 10% (trained on)."""
    m = re.fullmatch(r"(\w+)\[:(\d+%?)\]", train_split.replace(" ", ""))
    if m:
        return f"{m[1]}[{m[2]}:]", False
    return f"{train_split}[90%:]", True


# ----------------------------------------------------------------------------------------------- LoRA
def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """``{tensor name: shape}`` from a safetensors file's JSON header (8-byte length, then the header): no tensor
    is read, so a 70B shard costs a few kilobytes."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as e:
        raise UseError(f"{path}: not a readable safetensors file ({e})") from None
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _target(lora_a: str) -> str:
    """The base weight a ``lora_A`` tensor adapts (HF name, e.g. ``model.layers.0.self_attn.q_proj.weight``)."""
    return lora_a.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")


def adapter_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """``{base weight name: (out, in)}`` the adapter changes: ``(B.shape[0], A.shape[1])`` of each lora_A/lora_B
    pair, read from the header only."""
    shapes = safetensors_shapes(folder / ADAPTER)
    out: dict[str, tuple[int, ...]] = {}
    for name, a in shapes.items():
        if ".lora_A." not in name:
            continue
        b = shapes.get(name.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise UseError(f"adapter: {name} has no lora_B partner (not a LoRA adapter torchtune or PEFT wrote)")
        out[_target(name)] = (b[0], a[-1])
    if not out:
        raise UseError(f"adapter: no lora_A/lora_B weights in {folder / ADAPTER}")
    return out


def load_adapter(folder: Path) -> tuple[dict[str, Any], float]:
    """The adapter's tensors (PEFT names) and its scale ``lora_alpha / r``."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "adapter_config.json").read_text())
    scale = float(cfg["lora_alpha"]) / float(cfg["r"])
    if cfg.get("use_rslora"):
        scale = float(cfg["lora_alpha"]) / math.sqrt(float(cfg["r"]))
    return load_file(folder / ADAPTER), scale


def lora_pairs(tensors: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """``(base weight name, A, B)`` of each adapted module, one at a time: the caller adds ``scale * B @ A`` to
    that weight, so no full-size delta outlives its module (a 70B model's would take hundreds of GB)."""
    for name, a in tensors.items():
        if ".lora_A." in name:
            b = tensors.get(name.replace(".lora_A.", ".lora_B."))
            if b is None:
                raise UseError(f"adapter: {name} has no lora_B partner (not a LoRA adapter torchtune or PEFT wrote)")
            yield _target(name), a, b


def check_adapter(
    adapter: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]], adapter_dir: Path, base: Path
) -> None:
    """An adapter of another model (a module the base lacks, or another shape) is a :class:`UseError`;
    ``adapter`` is :func:`adapter_shapes`, ``shapes`` the base's weight shapes."""
    for name, shape in adapter.items():
        if name not in shapes:
            raise UseError(f"the adapter in {adapter_dir} is for another model: {base} has no weight {name}")
        if tuple(shape) != tuple(shapes[name]):
            raise UseError(
                f"the adapter in {adapter_dir} is for another model: {name} is {tuple(shapes[name])} in {base}, "
                f"the adapter expects {tuple(shape)}"
            )


def base_shapes(base: Path) -> dict[str, tuple[int, ...]]:
    """Shapes of the base model's weights, read from the safetensors headers (no weights loaded)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in sorted(base.glob("*.safetensors")):
        shapes.update(safetensors_shapes(shard))
    if not shapes:
        raise UseError(f"{base}: no *.safetensors weights (the base model the adapter was trained on)")
    return shapes


def check_lora(adapter_dir: Path, base: Path) -> None:
    """:func:`check_adapter` from the headers of the adapter and of the base's shards (cheap at any size)."""
    check_adapter(adapter_shapes(adapter_dir), base_shapes(base), adapter_dir, base)


def merge_lora(base: Path, adapter_dir: Path, dest: Path) -> Path:
    """The base's HF folder with the adapter merged into its weights, shard by shard and module by module (never
    the whole model, nor every delta, in memory): same file names, config and tokenizer files copied.
    ``transformers`` loads ``dest``."""
    from safetensors.torch import load_file, save_file

    check_lora(adapter_dir, base)
    tensors, scale = load_adapter(adapter_dir)
    pairs = {name: (a, b) for name, a, b in lora_pairs(tensors)}  # the adapter's own tensors, no deltas
    dest.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(item, dest / item.name)
    for shard in sorted(base.glob("*.safetensors")):
        weights = load_file(shard)
        for name in list(weights):
            if name in pairs:
                a, b = pairs[name]
                w = weights[name]
                # float32 for the sum, one module at a time: W + scale * B @ A, rounded once to W's dtype
                weights[name] = w.float().addmm_(b.float(), a.float(), alpha=scale).to(w.dtype)
        save_file(weights, dest / shard.name, metadata={"format": "pt"})
        del weights
    (dest / "MERGED_FROM.json").write_text(json.dumps({"base": str(base), "adapter": str(adapter_dir)}, indent=1))
    return dest


# ---------------------------------------------------------------------------------------------- models
def device_kwargs() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"dtype": torch.bfloat16, "device_map": "auto"}
    return {"dtype": torch.float32}


def load_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    if not (folder / "config.json").is_file():
        raise UseError(f"{folder}: no config.json (not a model folder in Hugging Face layout)")
    model = AutoModelForCausalLM.from_pretrained(folder, **device_kwargs())
    model.eval()
    return model


def apply_adapter(model: Any, adapter_dir: Path, base: Path) -> Any:
    """The base model with the adapter on it: PEFT's ``merge_and_unload`` when PEFT is installed, else the same
    merge done in place (``W += lora_alpha / r * B @ A``)."""
    import torch

    params = dict(model.named_parameters())
    check_adapter(adapter_shapes(adapter_dir), {k: tuple(v.shape) for k, v in params.items()}, adapter_dir, base)
    try:
        from peft import PeftModel  # type: ignore[import-not-found]
    except ImportError:
        tensors, scale = load_adapter(adapter_dir)
        with torch.no_grad():
            for name, a, b in lora_pairs(tensors):  # one module at a time, in the weight's dtype, on its device
                w = params[name]
                w.addmm_(b.to(device=w.device, dtype=w.dtype), a.to(device=w.device, dtype=w.dtype), alpha=scale)
        return model
    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


def stop_ids(tokenizer: Any) -> list[int]:
    ids = list(getattr(tokenizer, "stop_tokens", []) or [])
    return ids or [tokenizer.eos_id]


def generate(model: Any, tokenizer: Any, prompt_tokens: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy completions (deterministic, so base and fine-tuned compare on equal terms)."""
    import torch

    device = next(model.parameters()).device
    stops = stop_ids(tokenizer)
    regular = getattr(tokenizer, "base_vocab_size", None) or min(stops)
    out = []
    for tokens in prompt_tokens:
        ids = torch.tensor([tokens], device=device)
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=stops[0],
            )
        # special and reserved tokens (an untrained model emits those too) are not text; a completion without
        # text says what the model did instead (a blank cell reads as a bug)
        new = gen[0, len(tokens) :].tolist()
        text = tokenizer.decode([t for t in new if t < regular], skip_special_tokens=True).strip()
        if not text:
            text = "(stopped at once)" if new[:1] and new[0] in stops else f"(no visible text; token ids {new[:8]})"
        out.append(text)
    return out


def heldout_loss(model: Any, samples: list[dict[str, Any]]) -> float:
    """Mean cross-entropy per trained-on token (torchtune's labels: -100 where the loss is masked)."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    total, count = 0.0, 0
    for s in samples:
        tokens = torch.tensor([s["tokens"]], device=device)
        labels = torch.tensor(s["labels"][1:], device=device)
        with torch.no_grad():
            logits = model(tokens).logits[0, :-1].float()
        n = int((labels != -100).sum())
        if n:
            total += float(F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
            count += n
    if not count:
        raise UseError("the held-out rows have no trained-on tokens (every label is masked)")
    return total / count


# -------------------------------------------------------------------------------------- prompts and data
def heldout_rows(cfg: Any, tokenizer: Any, split: str) -> Any:
    """The training dataset (its own message transform and the training tokenizer) on the held-out split."""
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    ds_cfg = OmegaConf.to_container(cfg.dataset, resolve=True)
    if isinstance(ds_cfg, list):
        raise UseError("the run trained on several datasets: give --prompts, or --heldout on one of them")
    assert isinstance(ds_cfg, dict)
    ds_cfg.update(split=split, packed=False)
    try:
        return tt_config.instantiate(OmegaConf.create(ds_cfg), tokenizer=tokenizer)
    except ValueError as e:
        raise UseError(f"held-out split {split!r}: {e}") from None


def chat_prompts(ds: Any, rows: int) -> list[tuple[list[Any], str]]:
    """(messages up to the last assistant turn, that turn's text) of the first ``rows`` held-out rows."""
    out = []
    for i in range(min(rows, len(ds))):
        messages = list(ds._message_transform(ds._data[i])["messages"])
        last = max((j for j, m in enumerate(messages) if m.role == "assistant"), default=len(messages))
        reference = messages[last].text_content if last < len(messages) else ""
        out.append((messages[:last], reference))
    return out


def prompt_tokens(tokenizer: Any, messages: list[Any]) -> list[int]:
    """The training's chat template for generation: the messages, then an open assistant turn."""
    from torchtune.data import Message

    tokens, _ = tokenizer.tokenize_messages([*messages, Message("assistant", "")], add_end_tokens=False)
    return list(tokens)


# ------------------------------------------------------------------------------------------------- run
def base_model_dir(cfg: Any, base: Path | None) -> Path:
    """The base model: ``base``, else the folder the training started from (its config's checkpoint_dir)."""
    from omegaconf import OmegaConf

    base_dir = Path(base or OmegaConf.select(cfg, "checkpointer.checkpoint_dir"))
    if not base_dir.is_dir():
        raise UseError(f"{base_dir}: no base model there (the folder the training started from)")
    return base_dir


def chats_of(user_prompts: list[str] | None, ds: Any, rows: int) -> list[tuple[list[Any], str]]:
    """What to generate from: each user prompt as one message, else ``rows`` held-out chats and their replies."""
    from torchtune.data import Message

    if user_prompts:
        return [([Message("user", p)], "") for p in user_prompts]
    return chat_prompts(ds, rows)


def compare_models(
    base_dir: Path, ckpt: Path, lora: bool, tokenizer: Any, tokens: list[list[int]], samples: list[dict[str, Any]],
    max_new_tokens: int,
) -> tuple[list[str], float, list[str], float]:  # fmt: skip
    """The base model's generations and held-out loss, then the fine-tuned one's (the adapter applied to it, or
    the full checkpoint loaded): ``(base texts, base loss, tuned texts, tuned loss)``."""
    model = load_model(base_dir)
    base_text = generate(model, tokenizer, tokens, max_new_tokens)
    base_loss = heldout_loss(model, samples)
    if lora:
        model = apply_adapter(model, ckpt, base_dir)
    else:
        del model
        model = load_model(ckpt)
    return base_text, base_loss, generate(model, tokenizer, tokens, max_new_tokens), heldout_loss(model, samples)


def merged_folder(merge: Path | None, lora: bool, ckpt: Path, base_dir: Path) -> str | None:
    """``--merge``: the adapter merged into a whole HF model there (its path); None without it."""
    if merge is None:
        return None
    if not lora:
        raise UseError(f"{ckpt} is a full fine-tune, already a whole model in HF layout: nothing to merge")
    return str(merge_lora(base_dir, ckpt, Path(merge)))


def heldout_summary(
    split: str, trained_on: bool, split_rows: int, rows: int, base_loss: float, tuned_loss: float
) -> dict[str, Any]:
    """``use.json``'s held-out part: the split, the rows scored, loss and perplexity before and after."""
    return {
        "split": split,
        "trained_on": trained_on,
        "rows": rows,
        "split_rows": split_rows,
        "base_loss": base_loss,
        "tuned_loss": tuned_loss,
        "base_ppl": math.exp(base_loss),
        "tuned_ppl": math.exp(tuned_loss),
    }


def run(
    run_dir: Path,
    out: Path,
    *,
    base: Path | None = None,
    checkpoint: Path | None = None,
    prompts_file: Path | None = None,
    heldout: str | None = None,
    rows: int = 4,
    max_new_tokens: int = 24,
    eval_rows: int = 256,
    merge: Path | None = None,
    config: Path | None = None,
) -> dict[str, Any]:
    """Generate and evaluate with the base and the fine-tuned model; write and return ``OUT/use.json``:
    ``{"base", "checkpoint", "kind" (full|lora), "generations": [{prompt, reference, base, tuned}],
    "heldout": {split, trained_on, rows (scored, at most ``eval_rows``), split_rows, base_loss, tuned_loss,
    base_ppl, tuned_ppl}, "merged"}``."""
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    user_prompts = read_prompts(prompts_file) if prompts_file else None  # a bad file stops before any model loads
    run_dir = Path(run_dir)
    ckpt = checkpoint_of(run_dir, Path(checkpoint) if checkpoint else None)
    cfg = training_config(run_dir, config)
    base_dir = base_model_dir(cfg, base)
    lora = is_adapter(ckpt)
    if lora:  # fail fast on an adapter of another model, before loading anything (headers only)
        check_lora(ckpt, base_dir)
    tokenizer = tt_config.instantiate(cfg.tokenizer)
    split, trained_on = heldout_split(heldout or str(OmegaConf.select(cfg, "dataset.split", default="train")))
    if heldout:
        trained_on = False
    ds = heldout_rows(cfg, tokenizer, split)
    samples = [ds[i] for i in range(min(len(ds), eval_rows))]  # a 70B forward per row: a capped sample
    chats = chats_of(user_prompts, ds, rows)
    tokens = [prompt_tokens(tokenizer, msgs) for msgs, _ in chats]
    base_text, base_loss, tuned_text, tuned_loss = compare_models(
        base_dir, ckpt, lora, tokenizer, tokens, samples, max_new_tokens
    )
    result = {
        "run": str(run_dir),
        "base": str(base_dir),
        "checkpoint": str(ckpt),
        "kind": "lora" if lora else "full",
        "generations": [
            {"prompt": msgs[-1].text_content if msgs else "", "reference": ref, "base": b, "tuned": t}
            for (msgs, ref), b, t in zip(chats, base_text, tuned_text)
        ],
        "heldout": heldout_summary(split, trained_on, len(ds), len(samples), base_loss, tuned_loss),
        "merged": merged_folder(merge, lora, ckpt, base_dir),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT).write_text(json.dumps(result, indent=1))
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--trained", required=True, help="the training run folder (torchtune_config.yaml, epoch_N/)")
    p.add_argument("--out", required=True, help="where use.json (and --merge's default) go")
    p.add_argument("--base", default=None, help="the base model (default: the training config's checkpoint_dir)")
    p.add_argument("--checkpoint", default=None, help="an epoch_N folder (default: the newest)")
    p.add_argument("--config", default=None, help="the training config (default: RUN/torchtune_config.yaml)")
    p.add_argument("--prompts", default=None, help="UTF-8 file, one user message per line (default: held-out rows)")
    p.add_argument("--heldout", default=None, help="held-out split, e.g. train[90%%:] (default: after training's)")
    p.add_argument("--rows", type=int, default=4, help="held-out rows to prompt with")
    p.add_argument("--max_new_tokens", type=int, default=24)
    p.add_argument("--eval_rows", type=int, default=256, help="held-out rows the loss is computed on (the first N)")
    p.add_argument("--merge", default=None, help="LoRA: write the merged model in HF layout here")
    return p


def print_result(result: dict[str, Any]) -> None:
    h = result["heldout"]
    print(f"checkpoint {result['checkpoint']} ({result['kind']}), base {result['base']}")
    print(
        f"held-out {h['split']} ({h['rows']} rows{', also trained on' if h['trained_on'] else ''}): "
        f"loss {h['base_loss']:.4f} -> {h['tuned_loss']:.4f}, perplexity {h['base_ppl']:.2f} -> {h['tuned_ppl']:.2f}"
    )
    for g in result["generations"]:
        print(f"prompt: {g['prompt']!r}\n  base:  {g['base']!r}\n  tuned: {g['tuned']!r}")
    if result["merged"]:
        print(f"merged model: {result['merged']}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # one process does the work, with every GPU of its node
    try:
        result = run(
            Path(args.trained),
            Path(args.out),
            base=Path(args.base) if args.base else None,
            checkpoint=Path(args.checkpoint) if args.checkpoint else None,
            prompts_file=Path(args.prompts) if args.prompts else None,
            heldout=args.heldout,
            rows=args.rows,
            max_new_tokens=args.max_new_tokens,
            eval_rows=args.eval_rows,
            merge=Path(args.merge) if args.merge else None,
            config=Path(args.config) if args.config else None,
        )
    except UseError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)  # argparse's form: `cookbook diagnose` names the line
        return 2
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
