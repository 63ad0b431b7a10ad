"""torchtitan 0.3.0 recipes: Llama-3.1-8B on C4 and FLUX.1-schnell.

Configs are Python functions in the runtime's ``cookbook_runtime/programs/cookbook_titan.py`` (passed as
``--module cookbook_runtime.programs.cookbook_titan --config NAME``; the job has the runtime on its path).
Overrides are ``section.key=value`` and become ``--section.key value``; they are checked by torchtitan's own
parser (``ConfigManager`` + tyro) against the real config dataclasses, in a child process
(:mod:`cookbook.recipes.titan_parse`): torchtitan imports triton at module level, and the validating process
(login node, notebook kernel) imports neither.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cookbook.paths import cache_dir, write_atomically
from cookbook.profiling.enable import schedule
from cookbook.recipes.base import (
    PROGRAMS,
    RUNTIME_PARENT,
    HubFetch,
    Launch,
    Recipe,
    StartPath,
    is_hub_id,
    path_problem,
    program_source,
    register_factory,
    register_recipe,
)
from cookbook.recipes.shims import shim_launch
from cookbook.spec import JobSpec
from cookbook.versions import tested_version
from cookbook_runtime import titan_import

CONFIG_MODULE = f"{PROGRAMS}.cookbook_titan"  # its trainer, cookbook_titan_trainer, saves on a stop request
_MODULE_FILE = program_source(CONFIG_MODULE)

# torchtitan 0.3.0 fields naming files or folders the job reads at start-up (checked when on this
# filesystem, and by `cookbook rehearse` on every node). FLUX's encoders/tokenizers take a folder or a Hub id.
CONFIG_PATHS = (
    StartPath("hf_assets_path", None, "", "dir", "the model's tokenizer/assets folder"),
    StartPath("dataloader.dataset_path", None, "", "dir", "the training dataset folder"),
    StartPath("validator.dataloader.dataset_path", None, "", "dir", "the validation dataset folder"),
    StartPath("checkpoint.initial_load_path", None, "", "dir", "the initial checkpoint"),
    StartPath("encoder.autoencoder_path", None, "", "file", "FLUX's autoencoder"),
    *(
        StartPath(key, None, "", "dir", what, hub_ok=True)
        for key, what in (
            ("encoder.t5_encoder", "the T5 encoder"),
            ("encoder.clip_encoder", "the CLIP encoder"),
            ("tokenizer.t5_tokenizer_path", "the T5 tokenizer"),
            ("tokenizer.clip_tokenizer_path", "the CLIP tokenizer"),
            ("model_spec.model.t5_encoder.version", "the T5 encoder"),
            ("model_spec.model.clip_encoder.version", "the CLIP encoder"),
        )
    ),
)
PATH_KEYS = tuple(sp.key for sp in CONFIG_PATHS)


class _ParserProcess:
    """One child running :mod:`cookbook.recipes.titan_parse`, started on first use, kept for the process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[str]:
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, [str(RUNTIME_PARENT), package_root, os.environ.get("PYTHONPATH")]))
        return subprocess.Popen(
            [sys.executable, "-m", "cookbook.recipes.titan_parse"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )

    def ask(self, args: list[str], path: tuple[str, ...] = ()) -> dict[str, Any]:
        return self.request({"args": args, "modules": list(path)})

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The child's answer, from the disk cache when the same request met the same files before."""
        cached = _answer_cache(request)
        if cached.is_file():
            try:
                answer: dict[str, Any] = json.loads(cached.read_text())
                return answer
            except (OSError, ValueError):
                pass
        answer = self._ask_child(request)
        if "exited" not in answer.get("error", ""):
            write_atomically(cached, json.dumps(answer))
        return answer

    def _ask_child(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            for _ in range(2):  # a child that died (killed, out of memory) is started again once
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                assert self._proc.stdin and self._proc.stdout
                try:
                    self._proc.stdin.write(json.dumps(request) + "\n")
                    self._proc.stdin.flush()
                    line = self._proc.stdout.readline()
                except BrokenPipeError:
                    line = ""
                if line:
                    answer: dict[str, Any] = json.loads(line)
                    return answer
                self._proc = None
        return {"config": None, "fields": [], "error": "torchtitan's config parser (a child process) exited"}


def _answer_cache(request: dict[str, Any]) -> Path:
    """Where the parser's answer to ``request`` is kept: keyed by the request, torchtitan's version and the
    content of every file the answer depends on (the parser, the config modules), so an edit misses the cache.
    Starting the parser costs ~6 s of CPU (torchtitan's imports); a repeated render or notebook run pays none."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode())
    digest.update(importlib.metadata.version("torchtitan").encode())
    here = Path(__file__).parent
    files = [here / "titan_parse.py", Path(titan_import.__file__), *sorted(_MODULE_FILE.parent.glob("*.py"))]
    for name in request.get("modules") or ():
        files += sorted(Path(name).parent.glob("*.py")) if Path(name).is_file() else [Path(name)]
    args = request.get("args") or []
    module = args[args.index("--module") + 1] if "--module" in args[:-1] else ""
    for folder in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):  # a --module found there
        files.append(Path(folder) / f"{module.replace('.', '/')}.py")
    for f in files:
        digest.update(str(f).encode())
        digest.update(f.read_bytes() if f.is_file() else b"-")
    return cache_dir() / "titan-parse" / f"{digest.hexdigest()}.json"


_PARSER = _ParserProcess()


@functools.lru_cache(maxsize=256)
def _parsed(args: tuple[str, ...], path: tuple[str, ...] = ()) -> dict[str, Any]:
    return _PARSER.ask(list(args), path)


@functools.cache
def dataset_paths() -> dict[str, str]:
    """torchtitan's dataset tables, ``{dataset name: path}``: a path not under ``tests/`` is a Hub id that every
    rank fetches when ``dataloader.dataset_path`` is unset (``c4`` is ``allenai/c4``)."""
    return dict(_PARSER.request({"datasets": True}).get("datasets") or {})


def _namespace(value: Any) -> Any:
    """Plain data with attribute access, as the parsed config reads (``cfg.parallelism.tensor_parallel_degree``)."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


def cli_args(overrides: dict[str, str]) -> list[str]:
    """``key=value`` overrides as torchtitan (tyro) flags; booleans are flags: ``--a.b`` / ``--a.no-b``."""
    args: list[str] = []
    for key, value in overrides.items():
        if value.lower() in ("true", "false"):
            section, _, leaf = key.rpartition(".")
            flag = key if value.lower() == "true" else f"{section + '.' if section else ''}no-{leaf}"
            args.append(f"--{flag}")
        else:
            args += [f"--{key}", value]
    return args


def parse_config(
    config: str, overrides: dict[str, str], module: str = CONFIG_MODULE, path: tuple[str, ...] = ()
) -> tuple[Any, str]:
    """Run torchtitan's own parser on ``--module MODULE --config CONFIG`` + overrides, in a child process
    (:mod:`cookbook.recipes.titan_parse`; ``path``: files of config modules of one's own). Returns
    ``(config as attributes or None, error text)``."""
    answer = _parsed(("--module", module, "--config", config, *cli_args(overrides)), path)
    return (_namespace(answer["config"]) if answer["config"] is not None else None), answer["error"]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BOX = re.compile(r"[\u2500-\u257f]")  # tyro's box-drawing characters (borders and rules)


def tyro_reason(err: str, overrides: dict[str, str] | None = None) -> str:
    """The reason in tyro's error box, on one line, e.g. ``Error parsing --training.steps: invalid literal
    for int() with base 10: 'many' (expected: --training.steps INT)``.

    tyro draws title / reason / [argument helptext] / "For full helptext" sections, with or without
    colours and box characters, wrapping long lines. Flags it spells with dashes are given back as the
    override keys the user typed. Text that is not such a box comes back as its last line.
    """
    raw = [_ANSI.sub("", line) for line in err.splitlines()]
    lines = [_BOX.sub(" ", line).strip() for line in raw]
    is_rule = [not line.strip("-") for line in lines]  # a rule, a box edge or a blank line
    # the title: the box's top edge (UTF-8 boxes), else the line above the first dashed rule
    top = next(
        (i for i, line in enumerate(raw) if "\u256d" in line),
        next((i - 1 for i, line in enumerate(lines) if i and line and is_rule[i]), None),
    )
    sections: list[list[str]] = [[]]
    for i in range(top + 1 if top is not None else len(lines), len(lines)):
        if not is_rule[i]:
            sections[-1].append(lines[i])
        elif sections[-1]:
            sections.append([])
    sections = [sec for sec in sections if sec]
    reason_at = next(
        (
            i
            for i, sec in enumerate(sections)
            if not sec[0].startswith(("Argument helptext", "For full helptext", "Available subcommands"))
        ),
        None,
    )
    if reason_at is None:
        return next((line for line in reversed(lines) if line), err.strip())
    reason = " ".join(sections[reason_at])
    helptext = next((s for s in sections if s[0].startswith("Argument helptext") and len(s) > 1), None)
    if helptext:
        reason += f" (expected: {helptext[1]})"
    for key in overrides or {}:
        reason = reason.replace(f"--{key.replace('_', '-')}", f"--{key}")
    return reason


@functools.cache
def _known_fields(config: str, module: str = CONFIG_MODULE, path: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(_parsed(("--module", module, "--config", config), path)["fields"])


# why the GPU configs in the runtime's cookbook_titan.py depart from torchtitan's defaults (values: its functions)
INTENT = {
    "profiler.enable_profiling": "profile on request only (torchtitan's llama3_8b traces all ranks every 100 steps)",
    "comm.train_timeout_seconds": "the 100 s default is shorter than a checkpoint save to a shared filesystem",
}


# torchtitan: FSDP2 MixedPrecision (fp32 params/grads/AdamW, bf16 compute), fp32 cross-entropy.
PLANNER_SETTINGS: dict[str, Any] = {"master_weights_fp32": True, "optimizer_state_bytes": 4, "loss": "fp32"}
MEMORY_SUBDIR = "profiling/memory_snapshot"  # torchtitan's memory snapshots, relative to --dump_folder
WANDB_FOLDER = "wandb"  # --tracker wandb: metrics.save_tb_folder, relative to --dump_folder


def _parallel_problems(cfg: Any, spec: JobSpec) -> list[str]:
    """The parsed config's parallel degrees and batch sizes against the job's GPUs per node and world size."""
    problems = []
    par = cfg.parallelism
    tp, pp, cp = par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree
    if tp > 1 and spec.procs_per_node % tp:
        problems.append(
            f"parallelism.tensor_parallel_degree={tp} must divide GPUs per node "
            f"({spec.procs_per_node}): tensor parallelism stays inside a node"
        )
    fixed = tp * pp * cp
    if spec.world_size % fixed:
        problems.append(
            f"world size {spec.world_size} is not a multiple of tp*pp*cp = {fixed}: change the "
            "parallel degrees or the node count"
        )
    dp_shard = par.data_parallel_shard_degree
    if dp_shard > 0 and fixed * dp_shard * max(par.data_parallel_replicate_degree, 1) != spec.world_size:
        problems.append(
            f"dp_replicate*dp_shard*tp*pp*cp must equal the world size {spec.world_size}; "
            "set parallelism.data_parallel_shard_degree=-1 to fill the rest"
        )
    if cfg.training.local_batch_size < 1:
        problems.append(f"training.local_batch_size={cfg.training.local_batch_size}: use a positive integer")
    gb = cfg.training.global_batch_size
    if gb > 0 and gb % (cfg.training.local_batch_size * max(spec.world_size // fixed, 1)):
        problems.append(
            f"training.global_batch_size={gb} must be a multiple of local_batch_size x "
            "data-parallel size (gradient accumulation steps are whole)"
        )
    return problems


def _path_problems(spec: JobSpec) -> list[str]:
    """Each path override that is missing on this filesystem (:func:`path_problem`: where it can tell)."""
    problems = []
    for key in PATH_KEYS:
        if key in spec.overrides and (
            p := path_problem(
                key, spec.overrides[key], "download or copy it there first, or point the key at where it is"
            )
        ):
            problems.append(p)
    return problems


class TorchtitanRecipe(Recipe):
    framework = "torchtitan"
    packages = ("torch", "torchtitan")
    trains = True
    config_paths = CONFIG_PATHS
    trace_subdir = "profiling/traces"  # relative to --dump_folder (the run folder)
    planner_keys = {
        "training.local_batch_size": "micro_batch",
        "training.seq_len": "seq_len",
        "training.gradient_accumulation_steps": "grad_accum",
        "activation_checkpoint.mode": "checkpointing",
        "parallelism.tensor_parallel_degree": "tp",
        "parallelism.data_parallel_shard_degree": "shard_group",
        "training.compile": "compile",
        "compile.enable": "compile",
        "parallelism.fsdp_reshard_after_forward": "reshard_after_forward",
        "training.img_size": "image_size",
        "encoder.max_t5_encoding_len": "text_tokens",
    }
    typed_config = True  # its parser names a word where a number belongs
    checkpointing_values = {"none": "none", "selective": "selective", "full": "full"}  # activation_checkpoint.mode
    positive_keys = {
        "optimizer.lr": "the learning rate",
        "training.steps": "the training steps",
        "training.local_batch_size": "the batch size per GPU",
        "training.seq_len": "the sequence length",
    }
    intent: dict[str, str] = INTENT
    config_fn: str  # function in cookbook_titan.py
    config_module: str = CONFIG_MODULE  # --module
    module_path: tuple[str, ...] = ()  # a module of one's own: its file, imported by the parser first
    # the config builds the cookbook's trainer (cookbook_titan_trainer.py), which logs to MLflow on request
    mlflow_logger: bool = True
    planner_base_settings = PLANNER_SETTINGS
    save_interval_key = "checkpoint.interval"  # GPU jobs get the planner's interval (torchtitan's default: 500)

    def settable(self, key: str) -> bool:
        """A field of the recipe's config as torchtitan's own parser lists it (0.3.0 has no
        ``activation_checkpoint.mode``)."""
        spec = JobSpec(recipe=self.name)
        return key in _known_fields(self.config_name(spec), self.module_name(spec), self.module_path)

    def profiling_overrides(
        self, *, device: str = "cuda", steps: int = 3, warmup: int = 1, start_step: int = 3, memory: bool = False
    ) -> dict[str, str]:
        """torchtitan's ``profiler`` section: one cycle (``profiler_repeat=1``); torchtitan waits
        ``profile_freq - (warmup + active)`` steps first."""
        sched = schedule(steps=steps, warmup=warmup, start_step=start_step)
        if memory and not device.startswith("cuda"):
            raise ValueError("memory snapshots need a CUDA device (torch.cuda.memory._record_memory_history)")
        out = {
            "profiler.enable_profiling": "True",
            "profiler.profile_freq": str(sched.last_traced_step),
            "profiler.profiler_warmup": str(sched.warmup),
            "profiler.profiler_active": str(sched.active),
            "profiler.profiler_repeat": "1",
            "profiler.save_traces_folder": self.trace_subdir,
        }
        if memory:
            out.update(
                {
                    "profiler.enable_memory_snapshot": "True",
                    "profiler.memory_snapshot_freq": str(sched.last_traced_step),
                    "profiler.save_memory_snapshot_folder": MEMORY_SUBDIR,
                }
            )
        return out

    def gpu_paths(self) -> list[StartPath]:
        """The start-up paths of the GPU config (the tiny ``local-cpu`` config sets its own)."""
        return []

    def launch_overrides(self, spec: JobSpec) -> dict[str, str]:
        """Flags the script adds before the user's overrides (may use ``$SLURM_JOB_NUM_NODES``)."""
        return {}

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        return [] if spec.local_cpu else self.gpu_paths()

    def expected_config(self, spec: JobSpec) -> dict[str, tuple[object, str]]:
        if spec.local_cpu:
            return {}
        cfg, _ = self.parse(spec, {})
        launch = self.launch_overrides(spec)
        out: dict[str, tuple[object, str]] = {}
        for key, why in self.intent.items():
            value: object = cfg
            for part in key.split("."):
                value = getattr(value, part, None)
            out[key] = (launch.get(key, value), why)
        return out

    def hub_fetches(self, spec: JobSpec) -> list[HubFetch]:
        """The start paths' Hub ids, and each dataset torchtitan streams from the Hub when its ``dataset_path`` is
        unset (its own tables: ``c4`` is ``allenai/c4``, FLUX's ``cc12m-wds`` ``pixparse/cc12m-wds``)."""
        out = super().hub_fetches(spec)
        cfg, _ = (None, "") if spec.local_cpu else self.parse(spec, self.effective_overrides(spec))
        if cfg is None:
            return out
        loaders = [("dataloader", cfg.dataloader)]
        if getattr(cfg.validator, "enable", False):
            loaders.append(("validator.dataloader", cfg.validator.dataloader))
        for section, loader in loaders:
            repo = dataset_paths().get(str(getattr(loader, "dataset", "")), "")
            if loader.dataset_path or not is_hub_id(repo) or repo in {f.repo_id for f in out}:
                continue
            # torchtitan loads C4 with name="en": the repo's README (its configs) and the en/ files are what it reads
            allow = ("README.md", "en/*") if repo == "allenai/c4" else ()
            out.append(HubFetch(repo, "dataset", f"{section}.dataset_path", allow=allow))
        return out

    def parse(self, spec: JobSpec, overrides: dict[str, str]) -> tuple[Any, str]:
        """torchtitan's parser on this recipe's module and config plus ``overrides`` (see :func:`parse_config`)."""
        return parse_config(self.config_name(spec), overrides, self.module_name(spec), self.module_path)

    def tracker_overrides(self, spec: JobSpec) -> dict[str, str]:
        """torchtitan 0.3.0's metrics options for ``spec.tracker`` (TensorBoard and W&B; W&B reads its run id,
        name and project from the environment the script's tracker block sets). MLflow has no option: the
        cookbook's trainer (``cookbook_titan_trainer.py``) adds its logger when ``COOKBOOK_TRACKER=mlflow``."""
        if spec.tracker == "tensorboard":
            # torchtitan adds a folder per start (time stamp) under it: the run's starts side by side
            return {"metrics.enable_tensorboard": "true", "metrics.save_tb_folder": "tensorboard/$COOKBOOK_RUN_NAME"}
        if spec.tracker == "wandb":
            return {"metrics.enable_wandb": "true", "metrics.save_tb_folder": WANDB_FOLDER}
        return {}

    def wandb_offline_runs(self, spec: JobSpec) -> str:
        """torchtitan 0.3.0 passes ``wandb.init`` its own folder, ``dump_folder/save_tb_folder/<YYYYmmdd-HHMM>``
        (one per start; torchtitan/components/metrics.py ``_build_metric_logger``), not ``$WANDB_DIR``."""
        return f'"$RUN_DIR"/{WANDB_FOLDER}/*/wandb/offline-run-*-"$WANDB_RUN_ID"'

    def effective_overrides(self, spec: JobSpec) -> dict[str, str]:
        """What torchtitan's parser sees at validation: the launch flags with this job's node count, the
        tracker's options, the start paths, then the user's overrides."""
        launch = {k: v.replace("$SLURM_JOB_NUM_NODES", str(spec.nodes)) for k, v in self.launch_overrides(spec).items()}
        paths = {k: v for k, v in self.start_path_values(spec).items()}
        return {**launch, **self.save_overrides(spec), **self.tracker_overrides(spec), **paths, **spec.overrides}

    def config_name(self, spec: JobSpec) -> str:
        return self.config_fn + ("_tiny" if spec.local_cpu else "")

    def module_name(self, spec: JobSpec) -> str:
        """``--module``: the runtime's ``cookbook_titan`` (a config function of one's own: its module)."""
        return self.config_module

    def validate(self, spec: JobSpec) -> list[str]:
        """The tracker and override keys first, then torchtitan's own parse, its parallel degrees and paths."""
        problems = self._key_problems(spec)
        if problems:
            return problems
        cfg, err = self.parse(spec, self.effective_overrides(spec))
        if cfg is None:
            return [f"torchtitan rejects the overrides: {tyro_reason(err, spec.overrides)}"]
        return _parallel_problems(cfg, spec) + _path_problems(spec)

    def _key_problems(self, spec: JobSpec) -> list[str]:
        """MLflow where the config cannot log to it, keys the tracker sets itself, keys torchtitan does not know."""
        problems = []
        name = self.config_name(spec)
        if spec.tracker == "mlflow" and not self.mlflow_logger:
            problems.append(
                f"torchtitan {tested_version('torchtitan')} logs to TensorBoard and W&B only; MLflow is the "
                "cookbook's trainer's (the named recipes' configs build it), which a module of one's own does not "
                "use: --tracker tensorboard or wandb"
            )
        mine = [k for k in spec.overrides if k in self.tracker_overrides(spec)]
        if mine:
            problems.append(f"--tracker {spec.tracker} sets {', '.join(mine)} itself: drop it (or use --tracker none)")
        known = _known_fields(name, self.module_name(spec), self.module_path)
        for key in spec.overrides:
            if known and key not in known:
                leaf = key.rsplit(".", 1)[-1]
                hint = [k for k in known if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(key, known, 3)
                problems.append(
                    f"override key {key!r} is not a torchtitan {tested_version('torchtitan')} config field"
                    + (f": did you mean {' or '.join(hint[:3])}?" if hint else "")
                )
        return problems

    def command(self, spec: JobSpec) -> Launch:
        args = ["--module", self.module_name(spec), "--config", self.config_name(spec), "--dump_folder", "$RUN_DIR"]
        user = {k: v for k, v in spec.overrides.items() if k not in self.start_args(spec)}
        args += cli_args(
            {
                **self.launch_overrides(spec),
                **self.save_overrides(spec),
                **self.tracker_overrides(spec),
                **self.start_args(spec),
                **user,
            }
        )
        if spec.local_cpu:
            return shim_launch(spec, "torchtitan", tuple(args))
        return Launch("torchrun", ("-m", "torchtitan.train", *args), self.start_variables(spec))

    def model_overrides(self, model_dir: str) -> dict[str, str]:
        """The download as ``hf_assets_path`` (Llama's tokenizer; FLUX's autoencoder and configs are inside it)."""
        return {"hf_assets_path": str(model_dir).rstrip("/")}

    def resume(self, spec: JobSpec) -> list[str]:
        """torchtitan loads the newest COMPLETE ``step-N`` (one with DCP's ``.metadata``) under
        ``$RUN_DIR/checkpoint`` by itself (checkpoint.enable); a save cut short by the requeue is skipped: the
        runtime says which it will pick."""
        return ["--resume=torchtitan"]


class Llama3_8BC4(TorchtitanRecipe):
    name = "llama3_8b_c4"
    description = "Llama-3.1-8B pretraining on C4, torchtitan (FSDP2 [+TP/PP/CP])"
    config_fn = "llama3_8b_c4"
    model_repo = "meta-llama/Llama-3.1-8B"  # its tokenizer only: the model trains from scratch
    model_folder = model_repo.rsplit("/", 1)[-1]
    planner_model = "llama3_1_8b"
    planner_settings = {"seq_len": 8192, "micro_batch": 2, "checkpointing": "selective"}
    planner_source = "torchtitan llama3_8b (seq 8192, selective op AC); bs 2 as in torchtitan docs/performance.md"

    def gpu_paths(self) -> list[StartPath]:
        return [
            StartPath(
                "hf_assets_path",
                "MODEL_DIR",
                f"$RECIPE_DIR/models/{self.model_folder}",
                "dir",
                f"the Llama-3.1-8B tokenizer (`cookbook download {self.model_repo}`)",
                ("tokenizer.json", "tokenizer_config.json"),
                repo_id=self.model_repo,
                repo_files=("*.json", "original/tokenizer.model"),  # the tokenizer and configs, not the weights
            )
        ]


class FluxSchnell(TorchtitanRecipe):
    name = "flux_schnell"
    description = "FLUX.1-schnell training on cc12m, torchtitan"
    config_fn = "flux_schnell"
    model_repo = "black-forest-labs/FLUX.1-schnell"  # its autoencoder and configs: the transformer trains from scratch
    model_folder = model_repo.rsplit("/", 1)[-1]
    # local-cpu: a FLUX sized to the tiny assets, a config of the local bench (the shipped module imports none)
    tiny_module = "cookbook.local.compat.titan_tiny_configs"
    planner_model = "flux_schnell"
    # the Nebius guide's flux_schnell_model.toml; the runtime's cookbook_titan.py keeps a copy (tests/unit/test_facts)
    images_per_gpu = 32
    planner_settings = {
        "micro_batch": images_per_gpu,
        "checkpointing": "full",
        "shard_group": 8,
        "reshard_after_forward": False,
        "image_size": 256,
        "text_tokens": 256,
    }
    planner_source = (
        f"Nebius flux_schnell_model.toml (img 256, T5 256 tokens, full AC, HSDP 2x8, no reshard "
        f"after forward, {images_per_gpu} images/GPU/step; its published log's memory and rate are at the 64 "
        "its tps x step time imply)"
    )
    intent = {
        **INTENT,
        "training.local_batch_size": f"the Nebius guide's {images_per_gpu} images per GPU",
        "parallelism.data_parallel_replicate_degree": "HSDP as the Nebius guide: one replica per node",
    }

    def module_name(self, spec: JobSpec) -> str:
        return self.tiny_module if spec.local_cpu else self.config_module

    def gpu_paths(self) -> list[StartPath]:
        return [
            StartPath(
                "hf_assets_path",
                "FLUX_DIR",
                f"$RECIPE_DIR/models/{self.model_folder}",
                "dir",
                f"the FLUX.1-schnell download (`cookbook download {self.model_repo}`)",
                ("model_index.json",),
                repo_id=self.model_repo,
                repo_files=("*.json", "ae.safetensors"),  # the autoencoder and configs: the transformer trains anew
            ),
            StartPath(
                "encoder.autoencoder_path",
                None,
                "$FLUX_DIR/ae.safetensors",
                "file",
                "FLUX's autoencoder (inside the FLUX.1-schnell download)",
            ),
            StartPath(
                "encoder.t5_encoder",
                "T5_DIR",
                "google/t5-v1_1-xxl",
                "dir",
                "the T5 text encoder: a Hub id (nodes need internet) or a local folder",
                hub_ok=True,
            ),
            StartPath(
                "tokenizer.t5_tokenizer_path", None, "$T5_DIR", "dir", "the T5 tokenizer (same folder)", hub_ok=True
            ),
            StartPath(
                "encoder.clip_encoder",
                "CLIP_DIR",
                "openai/clip-vit-large-patch14",
                "dir",
                "the CLIP text encoder: a Hub id (nodes need internet) or a local folder",
                hub_ok=True,
            ),
            StartPath(
                "tokenizer.clip_tokenizer_path",
                None,
                "$CLIP_DIR",
                "dir",
                "the CLIP tokenizer (same folder)",
                hub_ok=True,
            ),
        ]

    def launch_overrides(self, spec: JobSpec) -> dict[str, str]:
        # HSDP as the Nebius guide: one replica per node, sharded over the node's GPUs (shard degree -1 fills)
        if spec.local_cpu:
            return {}
        return {"parallelism.data_parallel_replicate_degree": "$SLURM_JOB_NUM_NODES"}


register_recipe(Llama3_8BC4())
register_recipe(FluxSchnell())


# ---------------------------------------------------------------- bring your own model/config module
class TitanModule(TorchtitanRecipe):
    """Any torchtitan model/config module, ``titan:MODULE:CONFIG`` as torchtitan's ``--module/--config``:
    MODULE a torchtitan module (``llama3``, ``deepseek_v3``, a dotted path) or a ``.py`` file of one's own
    (copied next to the script; it may import torchtitan's registries and change what it needs), CONFIG a
    function in it returning the ``Trainer.Config``. Validated by torchtitan's own parser like the named
    recipes; ``local-cpu`` runs the config as it is (a tiny one)."""

    intent: dict[str, str] = {}
    mlflow_logger = False  # its config builds torchtitan's own trainer

    def __init__(self, module: str, config: str, path: Path | None):
        self.config_module, self.config_fn, self.path = module, config, path
        self.module_path = (str(path),) if path else ()
        self.name = f"titan:{path or module}:{config}"  # the registry sets the name as typed
        self.description = f"{f'your module {path}' if path else f'torchtitan module {module}'}, config {config}"

    def config_name(self, spec: JobSpec) -> str:
        return self.config_fn

    def expected_config(self, spec: JobSpec) -> dict[str, tuple[object, str]]:
        return {}

    def validate(self, spec: JobSpec) -> list[str]:
        cfg, err = self.parse(spec, {})
        if cfg is None:
            return [
                f"torchtitan cannot load --module {self.config_module} --config {self.config_fn}: {tyro_reason(err)}"
            ]
        return super().validate(spec)

    def warnings(self, spec: JobSpec) -> list[str]:
        cfg, _ = self.parse(spec, self.effective_overrides(spec))
        if spec.requeue and cfg is not None and not cfg.checkpoint.enable:
            return [
                "checkpoint.enable is off in this config: a requeued job starts again from step 0 "
                "(--set checkpoint.enable=true --set checkpoint.interval=N to resume)"
            ]
        return []

    def files(self, spec: JobSpec) -> dict[str, str]:
        return {self.path.name: self.path.read_text()} if self.path else {}


@functools.cache
def own_module(rest: str) -> TitanModule:
    """``titan:MODULE:CONFIG``; KeyError with one line naming what to change."""
    module, sep, config = rest.rpartition(":")
    if not sep or not module or not config.isidentifier():
        raise KeyError(
            f"titan:{rest}: use titan:MODULE:CONFIG, MODULE a torchtitan module (e.g. llama3) or a .py file, "
            "CONFIG the function returning its config (e.g. titan:llama3:llama3_debugmodel)"
        )
    if not module.endswith(".py"):
        return TitanModule(module, config, None)
    path = Path(module).expanduser().resolve()
    if not path.is_file():
        raise KeyError(f"titan:{rest}: no such config module {module}")
    if not path.stem.isidentifier() or path.stem in (PROGRAMS.partition(".")[0], "torchtitan", "torch"):
        raise KeyError(f"titan:{rest}: rename {path.name}: its name must be a Python module name of its own")
    return TitanModule(path.stem, config, path)


register_factory("titan", own_module, "titan:MODULE:CONFIG (MODULE a torchtitan module or a .py file)")
