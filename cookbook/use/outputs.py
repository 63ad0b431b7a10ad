"""Where a run's weights are, their format and size, and how to serve them (``cookbook outputs RUN``).

A run is the folder ``submit`` made (with ``job.json``) or the run folder itself (``RUN_DIR``). Three kinds:
- torchtune full fine-tune: ``epoch_N/`` in Hugging Face layout (safetensors + config + tokenizer);
- torchtune LoRA: ``epoch_N/adapter_model.safetensors`` + ``adapter_config.json`` (PEFT layout) on the base model
  the training config names;
- torchtitan / FSDP: ``checkpoint/step-N/`` (torch.distributed.checkpoint, sharded), converted with
  ``python -m torch.distributed.checkpoint.format_utils dcp_to_torch_save SRC DST``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADAPTER = "adapter_model.safetensors"


class NoOutputs(ValueError):
    """The folder holds no weights a user could take away (the message says what was looked for)."""


@dataclass
class Outputs:
    """A run's newest weights: ``kind`` (full | lora | dcp), where, format, size, how to load and serve them."""

    run_dir: Path
    kind: str
    weights: Path
    format: str
    size_bytes: int
    base: str | None = None  # LoRA: the base model the adapter applies to
    adapter_rank: int | None = None
    serve: dict[str, str] = field(default_factory=dict)  # {server: command or code line}
    others: list[Path] = field(default_factory=list)  # older checkpoints

    def __str__(self) -> str:
        return self.render()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.render())

    def render(self) -> str:
        lines = [
            f"run:     {self.run_dir}",
            f"weights: {self.weights}",
            f"format:  {self.format}",
            f"size:    {human(self.size_bytes)}" + (" (the adapter only)" if self.kind == "lora" else ""),
        ]
        if self.base:
            lines.append(f"base:    {self.base}" + (f" (LoRA rank {self.adapter_rank})" if self.adapter_rank else ""))
        if self.others:
            lines.append(f"older:   {', '.join(p.name for p in self.others)}")
        lines.append("use it:")
        lines += [f"  {name:13} {text}" for name, text in self.serve.items()]
        return "\n".join(lines)


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_folder(target: str | os.PathLike[str]) -> Path:
    """The run folder of ``target``: a ``submit`` folder (its ``job.json`` names the run folder) or a run folder."""
    p = Path(target)
    if p.name == "job.json":
        p = p.parent
    if (p / "job.json").is_file():
        from cookbook.slurm.record import JobRecord

        return Path(JobRecord.load(p).run_dir)
    if not p.is_dir():
        raise NoOutputs(f"{p}: no such folder (give the run folder, or the folder `submit` made with job.json)")
    return p


def _numbered(folder: Path, pattern: str) -> list[Path]:
    found = [p for p in folder.glob("*") if p.is_dir() and re.fullmatch(pattern, p.name)]
    return sorted(found, key=lambda p: int(re.sub(r"\D", "", p.name) or 0))


def _base_of(run: Path) -> str | None:
    """The base model of a torchtune run: its config's ``checkpointer.checkpoint_dir`` (``${oc.env:X}`` resolved
    from this environment when set, else left as written)."""
    cfg = run / "torchtune_config.yaml"
    if not cfg.is_file():
        return None
    m = re.search(r"^checkpointer:\n(?:[ \t].*\n)*?[ \t]+checkpoint_dir:\s*(\S+)", cfg.read_text(), re.M)
    if not m:
        return None
    return re.sub(
        r"\$\{oc\.env:(\w+)\}", lambda v: os.environ.get(v[1]) or _script_value(run, v[1]) or v[0], m[1].strip("'\"")
    )


def _script_value(run: Path, name: str) -> str | None:
    """The default the job's script gives variable ``name`` (``NAME=${NAME:-value}``), for a run folder inside the
    folder ``submit`` made (``<job folder>/runs/<name>``); ``$RECIPE_DIR`` is the script's folder."""
    for script in sorted(run.parent.parent.glob("*.sbatch")):
        m = re.search(rf"^{name}=\$\{{{name}:-(.+)\}}$", script.read_text(), re.M)
        if m:
            value = m[1].replace('"', "").replace("${RECIPE_DIR}", "$RECIPE_DIR")
            value = value.replace("$RECIPE_DIR", str(script.parent))
            return None if "$" in value else value
    return None


def _tp(size: int) -> int:
    """A tensor-parallel degree for serving: 1 below 40 GB of weights, else the GPUs of a node."""
    return 1 if size < 40e9 else 8


def describe(target: str | os.PathLike[str]) -> Outputs:
    """The newest weights of the run ``target`` points at; :class:`NoOutputs` when it has none."""
    run = run_folder(target)
    epochs = [p for p in _numbered(run, r"epoch_\d+") if any(p.iterdir())]
    steps = _dcp_steps(run)
    if epochs:
        ckpt = epochs[-1]
        if (ckpt / ADAPTER).is_file():
            return _lora_outputs(run, ckpt, epochs[:-1])
        return _full_outputs(run, ckpt, epochs[:-1])
    if steps:
        return _dcp_outputs(run, steps[-1], steps[:-1])
    raise NoOutputs(
        f"no weights in {run}: looked for epoch_N/ (torchtune) and checkpoint/step-N/ with .metadata "
        "(torchtitan, FSDP); did the job save a checkpoint?"
    )


def _dcp_steps(run: Path) -> list[Path]:
    """The run's finished DCP saves: ``checkpoint/step-N`` (torchtitan), then ``checkpoints/step-N`` (FSDP)."""
    return [p for p in _numbered(run / "checkpoint", r"step-\d+") if (p / ".metadata").is_file()] + [
        p for p in _numbered(run / "checkpoints", r"step-\d+") if (p / ".metadata").is_file()
    ]


def _lora_outputs(run: Path, ckpt: Path, others: list[Path]) -> Outputs:
    """A torchtune LoRA epoch: the adapter, served on top of its base model."""
    q = shlex.quote(str(ckpt))
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    base = _base_of(run) or "BASE_MODEL_DIR"
    b = shlex.quote(base)
    size = (ckpt / ADAPTER).stat().st_size
    tp = _tp(folder_size(Path(base)) if Path(base).is_dir() else 10**12)  # unknown base: a node's GPUs
    return Outputs(
        run,
        "lora",
        ckpt,
        "LoRA adapter, PEFT layout (adapter_model.safetensors + adapter_config.json; torchtune's "
        "adapter_model.pt beside it)",
        size,
        base=base,
        adapter_rank=int(cfg.get("r", 0)) or None,
        serve={
            "vLLM": f"vllm serve {b} --enable-lora --lora-modules tuned={q} --max-lora-rank "
            f"{max(int(cfg.get('r', 8)), 8)} --tensor-parallel-size {tp}",
            "TGI": f"text-generation-launcher --model-id {b} --lora-adapters tuned={q}",
            "transformers": f"PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}, "
            f"torch_dtype='auto', device_map='auto'), {str(ckpt)!r})",
            "merge": "cookbook_runtime.programs.use_lm.merge_lora(base, adapter, dest) or the *_lora_use job "
            "with --set merge=$RUN_DIR/merged: one HF folder, served like a full fine-tune",
            # the base with the adapter on it (PEFT installed), or the merged folder as pretrained=
            "lm-eval": f"lm_eval --model hf --model_args pretrained={b},peft={q},dtype=bfloat16,"
            "parallelize=True --tasks hellaswag,mmlu (where the cluster reaches the Hub)",
        },
        others=others,
    )


def _full_outputs(run: Path, ckpt: Path, others: list[Path]) -> Outputs:
    """A torchtune full fine-tune epoch: a Hugging Face folder, served as it is."""
    q = shlex.quote(str(ckpt))
    size = sum(p.stat().st_size for p in ckpt.iterdir() if p.is_file() and p.name.endswith(".safetensors"))
    return Outputs(
        run,
        "full",
        ckpt,
        "Hugging Face layout (safetensors shards + model.safetensors.index.json, config.json, tokenizer)",
        size,
        base=_base_of(run),
        serve={
            "vLLM": f"vllm serve {q} --tensor-parallel-size {_tp(size)}",
            "TGI": f"text-generation-launcher --model-id {q} --num-shard {_tp(size)}",
            "transformers": f"AutoModelForCausalLM.from_pretrained({str(ckpt)!r}, torch_dtype='auto', "
            "device_map='auto')",
            "lm-eval": f"lm_eval --model hf --model_args pretrained={q},dtype=bfloat16,parallelize=True "
            "--tasks hellaswag,mmlu (where the cluster reaches the Hub)",
        },
        others=others,
    )


def _dcp_outputs(run: Path, ckpt: Path, others: list[Path]) -> Outputs:
    """A DCP save (torchtitan, FSDP): converted to one file, or loaded by torchtitan."""
    q = shlex.quote(str(ckpt))
    return Outputs(
        run,
        "dcp",
        ckpt,
        "torch.distributed.checkpoint (DCP), sharded across the ranks that saved it",
        folder_size(ckpt),
        serve={
            "one file": "python -m torch.distributed.checkpoint.format_utils dcp_to_torch_save "
            f"{q} {shlex.quote(str(run / (ckpt.name + '.pt')))}",
            "torchtitan": f"--checkpoint.initial_load_path {q} (continue training or sample from it)",
            "FLUX images": "the flux_schnell_use job (torchtitan's FLUX sampling) on this run",
        },
        others=others,
    )
