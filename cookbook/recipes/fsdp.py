"""Plain PyTorch FSDP2 recipes ``fsdp_<model>``: the AWS FSDP test case's models, our training script.

The program is the runtime's :mod:`cookbook_runtime.programs.fsdp_train` (self-contained: torch, transformers,
datasets), started by torchrun on every node from ``$RUNTIME_DIR``. Overrides are
the script's own flags (``--set max_steps=500`` -> ``--max_steps=500``), checked by its own argparse
parser. Resuming needs no arguments: the script loads the newest complete ``step-N`` checkpoint from
``--checkpoint_dir`` (default ``$RUN_DIR/checkpoints``).

``local-cpu``: the tiny shape (``tiny_moe`` for Mixtral) on the tiny C4-like data and tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
from dataclasses import replace
from types import ModuleType
from typing import Any

from cookbook.profiling.enable import schedule
from cookbook.recipes.base import HubFetch, Launch, Recipe, StartPath, is_hub_id, program_file, register_recipe
from cookbook.recipes.shims import assets_variables
from cookbook.spec import JobSpec
from cookbook.templating import render_template

SCRIPT_NAME = "fsdp_train.py"  # in the runtime's programs

# (shape in fsdp_train.SHAPES, display name, max_steps default as in the AWS sbatch files)
FSDP_MODELS: tuple[tuple[str, str, int], ...] = (
    ("llama2_7b", "Llama 2 7B", 100),
    ("llama2_13b", "Llama 2 13B", 100),
    ("llama2_70b", "Llama 2 70B", 100),
    ("llama3_1_8b", "Llama 3.1 8B", 100),
    ("llama3_1_70b", "Llama 3.1 70B", 100),
    ("llama3_2_1b", "Llama 3.2 1B", 100),
    ("llama3_2_3b", "Llama 3.2 3B", 100),
    ("mistral_7b", "Mistral 7B", 5000),
    ("mathstral_7b", "Mathstral 7B", 5000),
    ("mixtral_8x7b", "Mixtral 8x7B", 5000),
)
# Flags the recipe owns: the model is the recipe's name; the rest come from the spec.
_FIXED = {
    "model": "pick the recipe fsdp_<model> instead (cookbook recipes lists them)",
    "backend": "the profile decides (nccl on GPUs, gloo on local-cpu)",
    "tracker": "use --tracker (it also names the run and sets up the tracker's environment)",
    "tracker_dir": "use --tracker tensorboard (the folder is $COOKBOOK_TB_DIR, set by the script)",
}
_GATED = ("meta-llama/", "mistralai/")


@functools.cache
def _train_module() -> ModuleType:
    """The training script as a module (imported lazily: it imports torch)."""
    from cookbook_runtime.programs import fsdp_train

    return fsdp_train


def parse_train_args(args: list[str]) -> tuple[argparse.Namespace | None, str]:
    """Run the script's own parser on ``args``: ``(namespace, "")`` or ``(None, its error text)``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns: argparse.Namespace = _train_module().build_parser().parse_args(args)
            return ns, ""
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "invalid arguments"


@functools.cache
def known_flags() -> tuple[str, ...]:
    parser = _train_module().build_parser()
    return tuple(a.dest for a in parser._actions if a.dest != "help")


class FsdpRecipe(Recipe):
    """``fsdp_<shape>``: FSDP2 pretraining of one model shape on C4 (or a local dataset)."""

    framework = "fsdp"
    trains = True
    save_interval_key = "checkpoint_freq"  # GPU jobs get the planner's interval
    trace_subdir = "profiling/traces"
    planner_keys = {
        "train_batch_size": "micro_batch",
        "max_context_width": "seq_len",
        "activation_checkpointing": "checkpointing",
        "offload_activations": "activation_offloading",
    }
    typed_config = True  # its parser names a word where a number belongs
    checkpointing_values = {"none": "0", "full": "1"}  # train.py --activation_checkpointing
    positive_keys = {"lr": "the learning rate", "seq_len": "the sequence length", "max_steps": "the training steps"}
    config_paths = (
        StartPath("tokenizer", None, "", "dir", "the tokenizer (a Hub id or a folder)", hub_ok=True),
        StartPath("dataset", None, "", "dir", "the dataset (a Hub id or a folder)", hub_ok=True),
    )

    def __init__(self, shape: str, title: str, max_steps: int):
        self.shape, self.title, self.max_steps = shape, title, max_steps
        self.name = f"fsdp_{shape}"
        self.description = f"{title} pretraining on C4, plain PyTorch FSDP2 (the AWS FSDP test case)"

    # -- arguments ---------------------------------------------------------------------------------
    def base_args(self, spec: JobSpec) -> dict[str, str]:
        """The script's flags before the user's overrides."""
        if spec.local_cpu:
            return {
                "model": "tiny_moe" if self.shape.startswith("mixtral") else "tiny",
                "tokenizer": "$TINY_DIR/hf_tokenizer",
                "dataset": "$TINY_DIR/c4",
                "dataset_config": "en",
                "seq_len": "64",
                "train_batch_size": "2",
                "max_steps": "20",
                "warmup_steps": "2",
                "lr": "0.001",
                "min_lr": "0.0001",
                "shuffle_buffer": "64",
                "checkpoint_freq": "5",
                "checkpoint_dir": "$RUN_DIR/checkpoints",
                "bf16": "0",
                "backend": "gloo",
            }
        # checkpoint_freq: the resolved interval (saving <= 5% of the step time; any model MODEL names)
        sized = self.save_overrides(spec)
        return {
            "model": self.shape,
            "dataset": "allenai/c4",
            "dataset_config": "en",
            "train_batch_size": "1",
            "max_steps": str(self.max_steps),
            "checkpoint_freq": sized.get(self.save_interval_key, "50"),
            "activation_checkpointing": "1",
            "bf16": "1",
            "lr": "0.0001",
            "min_lr": "0.00001",
            "warmup_steps": "16",
            "weight_decay": "0.2",
            "grad_clip": "1.0",
            "seed": "42",
            "checkpoint_dir": "$RUN_DIR/checkpoints",
            "backend": "nccl",
        }

    def train_args(self, spec: JobSpec) -> dict[str, str]:
        tracker = {"tracker": spec.tracker} if spec.tracker != "none" else {}
        return {**self.base_args(spec), **tracker, **spec.overrides}

    # -- asked by the notebooks, planner and profiler --------------------------------------------------
    def profiling_overrides(
        self, *, device: str = "cuda", steps: int = 3, warmup: int = 1, start_step: int = 3, memory: bool = False
    ) -> dict[str, str]:
        sched = schedule(steps=steps, warmup=warmup, start_step=start_step)
        if memory:
            raise ValueError("the FSDP script takes no memory snapshots; profile memory with torchtune or torchtitan")
        return {
            "profile_steps": str(sched.active),
            "profile_warmup": str(sched.warmup),
            "profile_start_step": str(sched.first_traced_step),
            "profile_dir": f"$RUN_DIR/{self.trace_subdir}",
        }

    def planner_defaults(self) -> dict[str, Any]:
        """The AWS FSDP test case: HF-style model, FSDP MixedPrecision bf16, activation checkpointing +
        offloading, train_batch_size 1; no ``seq_len``: max_context_width is the model's context."""
        return {
            "model": self.shape,
            "nodes": 4,
            "gpus_per_node": 8,
            "gpu": "h100",
            "settings": {
                "master_weights_fp32": True,
                "optimizer_state_bytes": 4,
                "loss": "fp32",
                "checkpointing": "full",
                "activation_offloading": True,
                "fused_optimizer": False,
                "micro_batch": 1,
            },
            "source": "awsome-distributed-training FSDP test case (train_batch_size 1, "
            "max_context_width = model context, activation_checkpointing=1, "
            "offload_activations=1, sharding full)",
        }

    # -- Recipe contract -----------------------------------------------------------------------------
    def validate(self, spec: JobSpec) -> list[str]:
        problems = []
        known = known_flags()
        for key in spec.overrides:
            if key in _FIXED:
                problems.append(f"override {key!r} is set by the recipe: {_FIXED[key]}")
            elif key not in known:
                hint = difflib.get_close_matches(key, known, 3)
                problems.append(
                    f"override key {key!r} is not a flag of the FSDP train.py"
                    + (f": did you mean {' or '.join(hint)}?" if hint else f" (flags: {', '.join(known)})")
                )
        if problems:
            return problems
        ns, err = parse_train_args([f"--{k}={v}" for k, v in self.train_args(spec).items()])
        if ns is None:
            return [f"train.py rejects the overrides: {err}"]
        for flag in ("train_batch_size", "max_steps", "checkpoint_freq", "logging_freq"):
            if getattr(ns, flag) < 1:
                problems.append(f"{flag}={getattr(ns, flag)}: use a positive integer")
        shape = _train_module().SHAPES[ns.model]
        if ns.seq_len is not None and ns.seq_len < 2:
            problems.append(f"seq_len={ns.seq_len}: need at least 2 tokens per sample")
        if spec.world_size > 1 and shape.heads % shape.kv_heads:
            problems.append(f"{ns.model}: heads {shape.heads} not a multiple of kv heads {shape.kv_heads}")
        return problems

    def hub_fetches(self, spec: JobSpec) -> list[HubFetch]:
        """The tokenizer and the dataset when they are Hub ids (the GPU default: the model's tokenizer, C4
        streamed by every rank; train.py loads C4 with its ``en`` config: the README and ``en/`` files)."""
        if spec.local_cpu:
            return []
        args = self.train_args(spec)
        out = []
        tok = args.get("tokenizer") or _train_module().SHAPES[self.shape].tokenizer or ""
        if is_hub_id(tok):
            out.append(HubFetch(tok, "model", "tokenizer", allow=("*.json", "tokenizer*")))
        data, config = args.get("dataset", ""), args.get("dataset_config", "")
        if is_hub_id(data):
            allow = ("README.md", f"{config}/*") if config else ()
            out.append(HubFetch(data, "dataset", "dataset", allow=allow))
        return out

    def warnings(self, spec: JobSpec) -> list[str]:
        out = []
        args = self.train_args(spec)
        tok = args.get("tokenizer") or _train_module().SHAPES[self.shape].tokenizer or ""
        if not spec.local_cpu and tok.startswith(_GATED):
            out.append(
                f"{tok} is gated: accept its licence on the Hub and run `hf auth login` (the job reads its token "
                "file; an exported HF_TOKEN is not given to Slurm); or pass --set tokenizer=/shared/folder"
            )
        if spec.container_image and not spec.container_mounts:
            out.append(
                "container: the runtime ($RUNTIME_DIR) and the checkpoints ($RUN_DIR) must be visible inside "
                "the container: add --container-mount /shared:/shared"
            )
        return out

    def command(self, spec: JobSpec) -> Launch:
        args = tuple(f"--{k}={v}" for k, v in self.train_args(spec).items())
        return Launch("torchrun", (program_file(SCRIPT_NAME), *args), assets_variables(spec))

    def resume(self, spec: JobSpec) -> list[str]:
        """fsdp_train.py resumes by itself; the runtime says which checkpoint it will pick."""
        return ["--resume=fsdp", f"--checkpoint-dir={self.train_args(spec)['checkpoint_dir']}"]


for _shape, _title, _steps in FSDP_MODELS:
    register_recipe(FsdpRecipe(_shape, _title, _steps))

#: The model an ``fsdp.<profile>.sbatch`` script trains unless ``MODEL`` names another.
DEFAULT_MODEL = "llama3_1_8b"
#: The recipe name of those scripts' header; ``$MODEL`` is filled in at run time.
ANY_MODEL = "fsdp_${MODEL}"


class FsdpAnyModel(FsdpRecipe):
    """The script of ``slurm-recipes/fsdp/``: one per profile, the model picked at submission
    (``MODEL=llama3_1_70b sbatch fsdp.nebius.sbatch``) and checked by the script. It renders the spec of
    ``fsdp_<DEFAULT_MODEL>`` (validated as that recipe) with ``--model``/``--max_steps`` from ``MODEL``."""

    def __init__(self) -> None:
        default = next(m for m in FSDP_MODELS if m[0] == DEFAULT_MODEL)
        super().__init__(*default)
        self.name = ANY_MODEL
        self.description = (
            f"pretraining on C4 of the model MODEL names (default {default[1]}), plain PyTorch FSDP2 "
            "(the AWS FSDP test case)"
        )

    def stop_save_recipes(self) -> tuple[str, ...]:
        """Any model MODEL names: the periodic save's interval covers the largest one's checkpoint."""
        return tuple(f"fsdp_{shape}" for shape, _, _ in FSDP_MODELS)

    def run_time_sizes(self) -> tuple[str, str]:
        """The ``MODEL`` case's sizes of the model picked at submission (``--signal``: the default model's lead)."""
        return ("CKPT_GB", "SAVE_S")

    def base_args(self, spec: JobSpec) -> dict[str, str]:
        return {**super().base_args(spec), "model": "$SHAPE", "max_steps": "$MAX_STEPS"}

    def command(self, spec: JobSpec) -> Launch:
        launch = super().command(spec)
        small = spec.local_cpu  # the bench's shapes and step counts, with nothing to size
        tiny = {"max_steps": super().base_args(spec)["max_steps"]} if small else {}
        saves = spec.sizing.saves if spec.sizing else {}  # each model's, sized by cookbook.resolve
        if not (small or saves):
            raise ValueError(f"{self.name}: its models' save sizes are unset: render it through cookbook.resolve")
        cases: dict[str, list[str]] = {}  # the case's assignments -> the models that have them
        for model, _, steps in FSDP_MODELS:
            shape = ("tiny_moe" if model.startswith("mixtral") else "tiny") if small else '"$MODEL"'
            save = saves.get(f"fsdp_{model}", (0, 0.0))
            sizes = "" if small else f" CKPT_GB={save[0] / 1e9:.0f} SAVE_S={save[1]:.0f}"
            cases.setdefault(f"SHAPE={shape} MAX_STEPS={tiny.get('max_steps', str(steps))}{sizes}", []).append(model)
        prelude = render_template(
            "fsdp_model.sh.j2",
            script=spec.script_name or "fsdp.sbatch",
            default=DEFAULT_MODEL,
            cases=cases,
            sized=not spec.local_cpu,
            models=[m for m, _, _ in FSDP_MODELS],
        )
        names = ("MODEL", "SHAPE", "MAX_STEPS", *(() if spec.local_cpu else self.run_time_sizes()))
        return replace(launch, prelude=prelude, prelude_variables=names)
