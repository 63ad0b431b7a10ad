"""Pre-train a Llama / Mistral / Mixtral shape with plain PyTorch FSDP2 (``fully_shard``), under torchrun.

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 \\
        fsdp_train.py --model=llama3_1_8b --dataset=allenai/c4 --dataset_config=en \\
                 --checkpoint_dir=./checkpoints --max_steps=100

This file is self-contained (torch, transformers, datasets; and the cookbook's stop protocol,
``cookbook_runtime.rank``, on PYTHONPATH): it is part of the job runtime, ``cookbook_runtime/programs/``. Compared with
the AWS FSDP test case it follows, it fixes three known flaws:

- data: every rank reads a disjoint part of the stream (whole files per rank when there are enough,
  else every world_size-th document) and shuffles it with its own seed derived from (seed, rank, epoch);
- ``--max_steps`` ends training (the data stream cycles over epochs; the step counter is the only stop);
- the tokenizer defaults to the model's own, and one with more tokens than the model's vocabulary
  (or far fewer, i.e. another model family's) is refused with a clear message.

Checkpoints are torch.distributed.checkpoint (DCP) folders ``CHECKPOINT_DIR/step-N/`` written under a
temporary name, completed by a ``COMPLETE`` marker written last, then renamed. A restart resumes from
the newest complete one: model, optimizer, lr schedule, step and each rank's data position, so the
log continues at step N+1 with no step lost or repeated. On a stop request (Slurm's USR1/TERM, see
``cookbook_runtime.rank``) every rank saves such a checkpoint at the next step boundary and exits 0, and
the job requeues: a preemption loses at most the step in flight.

Log lines (rank 0; the format ``cookbook.metrics`` parses):
    Batch 12 Loss: 5.43210, Speed: 14.50 samples/sec, lr: 0.000100, tokens_per_second_per_gpu: 3712.0, mfu: 38.12%
``Batch N`` counts optimizer steps from 1; ``Speed`` is global samples/s; ``mfu`` is N/A on CPU or an
unknown GPU (set ``--peak_tflops``).

Tracking (``--tracker tensorboard|wandb|mlflow``): rank 0 logs loss, lr and throughput per logged step to the
tracker run the sbatch script names in ``COOKBOOK_RUN_NAME`` (W&B: ``WANDB_RUN_ID`` with resume "allow";
MLflow: the run ``MLFLOW_RUN_ID`` names; TensorBoard: ``--tracker_dir``, default ``$COOKBOOK_TB_DIR``), so a
restart continues the same run. Keys and credentials are the trackers' own environment, never flags.

Profiling (``--profile_steps=N``): the PyTorch profiler traces steps ``--profile_start_step`` ..
``+N-1`` after ``--profile_warmup`` warm-up steps, once, on every rank, and writes
``PROFILE_DIR/iteration_<last traced step>/rank<R>_trace.json.gz`` (torchtitan's layout).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import json
import logging
import math
import os
import random
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger("fsdp_train")


# --------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class ModelShape:
    """One model from the shape table (the AWS FSDP guide's table, checked against the HF configs)."""

    family: str  # llama | mistral | mixtral (the transformers config class)
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    max_context: int  # default --seq_len
    vocab: int
    rope_theta: float
    tokenizer: str | None  # the model's own tokenizer (hub id); None: --tokenizer is required
    tie_embeddings: bool = False
    experts: int = 0  # MoE: experts per layer, and experts each token uses
    experts_per_token: int = 0
    llama3_rope: bool = False  # Llama 3.1/3.2 rope scaling (factor 8; 3.2: 32)
    rope_factor: float = 8.0
    strict_vocab: bool = True  # refuse a tokenizer with far fewer tokens than the vocabulary


SHAPES: dict[str, ModelShape] = {
    "llama2_7b": ModelShape("llama", 4096, 11008, 32, 32, 32, 4096, 32000, 1e4, "meta-llama/Llama-2-7b-hf"),
    "llama2_13b": ModelShape("llama", 5120, 13824, 40, 40, 40, 4096, 32000, 1e4, "meta-llama/Llama-2-13b-hf"),
    "llama2_70b": ModelShape("llama", 8192, 28672, 80, 64, 8, 4096, 32000, 1e4, "meta-llama/Llama-2-70b-hf"),
    "llama3_1_8b": ModelShape(
        "llama", 4096, 14336, 32, 32, 8, 8192, 128256, 5e5, "meta-llama/Llama-3.1-8B", llama3_rope=True
    ),
    "llama3_1_70b": ModelShape(
        "llama", 8192, 28672, 80, 64, 8, 8192, 128256, 5e5, "meta-llama/Llama-3.1-70B", llama3_rope=True
    ),
    "llama3_2_1b": ModelShape(
        "llama",
        2048,
        8192,
        16,
        32,
        8,
        8192,
        128256,
        5e5,
        "meta-llama/Llama-3.2-1B",
        tie_embeddings=True,
        llama3_rope=True,
        rope_factor=32.0,
    ),
    # The AWS table says intermediate 11008 for 3.2 3B; the released config (and Meta's) is 8192.
    "llama3_2_3b": ModelShape(
        "llama",
        3072,
        8192,
        28,
        24,
        8,
        8192,
        128256,
        5e5,
        "meta-llama/Llama-3.2-3B",
        tie_embeddings=True,
        llama3_rope=True,
        rope_factor=32.0,
    ),
    "mistral_7b": ModelShape("mistral", 4096, 14336, 32, 32, 8, 8192, 32000, 1e4, "mistralai/Mistral-7B-v0.1"),
    "mathstral_7b": ModelShape("mistral", 4096, 14336, 32, 32, 8, 32768, 32768, 1e6, "mistralai/Mathstral-7B-v0.1"),
    "mixtral_8x7b": ModelShape(
        "mixtral",
        4096,
        14336,
        32,
        32,
        8,
        32768,
        32000,
        1e6,
        "mistralai/Mixtral-8x7B-v0.1",
        experts=8,
        experts_per_token=2,
    ),
    # Local runs on CPU: a Llama-3 architecture small enough for two CPU ranks.
    "tiny": ModelShape("llama", 64, 128, 2, 4, 2, 128, 512, 5e5, None, strict_vocab=False),
    "tiny_moe": ModelShape(
        "mixtral", 64, 96, 2, 4, 2, 128, 512, 1e6, None, experts=4, experts_per_token=2, strict_vocab=False
    ),
}


def model_config(shape: ModelShape, seq_len: int) -> PretrainedConfig:
    """The transformers config for a shape (no download: everything comes from the table)."""
    from transformers import LlamaConfig, MistralConfig, MixtralConfig

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    if shape.llama3_rope:
        rope.update(
            rope_type="llama3",
            factor=shape.rope_factor,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        )
    moe = dict(num_local_experts=shape.experts, num_experts_per_tok=shape.experts_per_token, output_router_logits=False)
    families: dict[str, tuple[Any, dict[str, Any]]] = {
        "llama": (LlamaConfig, {}),
        "mistral": (MistralConfig, {"sliding_window": None}),
        "mixtral": (MixtralConfig, {"sliding_window": None, **moe}),
    }
    config_class, family = families[shape.family]
    cfg: PretrainedConfig = config_class(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(131072 if shape.llama3_rope else shape.max_context, seq_len),
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=shape.tie_embeddings,
        use_cache=False,
        rope_parameters=rope,
        **family,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


# --------------------------------------------------------------------------------------------- tokenizer


def check_tokenizer(n_tokens: int, shape: ModelShape, name: str, tokenizer_path: str) -> None:
    """Refuse a tokenizer that does not belong to the model (SystemExit with what to do)."""
    if n_tokens > shape.vocab:
        raise SystemExit(
            f"tokenizer {tokenizer_path} has {n_tokens} tokens but model {name} has a vocabulary "
            f"of {shape.vocab}: token ids would fall outside the embedding table. Use the model's "
            f"own tokenizer ({shape.tokenizer or 'one with at most ' + str(shape.vocab) + ' tokens'})."
        )
    if shape.strict_vocab and n_tokens < 0.9 * shape.vocab:
        raise SystemExit(
            f"tokenizer {tokenizer_path} has {n_tokens} tokens but model {name} has a vocabulary "
            f"of {shape.vocab}: this is another model family's tokenizer (e.g. Llama 2's 32000 for "
            f"Llama 3's 128256). Use {shape.tokenizer}, or pass --allow_vocab_mismatch=1 if you "
            "really mean it."
        )


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as e:  # gated / missing / offline
        raise SystemExit(
            f"cannot load tokenizer {path!r}: {e}\nFor gated models export HF_TOKEN (after "
            "accepting the licence on the model page) or pass --tokenizer=/local/folder."
        ) from e


# --------------------------------------------------------------------------------------------- data


def rank_seed(seed: int, rank: int, epoch: int) -> int:
    """A shuffle seed of its own for each (seed, rank, epoch): ranks never share a shuffle order."""
    digest = hashlib.sha256(f"fsdp-data:{seed}:{rank}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def rank_slice(items: Iterator, rank: int, world_size: int) -> Iterator:
    """Every world_size-th item starting at ``rank``: the ranks' slices are disjoint and cover everything."""
    return islice(items, rank, None, world_size)


def buffer_shuffle(items: Iterator, buffer_size: int, rng: random.Random) -> Iterator:
    """Streaming shuffle: keep ``buffer_size`` items, emit a random one as each new item arrives."""
    buf: list = []
    for item in items:
        if len(buf) < buffer_size:
            buf.append(item)
            continue
        i = rng.randrange(buffer_size)
        buf[i], item = item, buf[i]
        yield item
    rng.shuffle(buf)
    yield from buf


_DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".txt": "text", ".parquet": "parquet"}


def local_data_files(path: Path, split: str, config: str | None) -> tuple[str, list[str]]:
    """The (datasets builder, files) of a local dataset: one file, or a folder of json/jsonl/text/parquet."""
    if path.is_dir() and config and (path / config).is_dir():
        path = path / config
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    kinds: dict[str, list[str]] = {}
    for f in files:
        kind = _DATA_SUFFIXES.get(Path(f.name.removesuffix(".gz")).suffix)
        if kind and not f.name.startswith("."):
            kinds.setdefault(kind, []).append(str(f))
    if len(kinds) != 1:
        raise SystemExit(
            f"dataset folder {path}: need files of one kind (.json/.jsonl/.txt/.parquet, "
            f"optionally .gz); found kinds: {', '.join(kinds) or 'none'}"
        )
    kind, names = next(iter(kinds.items()))
    if any(split in Path(n).name for n in names):  # C4 layout: c4-train.*.json.gz next to c4-validation.*
        names = [n for n in names if split in Path(n).name]
    return kind, names


def open_stream(dataset: str, config: str | None, split: str):
    """A streaming ``datasets.IterableDataset``: a local path, or a Hub dataset (C4: allenai/c4, en)."""
    from datasets import load_dataset

    if os.path.exists(dataset):
        kind, files = local_data_files(Path(dataset), split, config)
        return load_dataset(kind, data_files=files, split="train", streaming=True)
    return load_dataset(dataset, config, split=split, streaming=True)


def rank_documents(
    dataset: str,
    config: str | None,
    split: str,
    text_field: str,
    rank: int,
    world_size: int,
    seed: int,
    epoch: int,
    shuffle_buffer: int,
) -> Iterator[str]:
    """This rank's documents for one epoch: a disjoint part of the stream, shuffled with the rank's seed."""
    ds = open_stream(dataset, config, split)
    if ds.num_shards >= world_size:  # whole files per rank: each rank reads only its own files
        rows = iter(ds.shard(num_shards=world_size, index=rank, contiguous=False))
    else:  # fewer files than ranks: every world_size-th document
        rows = rank_slice(iter(ds), rank, world_size)
    texts = (row[text_field] for row in rows)
    return buffer_shuffle(texts, shuffle_buffer, random.Random(rank_seed(seed, rank, epoch)))


class PackedBatches:
    """Token batches ``[batch, seq_len + 1]`` packed from a rank's documents, with a resumable position.

    The position is (epoch, documents taken this epoch, tokens carried over): resuming replays the
    document stream without tokenizing it, so the next batch is exactly the one the killed run would
    have trained on.
    """

    def __init__(
        self,
        documents: Callable[[int], Iterator[str]],
        encode: Callable[[str], list[int]],
        batch_size: int,
        seq_len: int,
        state: dict | None = None,
    ):
        self.documents, self.encode = documents, encode
        self.need = batch_size * (seq_len + 1)
        self.batch_size, self.seq_len = batch_size, seq_len
        state = state or {"epoch": 0, "docs": 0, "carry": []}
        self.epoch, self.docs, self.carry = int(state["epoch"]), int(state["docs"]), list(state["carry"])
        self._it: Iterator[str] = islice(self.documents(self.epoch), self.docs, None)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "docs": self.docs, "carry": list(self.carry)}

    def next_batch(self) -> torch.Tensor:
        empty_epochs = 0
        while len(self.carry) < self.need:
            try:
                text = next(self._it)
            except StopIteration:
                empty_epochs = empty_epochs + 1 if self.docs == 0 else 1
                if empty_epochs > 1:
                    raise SystemExit(
                        "this rank's share of the dataset is empty: use more documents or fewer ranks"
                    ) from None
                self.epoch, self.docs = self.epoch + 1, 0
                log.info("data: starting epoch %d", self.epoch)
                self._it = iter(self.documents(self.epoch))
                continue
            self.docs += 1
            self.carry.extend(self.encode(text))
        out, self.carry = self.carry[: self.need], self.carry[self.need :]
        return torch.tensor(out, dtype=torch.long).view(self.batch_size, self.seq_len + 1)


def batch_digest(batch: torch.Tensor) -> str:
    """Short content hash of a batch (logged per rank to show ranks train on different data)."""
    return hashlib.sha256(batch.numpy().tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------- checkpoints

COMPLETE = "COMPLETE"


def complete_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete ``step-N`` checkpoint, oldest first."""
    return sorted(
        (int(p.name[5:]), p) for p in ckpt_dir.glob("step-*") if p.name[5:].isdigit() and (p / COMPLETE).is_file()
    )


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint (incomplete or temporary folders are ignored)."""
    found = complete_checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrainState:
    """What DCP saves and loads: model and optimizer (sharded), lr schedule and step."""

    def __init__(self, model, optimizer, scheduler, step: int = 0):
        self.model, self.optimizer, self.scheduler, self.step = model, optimizer, scheduler, step

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "step": torch.tensor(self.step),
        }

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = int(sd["step"])


def save_checkpoint(ckpt_dir: Path, state: TrainState, data_state: dict, rank: int, world_size: int, keep: int) -> Path:
    """Write ``step-N`` atomically: DCP + per-rank data position into a temp folder, marker, rename."""
    import torch.distributed.checkpoint as dcp

    final = ckpt_dir / f"step-{state.step}"
    tmp = ckpt_dir / f".step-{state.step}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save({"train": state}, checkpoint_id=str(tmp))
    _write_atomic(tmp / f"data-rank{rank}.json", json.dumps({**data_state, "world_size": world_size}))
    dist.barrier()
    if rank == 0:
        _write_atomic(
            tmp / COMPLETE,
            json.dumps({"step": state.step, "world_size": world_size, "time": datetime.datetime.now().isoformat()}),
        )
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(ckpt_dir)
        for _, old in complete_checkpoints(ckpt_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(path: Path, state: TrainState, rank: int, world_size: int) -> dict | None:
    """Load ``path`` into ``state``; return this rank's data position (None if the world size changed)."""
    import torch.distributed.checkpoint as dcp

    dcp.load({"train": state}, checkpoint_id=str(path))
    data_file = path / f"data-rank{rank}.json"
    saved = json.loads(data_file.read_text()) if data_file.is_file() else None
    if saved is None or saved.get("world_size") != world_size:
        log.warning(
            "checkpoint %s was written by %s ranks, this run has %d: the data stream restarts at a new epoch",
            path,
            saved and saved.get("world_size"),
            world_size,
        )
        return None
    return saved


def clean_partial_checkpoints(ckpt_dir: Path) -> None:
    """Remove temporary folders a killed run left behind (rank 0 only)."""
    for p in ckpt_dir.glob(".step-*.tmp"):
        log.info("removing incomplete checkpoint %s", p)
        shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------------------------- throughput


def peak_tflops(device_name: str) -> float | None:
    """The bf16 peak of ``torch.cuda.get_device_name()`` (:mod:`cookbook_runtime.gpus`); None for a GPU not in
    the table."""
    from cookbook_runtime.gpus import known_peak

    return known_peak(device_name)


def flops_per_token(model: torch.nn.Module, shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs per token: 6 x active non-embedding parameters + attention (12 L h s)."""
    sizes = [(name, p.numel()) for name, p in model.named_parameters() if "embed_tokens" not in name]
    experts = sum(n for name, n in sizes if ".experts." in name)
    dense = sum(n for _, n in sizes) - experts
    active = dense + (experts * shape.experts_per_token / shape.experts if shape.experts else 0)
    return 6.0 * active + 12.0 * shape.layers * shape.hidden * seq_len


def format_step(
    step: int, loss: float, samples_per_sec: float, lr: float, tokens_per_sec_per_gpu: float, mfu: float | None
) -> str:
    """The log line ``cookbook.metrics`` parses (the AWS FSDP format plus tokens/s/GPU and MFU)."""
    mfu_text = "N/A" if mfu is None else f"{mfu:.2f}%"
    return (
        f"Batch {step} Loss: {loss:.5f}, Speed: {samples_per_sec:.2f} samples/sec, lr: {lr:.6f}, "
        f"tokens_per_second_per_gpu: {tokens_per_sec_per_gpu:.1f}, mfu: {mfu_text}"
    )


# --------------------------------------------------------------------------------------------- model


def lr_lambda(warmup: int, max_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warmup then cosine decay to ``min_ratio`` of the peak."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def build_model(
    shape: ModelShape,
    seq_len: int,
    device: torch.device,
    bf16: bool,
    activation_checkpointing: bool,
    seed: int,
    rank: int,
):
    """Build on the meta device, shard every decoder layer and the root with FSDP2, then materialise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    cfg = model_config(shape, seq_len)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=device)
    init_weights(model, cfg.initializer_range, seed, rank)
    model.train()
    return model


@torch.no_grad()
def init_weights(model: torch.nn.Module, std: float, seed: int, rank: int) -> None:
    """Initialise each rank's shards (normal(0, std) matrices, ones for norms) and the rotary buffers."""
    from torch.distributed.tensor import DTensor

    gen = torch.Generator(device="cpu")
    for i, (name, p) in enumerate(model.named_parameters()):
        local = p.to_local() if isinstance(p, DTensor) else p
        if p.ndim == 1:
            local.fill_(0.0 if name.endswith("bias") else 1.0)
            continue
        gen.manual_seed(rank_seed(seed, rank, i))
        local.copy_(torch.empty(local.shape, dtype=local.dtype).normal_(0.0, std, generator=gen))
    for module in model.modules():
        if hasattr(module, "inv_freq"):  # rotary embedding: buffers were left empty by to_empty
            fresh = type(module)(module.config)
            for buf in ("inv_freq", "original_inv_freq"):
                if hasattr(module, buf):
                    getattr(module, buf).copy_(getattr(fresh, buf))


# --------------------------------------------------------------------------------------------- main


# The script's options: (flag, type, default, help). --model and --backend also take their choices.
OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--model", str, "llama3_1_8b", "shape from the table"),
    ("--seq_len", int, None, "tokens per sample (default: the shape's context)"),
    ("--tokenizer", str, None, "hub id or folder (default: the model's own tokenizer)"),
    ("--allow_vocab_mismatch", int, 0, "1: accept a smaller foreign tokenizer"),
    ("--dataset", str, "allenai/c4", "hub dataset (streamed) or a local file/folder"),
    ("--dataset_config", str, "en", "hub config name (C4: en)"),
    ("--dataset_split", str, "train", ""),
    ("--text_field", str, "text", ""),
    ("--shuffle_buffer", int, 1000, "documents in each rank's shuffle buffer"),
    ("--train_batch_size", int, 1, "samples per rank per step"),
    ("--max_steps", int, 100, "optimizer steps; training ends there"),
    ("--lr", float, 1e-4, ""),
    ("--min_lr", float, 1e-5, ""),
    ("--warmup_steps", int, 10, ""),
    ("--weight_decay", float, 0.2, ""),
    ("--beta1", float, 0.9, ""),
    ("--beta2", float, 0.95, ""),
    ("--grad_clip", float, 1.0, ""),
    ("--seed", int, 42, ""),
    ("--bf16", int, None, "bf16 mixed precision (default: 1 on GPU, 0 on CPU)"),
    ("--activation_checkpointing", int, 0, ""),
    ("--checkpoint_dir", str, "./checkpoints", "step-N/ folders; resumes from the newest"),
    ("--checkpoint_freq", int, 50, "save every N steps (and at the end)"),
    ("--keep_checkpoints", int, 2, "complete checkpoints kept (0: all)"),
    ("--resume", int, 1, "1: resume from the newest complete checkpoint"),
    ("--logging_freq", int, 1, ""),
    ("--backend", str, "auto", ""),
    ("--tracker", str, "none", "rank 0 logs"),
    ("--tracker_dir", str, None, "TensorBoard folder (default $COOKBOOK_TB_DIR or ./tensorboard)"),
    ("--peak_tflops", float, None, "GPU bf16 peak for MFU if not in the table"),
    ("--throttle_seconds", float, 0.0, "sleep after each step (demos, tests)"),
    ("--profile_steps", int, 0, "steps the PyTorch profiler traces (0: off)"),
    ("--profile_warmup", int, 1, "profiler warm-up steps before the traced ones"),
    ("--profile_start_step", int, 3, "first traced step (1-based)"),
    ("--profile_dir", str, "./profiling/traces", "iteration_N/rank<R>_trace.json.gz go here"),
)
CHOICES = {
    "--model": sorted(SHAPES),
    "--backend": ["auto", "nccl", "gloo"],
    "--tracker": ["none", "tensorboard", "wandb", "mlflow"],
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    for flag, kind, default, help_text in OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=help_text or None, choices=CHOICES.get(flag))
    return p


def setup_distributed(backend: str) -> tuple[int, int, int, torch.device]:
    """Join torchrun's process group (or make a 1-process one); gloo on CPU, nccl on GPU."""
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, device_id=device if backend == "nccl" else None, timeout=datetime.timedelta(minutes=30)
    )
    return rank, local_rank, world, device


def make_profiler(args: argparse.Namespace, rank: int, first_step: int):
    """A ``torch.profiler.profile`` tracing steps ``profile_start_step`` .. ``+profile_steps-1`` (the log's
    step numbers) once; None when profiling is off or this run starts past the warm-up (a resume)."""
    if args.profile_steps <= 0:
        return None
    wait = args.profile_start_step - args.profile_warmup - first_step
    if wait < 0:
        log.info("Profiler: this run starts at step %d, past the profiled steps: not profiling", first_step)
        return None
    last = args.profile_start_step + args.profile_steps - 1
    folder = Path(args.profile_dir) / f"iteration_{last}"

    def save(prof) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(folder / f"rank{rank}_trace.json.gz"))
        log.info("Profiler: traces of steps %d-%d in %s", args.profile_start_step, last, folder)

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        record_shapes=True,
        on_trace_ready=save,
        schedule=torch.profiler.schedule(wait=wait, warmup=args.profile_warmup, active=args.profile_steps, repeat=1),
    )


class Tracker:
    """Rank 0's experiment tracker (``--tracker``); the other ranks' is a no-op. The run is the one the
    environment names (``COOKBOOK_RUN_NAME``, ``WANDB_RUN_ID``, ``MLFLOW_RUN_ID``), so a restart continues it."""

    def __init__(self, kind: str, tb_dir: str | None, rank: int, config: dict[str, Any]):
        self.kind = kind if rank == 0 else "none"
        name = os.environ.get("COOKBOOK_RUN_NAME") or "fsdp-train"
        self._sink: Any = None
        if self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._sink = SummaryWriter(tb_dir or os.environ.get("COOKBOOK_TB_DIR") or f"./tensorboard/{name}")
        elif self.kind == "wandb":
            import wandb

            self._sink = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "cookbook"),
                id=os.environ.get("WANDB_RUN_ID", name),
                name=os.environ.get("WANDB_NAME", name),
                resume="allow",
                dir=os.environ.get("WANDB_DIR"),
                config=config,
            )
        elif self.kind == "mlflow":
            import mlflow

            run_id = os.environ.get("MLFLOW_RUN_ID")
            self._sink = mlflow.start_run(run_id=run_id, run_name=None if run_id else name)
            if not run_id:
                mlflow.log_params(config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.kind == "tensorboard":
            for key, value in metrics.items():
                self._sink.add_scalar(key, value, step)
            self._sink.flush()
        elif self.kind == "wandb":
            self._sink.log(metrics, step=step)
        elif self.kind == "mlflow":
            import mlflow

            mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        if self.kind == "tensorboard":
            self._sink.close()
        elif self.kind == "wandb":
            self._sink.finish()
        elif self.kind == "mlflow":
            import mlflow

            mlflow.end_run()


@dataclass(frozen=True)
class Run:
    """What every phase of one training run reads: the options, this rank's place, the shape and precision."""

    args: argparse.Namespace
    rank: int
    world: int
    device: torch.device
    shape: ModelShape
    seq_len: int
    bf16: bool


def start_run(args: argparse.Namespace) -> Run:
    """Join the process group, set up rank 0's log and the seed; the run's fixed facts."""
    rank, _, world, device = setup_distributed(args.backend)
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        stream=sys.stdout,
        format="%(asctime)s %(levelname).1s [%(filename)s:%(lineno)d] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    shape = SHAPES[args.model]
    seq_len = args.seq_len or shape.max_context
    bf16 = bool(device.type == "cuda" if args.bf16 is None else args.bf16)
    torch.manual_seed(args.seed)
    return Run(args, rank, world, device, shape, seq_len, bf16)


def encode_document(tokenizer: Any, eos: int, text: str) -> list[int]:
    """A document's tokens, EOS appended (documents are packed back to back)."""
    return tokenizer(text, add_special_tokens=True)["input_ids"] + [eos]


def document_encoder(run: Run) -> Callable[[str], list[int]]:
    """The model's own tokenizer (or ``--tokenizer``), checked against the vocabulary, as a document encoder."""
    args, shape = run.args, run.shape
    tok_path = args.tokenizer or shape.tokenizer
    if tok_path is None:
        raise SystemExit(f"model {args.model} has no default tokenizer: pass --tokenizer=FOLDER")
    tokenizer = load_tokenizer(tok_path)
    n_tokens = len(tokenizer)
    if not args.allow_vocab_mismatch or n_tokens > shape.vocab:
        check_tokenizer(n_tokens, shape, args.model, tok_path)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SystemExit(f"tokenizer {tok_path} has no EOS token: documents could not be separated")
    log.info("Tokenizer %s: %d tokens (model vocabulary %d)", tok_path, n_tokens, shape.vocab)
    return functools.partial(encode_document, tokenizer, eos)


def build_state(run: Run) -> TrainState:
    """The FSDP-sharded model, its AdamW optimizer and lr schedule, at step 0."""
    args = run.args
    log.info("Creating Model")
    model = build_model(
        run.shape, run.seq_len, run.device, run.bf16, bool(args.activation_checkpointing), args.seed, run.rank
    )
    n_params = sum(p.numel() for p in model.parameters())
    log.info("Created model with total parameters: %d (%.2f B)", n_params, n_params / 1e9)
    log.info(
        "Wrapped model with FSDP (fully_shard, %d ranks, %s, %s)",
        run.world,
        "bf16" if run.bf16 else "fp32",
        "activation checkpointing" if args.activation_checkpointing else "no activation checkpointing",
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), weight_decay=args.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(args.warmup_steps, args.max_steps, args.min_lr / args.lr)
    )
    log.info("Created optimizer")
    return TrainState(model, optimizer, scheduler)


def resume(run: Run, state: TrainState, ckpt_dir: Path) -> dict | None:
    """Load the newest complete checkpoint into ``state`` (rank 0 cleans partial ones first); the data
    position to resume from, None to start the stream afresh."""
    if run.rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        clean_partial_checkpoints(ckpt_dir)
    dist.barrier()
    latest = latest_checkpoint(ckpt_dir) if run.args.resume else None
    if latest is None:
        return None
    # None when the world size changed: the data stream restarts at an epoch of its own
    data_state = load_checkpoint(latest, state, run.rank, run.world) or {
        "epoch": 1_000_000 + state.step,
        "docs": 0,
        "carry": [],
    }
    log.info("Resumed from checkpoint %s (step %d)", latest, state.step)
    return data_state


def rank_batches(run: Run, encode: Callable[[str], list[int]], data_state: dict | None) -> PackedBatches:
    """This rank's packed batches of its own documents, from ``data_state`` when resuming."""
    args = run.args
    documents = functools.partial(
        rank_documents,
        args.dataset,
        args.dataset_config,
        args.dataset_split,
        args.text_field,
        run.rank,
        run.world,
        args.seed,
        shuffle_buffer=args.shuffle_buffer,
    )
    return PackedBatches(documents, encode, args.train_batch_size, run.seq_len, data_state)


def train_step(state: TrainState, batch: torch.Tensor, grad_clip: float) -> tuple[torch.Tensor, float]:
    """One optimizer step on ``batch`` (``state.step`` counts it): the loss and the lr the step used."""
    inputs, labels = batch[:, :-1], batch[:, 1:]
    logits = state.model(input_ids=inputs, use_cache=False).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(state.model.parameters(), grad_clip)
    lr = float(state.scheduler.get_last_lr()[0])
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return loss, lr


def log_step(
    run: Run, step: int, loss: torch.Tensor, lr: float, t0: float, fpt: float, peak: float | None, tracker: Tracker
) -> None:
    """Rank 0's step line (the loss averaged over the ranks, throughput, MFU) and the tracker's metrics."""
    total = loss.detach().float().clone()
    dist.all_reduce(total)  # SUM (gloo has no AVG)
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    dt = time.perf_counter() - t0
    tps = run.args.train_batch_size * run.seq_len / dt
    mfu = 100.0 * tps * fpt / (peak * 1e12) if peak and run.bf16 else None
    samples = run.args.train_batch_size * run.world / dt
    log.info(format_step(step, total.item() / run.world, samples, lr, tps, mfu))
    tracker.log(
        step,
        {"loss": total.item() / run.world, "lr": lr, "samples_per_second": samples, "tokens_per_second_per_gpu": tps},
    )


def save(run: Run, ckpt_dir: Path, state: TrainState, data: PackedBatches) -> Path:
    """A checkpoint of this step (model, optimizer, schedule, each rank's data position); its folder."""
    return save_checkpoint(ckpt_dir, state, data.state_dict(), run.rank, run.world, run.args.keep_checkpoints)


def run_steps(run: Run, state: TrainState, data: PackedBatches, ckpt_dir: Path, fpt: float, peak: float | None) -> bool:
    """Train from ``state.step`` to ``--max_steps``, logging and saving on the way; True when a stop request
    ended it early (saved at the step boundary)."""
    args = run.args
    profiler = make_profiler(args, run.rank, state.step + 1)
    start = state.step
    preemption = _preemption()
    stop = preemption.StopRequest()
    tracker = Tracker(args.tracker, args.tracker_dir, run.rank, {k: v for k, v in vars(args).items() if v is not None})
    stopped = False
    with profiler if profiler is not None else contextlib.nullcontext():
        while state.step < args.max_steps:
            t0 = time.perf_counter()
            batch = data.next_batch()
            if state.step == start:  # every rank: shows each rank trains on its own data (and where it resumed)
                print(
                    f"rank {run.rank} first batch sha256 {batch_digest(batch)} at step {state.step + 1} "
                    f"(epoch {data.epoch}, document {data.docs})",
                    flush=True,
                )
            loss, lr = train_step(state, batch.to(run.device, non_blocking=True), args.grad_clip)
            if state.step % args.logging_freq == 0 or state.step == args.max_steps:
                log_step(run, state.step, loss, lr, t0, fpt, peak, tracker)
            path = None
            if state.step % args.checkpoint_freq == 0 or state.step == args.max_steps:
                path = save(run, ckpt_dir, state, data)
                log.info("Saved checkpoint %s", path)
            if profiler is not None:
                profiler.step()
            # a step boundary: every rank asks (a collective), so all save at the same step or none does
            if state.step < args.max_steps and stop.should_stop():
                stop.saved(state.step, str(path if path is not None else save(run, ckpt_dir, state, data)))
                stopped = True
                break
            if args.throttle_seconds:
                time.sleep(args.throttle_seconds)
            preemption.hang_step(state.step)  # no step for K x the median step time: every rank's stack
    tracker.close()
    return stopped


def train(args: argparse.Namespace) -> int:
    """Train ``--model`` to ``--max_steps`` from the newest checkpoint, or until a stop request (saved); 0."""
    run = start_run(args)
    encode = document_encoder(run)
    state = build_state(run)
    ckpt_dir = Path(args.checkpoint_dir)
    data = rank_batches(run, encode, resume(run, state, ckpt_dir))
    fpt = flops_per_token(state.model, run.shape, run.seq_len)
    device = run.device
    peak = args.peak_tflops or (peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None)
    if state.step >= args.max_steps:
        log.info("Checkpoint step %d already reaches max_steps=%d: nothing to train", state.step, args.max_steps)
        dist.destroy_process_group()
        return 0
    log.info(
        "Training starts at step %d (max_steps %d, %d ranks x %d samples x %d tokens)",
        state.step + 1,
        args.max_steps,
        run.world,
        args.train_batch_size,
        run.seq_len,
    )
    stopped = run_steps(run, state, data, ckpt_dir, fpt, peak)
    log.info("%s at step %d", "Stopped for preemption" if stopped else "Training finished", state.step)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _preemption() -> Any:
    """The stop protocol and the hang watch (:mod:`cookbook_runtime.rank`: the job puts the runtime on
    PYTHONPATH)."""
    from cookbook_runtime import rank

    return rank


def main(argv: list[str] | None = None) -> int:
    return train(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
