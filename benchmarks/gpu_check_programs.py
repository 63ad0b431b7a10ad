"""What the GPU check (#31) runs: the recipes' training programs, their shapes and settings, their command lines.

Each :class:`Program` is one training program a recipe launches, at the real model width with fewer blocks
(:attr:`Program.blocks`, on GPU) or the local bench's tiny sizes (CPU mode). Its settings are the recipe's own,
read from the planner's record of the recipe (:func:`cookbook.planner.recipe_defaults`: sequence length, micro-batch,
activation checkpointing, compile, LoRA rank) and passed to the program explicitly, so the planner estimates the
shape that ran. A :class:`Variant` toggles one thing of a run (an A/B): the runtime's per-step stop check, the
flight recorder, compile, activation checkpointing.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cookbook.planner import FluxShape, ModelShape, Settings, get_model, recipe_defaults

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RECIPES_DIR = ROOT / "slurm-recipes"
RUN = BENCH / "gpu_check_run.py"


@dataclass(frozen=True)
class Program:
    """A training program one recipe launches."""

    name: str
    title: str
    recipe: str  # the planner's recipe key (cookbook/planner/recipes.py)
    framework: str  # torchtitan | torchtune | fsdp
    blocks: dict[str, int]  # GPU: the blocks kept (the model's other widths are the real ones)
    full_depth: str  # what the real model has, for the table
    assets: str | None = None  # "tune" / "flux": made by gpu_check_assets.py first
    planner_overrides: dict[str, Any] = field(default_factory=dict)  # what differs on one machine, with why
    note: str = ""


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program("titan_llama3", "torchtitan Llama 3.1 8B (llama3_8b_c4)", "llama3_8b_c4", "torchtitan",
                {"layers": 4}, "32 layers"),
        Program("tune_lora", "torchtune LoRA, cookbook_tune (llama3_3_70b_lora)", "llama3_3_70b_lora", "torchtune",
                {"layers": 2}, "80 layers", "tune"),
        Program("tune_full", "torchtune full, cookbook_tune (llama3_3_70b_full)", "llama3_3_70b_full", "torchtune",
                {"layers": 2}, "80 layers", "tune"),
        Program("fsdp", "FSDP train.py (fsdp_llama3_1_8b)", "fsdp_llama3_1_8b", "fsdp", {"layers": 4}, "32 layers",
                planner_overrides={"activation_offloading": False},
                note="train.py has no activation offloading (the planner's AWS defaults have it): planned without"),
        Program("flux", "torchtitan FLUX.1-schnell (flux_schnell)", "flux_schnell", "torchtitan",
                {"double_blocks": 2, "single_blocks": 4}, "19 double + 38 single blocks", "flux",
                planner_overrides={"shard_group": 0},
                note="one machine: FSDP over its GPUs (the recipe's HSDP replicates across nodes); T5 and CLIP have "
                "FLUX's widths (4096, 768) with one layer each"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Variant:
    """One A/B toggle of a program's run: environment (the runtime's overheads) or a setting (compile, AC)."""

    name: str
    kind: str  # "overhead" | "setting"
    env: dict[str, str] = field(default_factory=dict)
    setting: str = ""  # "compile" | "checkpointing": flipped from the recipe's choice


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("stop-check-off", "overhead", {"GPU_CHECK_STOP_CHECK": "0"}),
        Variant("flight-recorder-off", "overhead", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_BUFFER_SIZE": "0"}),
        Variant("compile", "setting", setting="compile"),
        Variant("ac", "setting", setting="checkpointing"),
    )
}
# (program, variant) pairs each mode runs after the programs, most wanted first (the deadline skips from the end).
# GPU: the overheads on the FSDP script (cheapest start, a stop agreement every step), then compile and AC where the
# published figures show a gain (torchtitan 8B: 5,762 -> 6,667 tokens/s/GPU with compile). CPU mode: each toggle
# once, on the cheapest programs (the same code paths).
DEFAULT_VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu": (
        ("fsdp", "stop-check-off"), ("fsdp", "flight-recorder-off"), ("titan_llama3", "compile"),
        ("titan_llama3", "ac"), ("tune_full", "compile"), ("tune_lora", "ac"), ("fsdp", "ac"), ("flux", "ac"),
    ),
    # CPU mode checks the script, not the figures: one toggle of the environment, one of the recipe's settings
    "cpu": (("fsdp", "stop-check-off"), ("tune_full", "compile")),
}  # fmt: skip
STOP_SAVE_PROGRAMS = ("titan_llama3", "tune_lora")  # USR1 mid-run, then the resume


@dataclass(frozen=True)
class Steps:
    """Steps of a run, where the stop-save lands, and the first steps the rate leaves out (warm-up, compile)."""

    total: int
    stop_at: int
    warmup: int


STEPS = {"gpu": Steps(total=20, stop_at=12, warmup=3), "cpu": Steps(total=3, stop_at=2, warmup=1)}
VARIANT_STEPS = {"gpu": Steps(total=12, stop_at=0, warmup=3), "cpu": Steps(total=3, stop_at=0, warmup=1)}
# CPU mode: tiny sequences and batches (the settings' other values are the recipe's)
CPU_SETTINGS: dict[str, dict[str, Any]] = {
    "llm": {"seq_len": 64, "micro_batch": 2},
    "flux": {"micro_batch": 2, "image_size": 64, "text_tokens": 32},
}


def check_variant(program: Program, variant: Variant) -> None:
    """ValueError for a toggle the program has no switch for."""
    if variant.setting == "compile" and program.framework == "fsdp":
        raise ValueError("the FSDP train.py has no compile switch")


def settings(program: Program, mode: str, variant: Variant | None = None) -> Settings:
    """The recipe's settings as this run uses them (the planner's input for the same run)."""
    s = recipe_defaults(program.recipe).settings.with_overrides(**program.planner_overrides)
    if mode == "cpu":
        s = s.with_overrides(**CPU_SETTINGS["flux" if program.name == "flux" else "llm"])
    if variant is not None and variant.setting == "compile":
        s = s.with_overrides(compile=not s.compile)
    if variant is not None and variant.setting == "checkpointing":
        s = s.with_overrides(checkpointing="none" if s.checkpointing != "none" else "full")
    return s


def tiny_dims(**change: Any) -> Any:
    """``cookbook.local.assets.tiny_llama.LlamaDims``: the tiny sizes (CPU mode) or ``change`` applied."""
    from cookbook.local.assets.tiny_llama import DIMS

    return replace(DIMS, **change)


def llama_dims(program: Program, mode: str) -> Any:
    """torchtune's model sizes: the recipe model's widths with ``blocks`` layers (GPU) or the tiny ones (CPU)."""
    if mode == "cpu":
        return tiny_dims()
    m = get_model(recipe_defaults(program.recipe).model)
    assert isinstance(m, ModelShape)
    s = settings(program, mode)
    return tiny_dims(vocab_size=m.vocab_size, dim=m.hidden, n_layers=program.blocks["layers"], n_heads=m.heads,
                     n_kv_heads=m.kv_heads, ffn_dim=m.intermediate, max_seq_len=max(4096, s.seq_len))  # fmt: skip


def planner_shape(program: Program, mode: str, flux_counts: dict[str, int] | None = None) -> ModelShape | FluxShape:
    """The planner's shape of what runs: the recipe's model with fewer blocks (GPU), or the tiny model (CPU)."""
    model = get_model(recipe_defaults(program.recipe).model)
    if isinstance(model, FluxShape):
        wanted = ("text_encoder_params", "clip_params", "autoencoder_params")
        counts: dict[str, Any] = {k: v for k, v in (flux_counts or {}).items() if k in wanted}
        if mode == "cpu":  # the local bench's tiny FLUX (cookbook/local/compat/titan_tiny_configs.tiny_flux_spec)
            return replace(model, hidden=64, heads=2, double_blocks=1, single_blocks=1, mlp_ratio=2.0, context_dim=64,
                           vec_dim=64, **counts)  # fmt: skip
        return replace(model, **(dict(program.blocks) | counts))
    if mode == "cpu":
        d = tiny_dims()
        return replace(model, vocab_size=d.vocab_size, hidden=d.dim, layers=d.n_layers, heads=d.n_heads,
                       kv_heads=d.n_kv_heads, intermediate=d.ffn_dim, tied_embeddings=False)  # fmt: skip
    blocks: dict[str, Any] = dict(program.blocks)
    return replace(model, **blocks)


@dataclass(frozen=True)
class Launch:
    """One process tree to start: the wrapper's arguments, its environment, the run folder, logs to read after."""

    args: list[str]
    env: dict[str, str]
    run_dir: Path
    log_globs: tuple[str, ...] = ()  # files under run_dir with metrics lines (torchtune's DiskLogger)
    framework: str = ""


@dataclass(frozen=True)
class Paths:
    tiny: Path  # the tiny assets (tokenizers, C4-like data): ``cookbook.local.assets.tiny``
    assets: Path  # what gpu_check_assets.py wrote
    runs: Path  # one folder per run


def base_env(mode: str, run_dir: Path, tiny: Path) -> dict[str, str]:
    """What the job runtime (``cookbook_runtime.run``) and the recipes' scripts export, for one run."""
    state = run_dir / ".cookbook"
    path = [str(ROOT), str(RECIPES_DIR), str(BENCH)]  # the runtime and its programs, as the job's $RUNTIME_DIR
    env = {
        "PYTHONPATH": os.pathsep.join(path + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "TINY_DIR": str(tiny),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "COOKBOOK_STOP_FILE": str(state / "stop"),
        "COOKBOOK_HANG_DIR": str(state / "hang"),
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(state / "hang" / "nccl_trace_rank_"),
    }
    if mode == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def launch(program: Program, mode: str, paths: Paths, run_dir: Path, steps: int, variant: Variant | None = None,
           checkpoint: bool = False) -> Launch:  # fmt: skip
    """The wrapper's command line and environment for one run of ``program``."""
    s = settings(program, mode, variant)
    env = base_env(mode, run_dir, paths.tiny) | (variant.env if variant else {})
    if program.framework == "torchtitan":
        return _titan(program, mode, paths, run_dir, steps, s, env, checkpoint)
    if program.framework == "torchtune":
        return _tune(program, mode, paths, run_dir, steps, s, env)
    return _fsdp(program, mode, paths, run_dir, steps, s, env)


def _titan(program: Program, mode: str, paths: Paths, run_dir: Path, steps: int, s: Settings, env: dict[str, str],
           checkpoint: bool) -> Launch:  # fmt: skip
    flux = program.name == "flux"
    titan: dict[str, Any] = {"steps": steps, "local_batch_size": s.micro_batch, "ac": s.checkpointing,
                             "compile": s.compile, "checkpoint": checkpoint}  # fmt: skip
    if mode == "gpu":
        titan.update(program.blocks)
    if mode == "cpu" and s.compile:
        titan["compile_backend"] = "eager"  # no triton on the bench: dynamo's tracing, no code generation
    if flux:
        titan["flux_dir"] = str(paths.assets / "flux")
    else:
        titan["seq_len"] = s.seq_len
    env["GPU_CHECK_TITAN"] = json.dumps(titan)
    config = ("flux" if flux else "llama3") + ("_tiny" if mode == "cpu" else "")
    args = ["--module", "gpu_check_titan", "--config", config, "--dump_folder", str(run_dir)]
    if not flux:
        args += [
            "--hf_assets_path",
            str(paths.tiny / "hf_tokenizer"),
            "--dataloader.dataset_path",
            str(paths.tiny / "c4"),
        ]
    head = ["cpu", "torchtitan"] if mode == "cpu" else ["titan"]
    return Launch(head + args, env, run_dir, framework="torchtitan")


def _tune(program: Program, mode: str, paths: Paths, run_dir: Path, steps: int, s: Settings,
          env: dict[str, str]) -> Launch:  # fmt: skip
    recipe = "lora_finetune_distributed" if s.lora_rank else "full_finetune_distributed"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "config.yaml"
    config.write_text(yaml.safe_dump(tune_config(program, mode, paths, run_dir, steps, s), sort_keys=False))
    if mode == "cpu" and s.compile:
        env["TORCH_COMPILE_BACKEND"] = "eager"  # torchtune's own switch (training/_compile.py); no triton here
    head = ["cpu", "torchtune", "cookbook_runtime.programs.cookbook_tune"] if mode == "cpu" else ["tune"]
    return Launch(head + [recipe, "--config", str(config)], env, run_dir, ("logs/log_*.txt",), "torchtune")


def tune_config(program: Program, mode: str, paths: Paths, run_dir: Path, steps: int, s: Settings) -> dict[str, Any]:
    """The recipe's own GPU YAML (``slurm-recipes/torchtune/<recipe>.yaml``) with the check's changes: the model at
    the check's sizes and weights, the tiny tokenizer, long local Alpaca records, the run's steps and settings."""
    cfg: dict[str, Any] = yaml.safe_load((RECIPES_DIR / "torchtune" / f"{program.recipe}.yaml").read_text())
    d = llama_dims(program, mode)
    lora = {k: v for k, v in cfg["model"].items() if k != "_component_"} if s.lora_rank else {}
    cfg["model"] = {
        "_component_": "torchtune.models.llama3_1." + ("lora_llama3_1" if s.lora_rank else "llama3_1"),
        **lora,
        "vocab_size": d.vocab_size, "num_layers": d.n_layers, "num_heads": d.n_heads, "num_kv_heads": d.n_kv_heads,
        "embed_dim": d.dim, "intermediate_dim": d.ffn_dim, "max_seq_len": d.max_seq_len, "rope_base": int(d.rope_theta),
        "norm_eps": d.norm_eps,
    }  # fmt: skip
    tokenizer = paths.tiny / "llama3"
    cfg["tokenizer"] |= {
        "path": str(tokenizer / "original" / "tokenizer.model"),
        "special_tokens_path": str(tokenizer / "tokenizer.json"),
        "max_seq_len": s.seq_len,
    }
    cfg["checkpointer"] |= {
        "checkpoint_dir": str(paths.assets / "tune" / "llama"),
        "checkpoint_files": {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00001"},
    }
    packed = bool(cfg["dataset"].get("packed", False))
    data = str(paths.assets / "tune" / f"alpaca_{s.seq_len}.json")
    cfg["dataset"] = {"_component_": "torchtune.datasets.alpaca_dataset", "source": "json", "data_files": data,
                      "split": "train", "packed": packed}  # fmt: skip
    cfg |= {"output_dir": str(run_dir), "seed": 1234, "epochs": 1, "max_steps_per_epoch": steps,
            "batch_size": s.micro_batch, "compile": s.compile, "log_every_n_steps": 1, "log_peak_memory_stats": True,
            "enable_activation_checkpointing": s.checkpointing != "none"}  # fmt: skip
    if mode == "cpu":  # as the recipe's local-cpu YAML: fp32 on CPU, no fused AdamW
        cfg |= {"device": "cpu", "dtype": "fp32"}
        cfg["optimizer"]["fused"] = False
        cfg["profiler"]["cuda"] = False
    return cfg


def _fsdp(program: Program, mode: str, paths: Paths, run_dir: Path, steps: int, s: Settings,
          env: dict[str, str]) -> Launch:  # fmt: skip
    if mode == "cpu":
        d = tiny_dims()  # train.py's own "tiny" shape at the tiny Llama's sizes (the planner's CPU shape)
        shape: dict[str, Any] = {"model": "tiny", "hidden": d.dim, "intermediate": d.ffn_dim, "layers": d.n_layers,
                                 "heads": d.n_heads, "kv_heads": d.n_kv_heads, "vocab": d.vocab_size}  # fmt: skip
    else:
        shape = {"model": recipe_defaults(program.recipe).model, **program.blocks}
    env |= {"GPU_CHECK_FSDP_SHAPE": json.dumps(shape), "GPU_CHECK_FSDP_NO_SAVE": "1"}
    args = {
        "model": shape["model"], "tokenizer": paths.tiny / "hf_tokenizer", "allow_vocab_mismatch": 1,
        "dataset": paths.tiny / "c4", "dataset_config": "en", "seq_len": s.seq_len, "train_batch_size": s.micro_batch,
        "max_steps": steps, "warmup_steps": 2, "checkpoint_freq": 10**6, "checkpoint_dir": run_dir / "checkpoints",
        "resume": 0, "activation_checkpointing": int(s.checkpointing != "none"), "bf16": int(mode == "gpu"),
        "backend": "nccl" if mode == "gpu" else "gloo", "shuffle_buffer": 64,
    }  # fmt: skip
    flags = [f"--{k}={v}" for k, v in args.items()]
    program = RECIPES_DIR / "cookbook_runtime" / "programs" / "fsdp_train.py"
    return Launch(["fsdp", str(program), *flags], env, run_dir, framework="fsdp")


def wrapper_command(nproc: int) -> list[str]:
    """``python gpu_check_run.py`` (one process) or the shielded launcher over torchrun (several GPUs): only the
    ranks act on USR1, as on a cluster (``cookbook_runtime.launch``)."""
    if nproc <= 1:
        return [sys.executable, str(RUN)]
    return [sys.executable, "-m", "cookbook_runtime.launch", "torchrun", "--standalone", f"--nproc-per-node={nproc}",
            str(RUN)]  # fmt: skip


def rank_env(nproc: int, port: int) -> dict[str, str]:
    """torchrun's variables for a world of one process started without it."""
    if nproc > 1:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip


# ------------------------------------------------------------------------------------------------- reading logs

CHECK_LINE = re.compile(r"gpu_check: (\w+) (\{.*\})\s*$")
TUNE_SAVE = re.compile(r"Saving checkpoint took ([\d.]+) secs")
TUNE_SIZE = re.compile(r"checkpoint of size ([\d.]+) GiB saved")
TITAN_SAVE = re.compile(r"saving the checkpoint.*?in ([\d.]+) seconds", re.I)
TITAN_LOAD = re.compile(r"loading the checkpoint in ([\d.]+) seconds", re.I)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def step_rows(lines: Iterable[str]) -> dict[int, dict[str, float]]:
    """``{step: {tokens_per_second_per_gpu, memory_gib}}`` from metrics lines of any format the cookbook reads
    (``cookbook.metrics.formats``: torchtitan, torchtune's DiskLogger and progress bar, the FSDP script); a value
    from the first line of its step that has it."""
    from cookbook.metrics.formats import parse_line

    rows: dict[int, dict[str, float]] = {}
    for line in lines:
        if "oss" not in line:
            continue
        fmt, found, _ = parse_line(line.rstrip("\r\n"))
        if fmt is None or found is None:
            continue
        get = found.get if isinstance(found, dict) else found.groupdict().get
        step = _number(get("step"))
        if step is None:
            continue
        row = rows.setdefault(int(step), {})
        for k in ("tokens_per_second_per_gpu", "memory_gib", "loss"):
            if k not in row and (v := _number(get(k))) is not None:
                row[k] = v
    return rows


def check_values(lines: Iterable[str]) -> dict[str, Any]:
    """The ``gpu_check: KEY {json}`` lines (last one of each key wins)."""
    out: dict[str, Any] = {}
    for line in lines:
        if m := CHECK_LINE.search(line):
            try:
                out[m[1]] = json.loads(m[2])
            except ValueError:
                continue
    return out
