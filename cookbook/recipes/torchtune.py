"""torchtune 0.6.1 recipes: Llama-3.3-70B full and LoRA finetuning, multi-node.

The config is torchtune's own built-in YAML (loaded with OmegaConf from the installed package)
plus the user's overrides; every override key must exist in it, be a parameter of the component
it sits under, or be an optional key the recipe reads (``cfg.get("...")`` in the recipe source).
The written YAML is the merged config, so the script's ``tune run`` needs no hidden overrides.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import json
import re
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cookbook.paths import cache_dir, write_atomically
from cookbook.profiling.enable import schedule
from cookbook.recipes.base import (
    PROGRAMS,
    Dataset,
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
from cookbook.spec import JobSpec, SpecError
from cookbook.versions import requirement, tested_version

_CONFIGS = Path(__file__).parent / "configs"
# the recipe subclass that saves on preemption and resumes mid-epoch, a program of the runtime (run as a module:
# `tune run ... cookbook_runtime.programs.cookbook_tune RECIPE --config ...`)
SUBCLASS_MODULE = f"{PROGRAMS}.cookbook_tune"
SUBCLASS_FILE = program_source(SUBCLASS_MODULE)
# omegaconf is imported inside the functions that use it, for start-up speed (`cookbook --help`, `recipes`)
if TYPE_CHECKING:
    from omegaconf import DictConfig

TP_PLAN = "torchtune.models.llama3.base_llama_tp_plan"
# what a Hugging Face download of a Llama 3.x model holds that torchtune's HF checkpointer reads
MODEL_FILES = ("config.json", "original/tokenizer.model")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def env_interpolation(value: str) -> str:
    """``$MODEL_DIR/x`` -> ``${oc.env:MODEL_DIR}/x``: the YAML reads the script's variable at run time."""
    return _VAR.sub(lambda m: "${oc.env:" + m.group(1) + "}", value)


@functools.cache
def _torchtune_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("recipes")  # torchtune ships its recipes as package `recipes`
    if spec is None or spec.origin is None:
        raise RuntimeError(f"torchtune's recipes are not installed: pip install '{requirement('torchtune')}'")
    return Path(spec.origin).parent


def builtin_config(name: str) -> DictConfig:
    """A torchtune built-in config (e.g. ``llama3_3/70B_lora``) as loaded by ``tune run``."""
    return _load_dict(_torchtune_root() / "configs" / f"{name}.yaml")


def _load_dict(path: Path) -> DictConfig:
    """A YAML config file that must be a mapping (torchtune's configs all are)."""
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"{path}: a config must be a mapping, not a list")
    return cfg


@functools.cache
def optional_keys(recipe_file: str) -> frozenset[str]:
    """Top-level keys a torchtune recipe reads with ``cfg.get("key")`` (valid even when absent), the recipe
    subclass's own included (``save_every_n_steps``)."""
    text = (_torchtune_root() / f"{recipe_file}.py").read_text() + SUBCLASS_FILE.read_text()
    return frozenset(re.findall(r'cfg\.get\(\s*"([A-Za-z_][A-Za-z0-9_]*)"', text))


def leaf_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of ``cfg`` (leaves and sections)."""
    from omegaconf import DictConfig

    keys = []
    for k, v in cfg.items_ex(resolve=False) if hasattr(cfg, "items_ex") else cfg.items():
        key = prefix + str(k)
        keys.append(key)
        if isinstance(v, DictConfig):
            keys += leaf_keys(v, key + ".")
    return keys


# torchtune's own components (``torchtune.``...) are described from a disk cache: loading one imports torchtune,
# torchao and torch._dynamo (~7 s of CPU on a login node, for every render and notebook kernel)
_CACHED_PREFIX = "torchtune."
_SCALARS = (str, int, float, bool, type(None))


@functools.cache
def _component_signature(target: str) -> dict[str, Any] | None:
    """A ``_component_`` callable's ``{"params": names or None (it takes **kwargs), "defaults": {name: value}}``
    (scalar defaults only; ``"opaque"``: parameters with other defaults); None when it cannot load. torchtune's
    own components come from a cache keyed by the installed torch, torchao and torchtune versions."""
    if not target.startswith(_CACHED_PREFIX):
        return _load_signature(target)
    cache = _signature_cache()
    try:
        known: dict[str, Any] = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if target in known:
        entry: dict[str, Any] | None = known[target]
        return entry
    entry = _load_signature(target)
    write_atomically(cache, json.dumps({**known, target: entry}, sort_keys=True))
    return entry


def _signature_cache() -> Path:
    """The cache file of the installed versions (a new torchtune, torchao or torch starts an empty one)."""
    versions = "-".join(f"{p}{metadata.version(p)}" for p in ("torch", "torchao", "torchtune"))
    return cache_dir() / "tune-components" / f"{hashlib.sha256(versions.encode()).hexdigest()[:16]}.json"


def _load_signature(target: str) -> dict[str, Any] | None:
    """``target`` imported and inspected, as torchtune's ``instantiate`` resolves it."""
    from torchtune.config._errors import InstantiationError
    from torchtune.config._utils import _get_component_from_path  # what torchtune's instantiate resolves

    try:
        params = list(inspect.signature(_get_component_from_path(target)).parameters.values())
    except (ImportError, AttributeError, ValueError, TypeError, InstantiationError):
        return None
    given = [p for p in params if p.default is not inspect.Parameter.empty]
    return {
        "params": None if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params) else [p.name for p in params],
        "defaults": {p.name: p.default for p in given if isinstance(p.default, _SCALARS)},
        "opaque": sorted(p.name for p in given if not isinstance(p.default, _SCALARS)),
    }


def _component_params(target: str) -> set[str] | None:
    """Parameter names of a ``_component_`` callable; None when it takes ``**kwargs`` or cannot load."""
    signature = _component_signature(target)
    return None if signature is None or signature["params"] is None else set(signature["params"])


def _component_default(target: str, name: str) -> Any:
    """The default of parameter ``name`` of a ``_component_`` callable (None: none, or it cannot load); e.g.
    ``alpaca_dataset``'s ``source`` is ``tatsu-lab/alpaca`` when the config does not set it."""
    signature = _component_signature(target)
    if signature is None:
        return None
    if name in signature["opaque"]:  # a default the cache does not keep (not a plain value): the callable's own
        from torchtune.config._utils import _get_component_from_path

        return inspect.signature(_get_component_from_path(target)).parameters[name].default
    return signature["defaults"].get(name)


def suggest_key(key: str, keys: list[str]) -> list[str]:
    """Likely intended keys: same leaf name deeper in the config, else close spellings."""
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf and k != key]
    return same_leaf or difflib.get_close_matches(key, keys, n=3, cutoff=0.6)


def _component_of(cfg: DictConfig, overrides: dict[str, str], parent: str) -> str | None:
    """The ``_component_`` that keys under ``parent`` configure: the override's own, else the config's
    (for an absent ``tensor_parallel_plan``, the plan :meth:`TorchtuneRecipe.config` writes); None if none."""
    from omegaconf import DictConfig, OmegaConf

    if f"{parent}._component_" in overrides:
        return overrides[f"{parent}._component_"]
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False)
    if isinstance(node, DictConfig) and "_component_" in node:
        return str(node["_component_"])
    return TP_PLAN if parent == "tensor_parallel_plan" and node is None else None


def check_override_keys(cfg: DictConfig, overrides: dict[str, str], recipe_file: str) -> list[str]:
    """Problems with override keys that the recipe would ignore or reject."""
    from omegaconf import OmegaConf

    keys, problems = leaf_keys(cfg), []
    optional = optional_keys(recipe_file)
    for key in overrides:
        if key in keys:
            continue
        parent, _, leaf = key.rpartition(".")
        component = _component_of(cfg, overrides, parent) if parent and leaf != "_component_" else None
        if component is not None:
            # torchtune instantiates the section as component(**keys): each key must be a parameter of it
            params = _component_params(component)
            if params is None or leaf in params:
                continue
            hint = [f"{parent}.{p}" for p in difflib.get_close_matches(leaf, sorted(params), n=3, cutoff=0.6)] or [
                k for k in keys if k.rsplit(".", 1)[-1] == leaf
            ]
            where = (
                f"did you mean {' or '.join(hint)}?"
                if hint
                else f"it takes {', '.join(sorted(params)) or 'no parameters'}"
            )
            problems.append(
                f"override key {key!r} is not a parameter of {parent}'s _component_ {component} "
                f"(torchtune would fail to instantiate it): {where}"
            )
            continue
        if key.split(".")[0] in optional:
            if parent and leaf != "_component_" and OmegaConf.select(cfg, parent) is None:
                # a section the config does not have: torchtune instantiates it, so it needs a _component_
                problems.append(
                    f"override key {key!r}: the config has no {parent} section; torchtune builds it "
                    f"from {parent}._component_, so set that too (e.g. --set {parent}._component_=...)"
                )
            continue
        hint = suggest_key(key, keys)
        where = f"did you mean {' or '.join(hint)}?" if hint else "see `tune cp` of the config for its keys"
        problems.append(f"override key {key!r} is not in the config (the recipe would ignore it): {where}")
    return problems


def dataset_block(dataset: Dataset, *, packed: bool = False, train_on_input: bool | None = None) -> dict[str, Any]:
    """The ``dataset:`` mapping a torchtune recipe config takes for ``dataset``."""
    block: dict[str, Any] = {"_component_": dataset.component, **dataset.builder_kwargs(), "packed": packed}
    if train_on_input is not None and dataset.style != "text":
        block["train_on_input"] = train_on_input
    return block


_LOGGING = "torchtune.training.metric_logging."


def metric_logger(tracker: str) -> dict[str, Any] | None:
    """torchtune's ``metric_logger`` section for ``tracker`` (None: the config's own, DiskLogger). Run names,
    ids, folders and credentials come from the environment the script's tracker block sets (``cookbook.tracking``):
    the loggers read ``MLFLOW_*`` themselves, wandb.init reads ``WANDB_RUN_ID``/``WANDB_NAME``/``WANDB_RESUME``."""
    loggers: dict[str, dict[str, Any]] = {
        "tensorboard": {
            "_component_": _LOGGING + "TensorBoardLogger",
            "log_dir": "${oc.env:COOKBOOK_TB_DIR}",
            "organize_logs": False,  # one folder per tracker run: a requeue appends to it
        },
        "wandb": {
            "_component_": _LOGGING + "WandBLogger",
            "project": "${oc.env:WANDB_PROJECT}",
            "log_dir": "${oc.env:WANDB_DIR}",
        },
        "mlflow": {"_component_": _LOGGING + "MLFlowLogger"},
    }
    return loggers.get(tracker)


def _scalar(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# torchtune keeps params in bf16 (dtype: bf16) and AdamW's m/v follow the param dtype: 8 bytes/param.
PLANNER_SETTINGS: dict[str, Any] = {
    "master_weights_fp32": False,
    "optimizer_state_bytes": 2,
    "loss": "chunked",
    "checkpointing": "full",
}


def _path_problem(label: str, value: str) -> str | None:
    """An error when a checkpoint/tokenizer path given by the user is on this filesystem but missing."""
    model_dir = value.split("/original/")[0] if label == "tokenizer.path" else value
    return path_problem(label, value, f"download the model first: `cookbook download REPO_ID --output-dir {model_dir}`")


class TorchtuneRecipe(Recipe):
    """A torchtune distributed recipe from a built-in config; see the module docstring."""

    framework = "torchtune"
    packages = ("torch", "torchtune")
    trains = True
    trace_subdir = "profiling_outputs"
    planner_keys = {
        "batch_size": "micro_batch",
        "tokenizer.max_seq_len": "seq_len",
        "gradient_accumulation_steps": "grad_accum",
        "enable_activation_checkpointing": "checkpointing",
        "enable_activation_offloading": "activation_offloading",
        "model.lora_rank": "lora_rank",
        "tensor_parallel_dim": "tp",
        "optimizer.fused": "fused_optimizer",
        "optimizer_in_bwd": "optimizer_in_backward",
    }
    checkpointing_values = {"none": "False", "full": "True"}  # enable_activation_checkpointing: no selective
    positive_keys = {
        "model.lora_rank": "the LoRA rank",
        "model.lora_alpha": "LoRA's alpha",
        "optimizer.lr": "the learning rate",
        "tokenizer.max_seq_len": "the sequence length",
        "max_steps_per_epoch": "the steps per epoch",
    }
    config_paths = (
        StartPath("checkpointer.checkpoint_dir", None, "", "dir", "the model's checkpoint folder", MODEL_FILES[:1]),
        StartPath("tokenizer.path", None, "", "file", "the tokenizer"),
        StartPath(
            "dataset.data_files",
            None,
            "",
            "file",
            "the dataset file (a Hub dataset when source is a repo id)",
            hub_ok=True,
        ),
    )
    recipe_file: str  # e.g. full_finetune_distributed
    config_name: str  # built-in config, e.g. llama3_3/70B_full_multinode
    tiny_config: str  # local-cpu config under recipes/configs/
    model_folder: str | None  # the Hugging Face download's folder name, e.g. Llama-3.3-70B-Instruct
    resume_model_from_output: bool  # full finetunes reload the model from output_dir/epoch_N on resume
    planner_model = "llama3_3_70b"
    planner_base_settings = PLANNER_SETTINGS  # the built-in config's planner_settings go on top
    # the recipe subclass's periodic save (cookbook_tune.py); GPU configs get the planner's interval
    save_interval_key = "save_every_n_steps"

    def settable(self, key: str) -> bool:
        """A key of the built-in config, or one the recipe reads when present (``tensor_parallel_dim``: the
        full finetune's, not LoRA's)."""
        return key.split(".")[0] in optional_keys(self.recipe_file) or key in leaf_keys(
            self.base_config(JobSpec(recipe=self.name))
        )

    # ---------------------------------------------------------------- asked by notebooks, planner, profiler
    def profiling_overrides(
        self, *, device: str = "cuda", steps: int = 3, warmup: int = 1, start_step: int = 3, memory: bool = False
    ) -> dict[str, str]:
        """torchtune's ``profiler`` section; ``memory`` is written for rank 0 only by torchtune."""
        sched = schedule(steps=steps, warmup=warmup, start_step=start_step)
        on_gpu = device.startswith("cuda")
        if memory and not on_gpu:
            raise ValueError("memory snapshots need a CUDA device (torch.cuda.memory._record_memory_history)")
        return {
            "profiler._component_": "torchtune.training.setup_torch_profiler",
            "profiler.enabled": "True",
            "profiler.output_dir": "${output_dir}/" + self.trace_subdir,
            "profiler.cpu": "True",
            "profiler.cuda": str(on_gpu),
            "profiler.xpu": "False",
            # torchtune forces with_stack and record_shapes on when profile_memory is set
            "profiler.profile_memory": str(memory),
            "profiler.with_stack": "False",
            "profiler.record_shapes": "True",
            "profiler.with_flops": "False",
            "profiler.wait_steps": str(sched.wait),
            "profiler.warmup_steps": str(sched.warmup),
            "profiler.active_steps": str(sched.active),
            "profiler.num_cycles": "1",
        }

    def model_overrides(self, model_dir: str) -> dict[str, str]:
        """The checkpoint folder AND the tokenizer inside it. (The top-level ``checkpoint_dir=`` of some
        published scripts is ignored by the 70B configs; these are the keys torchtune reads.)"""
        d = str(model_dir).rstrip("/")
        return {"checkpointer.checkpoint_dir": d, "tokenizer.path": f"{d}/{MODEL_FILES[1]}"}

    def dataset_overrides(
        self, dataset: Dataset, *, packed: bool = False, max_seq_len: int | None = None
    ) -> dict[str, str]:
        """The ``dataset:`` block as dotted keys, plus ``tokenizer.max_seq_len`` if given (packing needs it)."""
        out: dict[str, str] = {}
        for key, value in dataset_block(dataset, packed=packed).items():
            if isinstance(value, dict):
                out.update({f"dataset.{key}.{k}": str(v) for k, v in value.items()})
            else:
                out[f"dataset.{key}"] = _scalar(value)
        if max_seq_len is not None:
            out["tokenizer.max_seq_len"] = str(max_seq_len)
        return out

    def metrics_files(self, run_dir: Path) -> list[Path]:
        """torchtune's DiskLogger files (``output_dir/logs``): they carry the throughput."""
        return sorted(Path(run_dir).glob("logs/log_*.txt"))

    # ---------------------------------------------------------------- config
    def base_config(self, spec: JobSpec) -> DictConfig:

        if spec.local_cpu:
            return _load_dict(_CONFIGS / self.tiny_config)  # paths: ${oc.env:TINY_DIR}/...
        return builtin_config(self.config_name)

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        if spec.local_cpu:
            return []
        return [
            StartPath(
                "checkpointer.checkpoint_dir",
                "MODEL_DIR",
                f"$RECIPE_DIR/models/{self.model_folder}",
                "dir",
                f"the {self.model_folder} download (`cookbook download` / `tune download`)",
                MODEL_FILES,
                repo_id=self.model_repo,
            ),
            StartPath(
                "tokenizer.path",
                None,
                "$MODEL_DIR/original/tokenizer.model",
                "file",
                "the model's tiktoken tokenizer (inside the download)",
            ),
        ]

    def config(self, spec: JobSpec) -> DictConfig:
        """The merged config written next to the script (overrides applied, typed as YAML)."""
        from omegaconf import DictConfig, OmegaConf

        cfg = self.base_config(spec)
        merged = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{k}={v}" for k, v in spec.overrides.items()]))
        assert isinstance(merged, DictConfig)  # a mapping merged with a dot-list stays a mapping
        for key, value in self.start_args(spec).items():  # start-up paths read the script's variables
            OmegaConf.update(merged, key, env_interpolation(value), force_add=True)
        for key, value in self.save_overrides(spec).items():
            OmegaConf.update(merged, key, int(value), force_add=True)  # saving <= 5% of the step time
        if (logger := metric_logger(spec.tracker)) is not None:
            OmegaConf.update(merged, "metric_logger", logger, merge=False)
        tp = int(merged.get("tensor_parallel_dim", 1) or 1)
        if tp > 1 and merged.get("tensor_parallel_plan") is None:
            merged.tensor_parallel_plan = {"_component_": TP_PLAN}
        if tp > 1 and merged.optimizer.get("fused", False):
            merged.optimizer.fused = False  # the recipe refuses fused AdamW with tensor parallelism
        return merged

    def config_file(self, spec: JobSpec) -> str:
        """The YAML's name: the script's name with ``.yaml`` (two scripts in one folder never share one), or the
        spec's ``config_name`` (slurm-recipes/: one YAML for every GPU profile)."""
        return spec.config_name or f"{spec.script_stem}.yaml"

    # ---------------------------------------------------------------- Recipe
    def validate(self, spec: JobSpec) -> list[str]:
        base = self.base_config(spec)
        problems = check_override_keys(base, spec.overrides, self.recipe_file)
        if spec.tracker != "none" and (keys := [k for k in spec.overrides if k.split(".")[0] == "metric_logger"]):
            problems.append(
                f"--tracker {spec.tracker} writes metric_logger itself: drop {', '.join(keys)} (or use --tracker none)"
            )
        if problems:
            return problems
        try:
            cfg = self.config(spec)
        except Exception as e:  # noqa: BLE001  (OmegaConf's message names the bad value)
            return [f"overrides do not fit the config: {e}"]
        tp = cfg.get("tensor_parallel_dim", 1) or 1
        if not isinstance(tp, int) or tp < 1:
            problems.append(f"tensor_parallel_dim={tp!r}: use a positive integer")
        elif spec.procs_per_node % tp:
            problems.append(
                f"tensor_parallel_dim={tp} must divide GPUs per node ({spec.procs_per_node}): tensor "
                "parallelism stays inside a node; use a divisor such as "
                + ", ".join(str(d) for d in range(1, spec.procs_per_node + 1) if spec.procs_per_node % d == 0)
            )
        elif spec.world_size % tp:
            problems.append(f"world size {spec.world_size} is not a multiple of tensor_parallel_dim={tp}")
        for key in ("batch_size", "gradient_accumulation_steps", "epochs"):
            value = cfg.get(key)
            if not isinstance(value, int) or value < 1:
                problems.append(f"{key}={value!r}: use a positive integer")
        if cfg.get("optimizer_in_bwd") and cfg.get("gradient_accumulation_steps", 1) != 1:
            problems.append("optimizer_in_bwd=True needs gradient_accumulation_steps=1: set one of them back")
        if spec.local_cpu and cfg.get("device") != "cpu":
            problems.append("profile local-cpu runs on CPU: leave device=cpu")
        for key in ("checkpointer.checkpoint_dir", "tokenizer.path"):
            if key in spec.overrides and (p := _path_problem(key, spec.overrides[key])):
                problems.append(p)
        return problems

    def hub_fetches(self, spec: JobSpec) -> list[HubFetch]:
        """The start paths' Hub ids, and each dataset whose ``source`` is a Hub repo: torchtune's builders call
        ``load_dataset(source)`` on every rank (alpaca_dataset: ``tatsu-lab/alpaca``); a local folder or a file
        builder (``json`` with ``data_files``) is read from disk."""
        from omegaconf import ListConfig

        out = super().hub_fetches(spec)
        if spec.local_cpu:
            return out
        block = self.config(spec).get("dataset")
        entries = list(block) if isinstance(block, ListConfig) else [block]
        for i, entry in enumerate(entries):
            if not hasattr(entry, "get"):
                continue
            source = entry.get("source") or _component_default(str(entry.get("_component_", "")), "source")
            if isinstance(source, str) and is_hub_id(source):
                key = "dataset.source" if len(entries) == 1 else f"dataset.{i}.source"
                out.append(HubFetch(source, "dataset", key))
        return out

    def warnings(self, spec: JobSpec) -> list[str]:
        from omegaconf import OmegaConf

        if spec.local_cpu:
            return []
        cfg = self.config(spec)
        out = []
        if spec.requeue and str(OmegaConf.select(cfg, "epochs")) == "1" and not cfg.get("save_every_n_steps"):
            out.append(
                f"epochs=1: torchtune {tested_version('torchtune')} saves only at epoch ends; a preemption still "
                f"saves at the step it reaches ({SUBCLASS_MODULE}), but a job killed without warning (node "
                "failure, scontrol requeue) starts over: set --set save_every_n_steps=N"
            )
        return out

    def files(self, spec: JobSpec) -> dict[str, str]:
        from omegaconf import OmegaConf

        owner = (
            f"profile {spec.profile}. Generated by the cookbook recipe engine.\n"
            f"# for {spec.script_name or spec.script_stem + '.sbatch'}\n"
            if spec.config_name is None
            else f"every script naming {spec.config_name}. Generated by the cookbook recipe engine.\n"
        )
        header = (
            f"# {self.name}: torchtune {self.config_name if not spec.local_cpu else self.tiny_config} + overrides, "
            f"{owner}# output_dir is set on the command line (the job's run folder).\n"
        )
        return {self.config_file(spec): header + OmegaConf.to_yaml(self.config(spec))}

    def command(self, spec: JobSpec) -> Launch:
        config = f"$RECIPE_DIR/{self.config_file(spec)}"
        args = (SUBCLASS_MODULE, self.recipe_file, "--config", config, "output_dir=$RUN_DIR")
        if spec.local_cpu:
            return shim_launch(spec, "torchtune", args)
        return Launch("tune", args, self.start_variables(spec))

    def resume(self, spec: JobSpec) -> list[str]:
        """The newest complete ``step_N`` written by the recipe subclass (``cookbook_tune.py``: on preemption,
        every ``save_every_n_steps``) whose recipe state is newer than torchtune's own epoch-end one: resume
        there, mid-epoch. Otherwise torchtune's epoch checkpoints:

        torchtune 0.6.1 checkpoints at epoch ends (``RUN_DIR/epoch_N``) and writes
        ``recipe_state/recipe_state.pt`` last, after the weights of every epoch but the final one; it
        reloads with ``resume_from_checkpoint=True``. A full finetune then reads the model files relative
        to its output_dir, so they are pointed at the epoch the recipe state belongs to (LoRA reloads the
        base model from checkpoint_dir and its adapter from the largest ``epoch_N`` folder).

        The epoch the state belongs to is the newest ``epoch_N`` not written after the state file. A
        folder written after it (the final epoch, or one cut off mid-save by the preemption) would be
        loaded by torchtune against the wrong recipe state: it is moved aside (never deleted) and that
        epoch trains again. No state file yet: the job starts afresh."""
        if not self.resume_model_from_output:  # LoRA: the base model from checkpoint_dir, the adapter resumed
            return ["--resume=torchtune", "--resume-adapter"]
        return ["--resume=torchtune", f"--resume-filename-format={self.checkpoint_filename_format(spec)}"]

    def checkpoint_filename_format(self, spec: JobSpec) -> str:
        """The model shards' name pattern in the config (``model-{}-of-{}.safetensors``)."""
        from omegaconf import OmegaConf

        files = OmegaConf.select(self.config(spec), "checkpointer.checkpoint_files")
        if not (OmegaConf.is_dict(files) and "filename_format" in files):
            raise SpecError(
                [
                    f"{self.name}: resume needs checkpointer.checkpoint_files as "
                    "{filename_format, max_filename} "
                    f"(torchtune {tested_version('torchtune')} reloads them from output_dir)"
                ]
            )
        return str(files.filename_format)


class Llama33_70BFull(TorchtuneRecipe):
    name = "llama3_3_70b_full"
    description = "Llama-3.3-70B-Instruct full finetune, torchtune full_finetune_distributed (FSDP2 [+TP])"
    recipe_file = "full_finetune_distributed"
    config_name = "llama3_3/70B_full_multinode"
    tiny_config = "tiny_full.yaml"
    model_repo = "meta-llama/Llama-3.3-70B-Instruct"
    model_folder = model_repo.rsplit("/", 1)[-1]
    resume_model_from_output = True
    planner_settings = {"seq_len": 1024, "micro_batch": 4, "compile": True}
    planner_source = (
        "torchtune llama3_3/70B_full_multinode.yaml (max_seq_len 1024 packed, batch_size 4, AC, compile, fused AdamW)"
    )


class Llama33_70BLora(TorchtuneRecipe):
    resume_model_from_output = False
    name = "llama3_3_70b_lora"
    description = "Llama-3.3-70B-Instruct LoRA finetune, torchtune lora_finetune_distributed (FSDP2)"
    recipe_file = "lora_finetune_distributed"
    config_name = "llama3_3/70B_lora"
    tiny_config = "tiny_lora.yaml"
    model_repo = Llama33_70BFull.model_repo
    model_folder = Llama33_70BFull.model_folder
    planner_settings = {"seq_len": 2048, "micro_batch": 2, "lora_rank": 16}
    planner_source = (
        "torchtune llama3_3/70B_lora.yaml (rank 16, batch_size 2, AC; max_seq_len null -> planner assumes 2048)"
    )


register_recipe(Llama33_70BFull())
register_recipe(Llama33_70BLora())


# ---------------------------------------------------------------- bring your own config
@functools.cache
def _builtin_recipes() -> dict[str, tuple[str, bool]]:
    """``{config name: (recipe, supports distributed)}`` of every torchtune built-in config (``tune ls``)."""
    from torchtune._recipe_registry import get_all_recipes

    return {c.name: (r.name, r.supports_distributed) for r in get_all_recipes() for c in r.configs}


@functools.cache
def _recipe_kinds() -> dict[str, bool]:
    """``{recipe: supports distributed}`` of torchtune's built-in recipes."""
    from torchtune._recipe_registry import get_all_recipes

    return {r.name: r.supports_distributed for r in get_all_recipes()}


class TorchtuneConfig(TorchtuneRecipe):
    """Any torchtune built-in config (``tune:llama3_1/8B_lora``) or a YAML file of one's own with the recipe
    that runs it (``tune:full_finetune_distributed:my.yaml``), validated like the named recipes: override keys
    against the config and its components, parallel sizes, batch sizes. The config's own paths are used as
    they are (``--set checkpointer.checkpoint_dir=...``); ``local-cpu`` runs it as it is (a tiny config)."""

    def __init__(self, recipe_file: str, config: str, path: Path | None):
        self.recipe_file, self.config_name, self.path = recipe_file, config, path
        self.name = f"tune:{recipe_file}:{config}"  # the registry sets the name as typed
        self.tiny_config = config  # no tiny variant: the config itself (named in the YAML's header)
        self.model_folder = None
        self.resume_model_from_output = recipe_file.startswith("full_")
        source = f"your config {path}" if path else f"torchtune's built-in {config}"
        self.description = f"{source}, torchtune {recipe_file}"

    def base_config(self, spec: JobSpec) -> DictConfig:
        return _load_dict(self.path) if self.path else builtin_config(self.config_name)

    def planner_defaults(self) -> dict[str, Any] | None:
        return None  # the planner knows the named recipes' models only

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        return []  # the config's own paths (checked by `cookbook rehearse` through config_paths)

    def _resumable_weights(self, spec: JobSpec) -> bool:
        """A full finetune reloads its weights from the newest epoch: that needs checkpoint_files as a pattern."""
        try:
            self.checkpoint_filename_format(spec)
        except SpecError:
            return False
        return True

    def resume(self, spec: JobSpec) -> list[str]:
        if self.resume_model_from_output and not self._resumable_weights(spec):
            return []  # a requeue starts over (warned): resuming would pair the recipe state with the base weights
        return super().resume(spec)

    def warnings(self, spec: JobSpec) -> list[str]:
        out = [] if spec.local_cpu else super().warnings(spec)
        if spec.requeue and self.resume_model_from_output and not self._resumable_weights(spec):
            out.append(
                "checkpoint_files is a list: a requeued full finetune starts over (torchtune reloads the weights "
                "of the newest epoch through checkpoint_files.filename_format; write it as "
                "{filename_format, max_filename})"
            )
        return out


@functools.cache
def own_config(rest: str) -> TorchtuneConfig:
    """``tune:CONFIG`` (a built-in, its recipe from torchtune's registry) or ``tune:RECIPE:CONFIG`` (CONFIG a
    built-in name or a YAML file). KeyError with one line naming what to change."""
    recipe, sep, config = rest.rpartition(":")
    is_file = config.endswith((".yaml", ".yml")) or "/" in config and Path(config).exists()
    path = Path(config).expanduser().resolve() if is_file else None
    if path is not None:
        if not path.is_file():
            raise KeyError(f"tune:{rest}: no such config file {config}")
        if not sep:
            raise KeyError(
                f"tune:{rest}: name the torchtune recipe that runs your config, "
                f"e.g. tune:full_finetune_distributed:{config}"
            )
        try:
            _load_dict(path)
        except Exception as e:  # noqa: BLE001  (YAML's own message names line and column)
            raise KeyError(f"tune:{rest}: {config} is not a YAML mapping: {' '.join(str(e).split())}") from None
    elif config not in _builtin_recipes():
        hint = difflib.get_close_matches(config, list(_builtin_recipes()), n=3, cutoff=0.6)
        raise KeyError(
            f"tune:{rest}: {config!r} is not a torchtune {tested_version('torchtune')} built-in config (`tune ls` "
            f"lists them{'; did you mean ' + ' or '.join(hint) + '?' if hint else ''}), nor a .yaml file"
        )
    recipe = recipe or _builtin_recipes()[config][0]
    kinds = _recipe_kinds()
    if recipe not in kinds:
        hint = difflib.get_close_matches(recipe, list(kinds), n=2, cutoff=0.6)
        raise KeyError(
            f"tune:{rest}: {recipe!r} is not a torchtune recipe"
            + (f"; did you mean {' or '.join(hint)}?" if hint else f" (`tune ls`: {', '.join(kinds)})")
        )
    if not kinds[recipe]:
        raise KeyError(
            f"tune:{rest}: {recipe} is a single-device recipe; a Slurm job runs a distributed one "
            "(pick a config of full_finetune_distributed, lora_finetune_distributed ...: `tune ls`)"
        )
    return TorchtuneConfig(recipe, str(path) if path else config, path)


register_factory("tune", own_config, "tune:CONFIG (`tune ls`), tune:RECIPE:FILE.yaml")
