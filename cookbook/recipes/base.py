"""What a recipe is, and the registry that finds recipes by name.

A recipe turns a validated :class:`cookbook.spec.JobSpec` into the pieces the sbatch template
needs. Each recipe module defines one subclass of :class:`Recipe` per recipe and registers an
instance with :func:`register_recipe` at import time (``import cookbook.recipes`` imports them all).

A recipe declares
- ``name``: the name users type (``cookbook render NAME``), e.g. ``llama3_3_70b_full``;
- ``framework``: ``torchtune``, ``torchtitan`` or ``fsdp`` (where its framework knowledge lives);
- ``description``: one line for ``cookbook recipes``;
and implements
- :meth:`Recipe.validate` -- every problem with the spec for this recipe (override keys exist in the
  real config, parallel degrees fit the GPUs, batch sizes sane, paths exist...), each phrased as
  what to change. Return ``[]`` when the job is fine. Never raise for a user error.
- :meth:`Recipe.command` -- the :class:`Launch` for the spec: which launcher (``torchrun`` or
  ``tune run``) and the program arguments after the launcher's own flags. The job runtime adds the
  launcher flags (``--nnodes``, ``--nproc-per-node``, c10d rendezvous on the head node,
  ``--rdzv-id=$SLURM_JOB_ID``), so a recipe never writes node counts or addresses.
  Paths of files from :meth:`files` are written as ``$RECIPE_DIR/NAME`` (the folder the script and
  its configs are written to; the template sets ``RECIPE_DIR``).
- :meth:`Recipe.files` -- extra files written next to the script (configs), ``{name: text}``.
- :meth:`Recipe.resume` -- the runtime's resume switches (``--resume=torchtune`` ...): when the run
  folder already holds a checkpoint (requeue after preemption), the runtime adds the arguments that
  resume from the newest one (``cookbook_runtime.resume``). Default: none (starts afresh).

What the notebooks, the job builder, the planner and the profiler need to know about a framework
is asked of its recipe too, as data (``{key: value}`` overrides, never command-line strings):
:meth:`Recipe.profiling_overrides`, :meth:`Recipe.model_overrides`, :meth:`Recipe.dataset_overrides`,
:meth:`Recipe.metrics_files`, :meth:`Recipe.planner_defaults` with :attr:`Recipe.planner_keys`.

The ``local-cpu`` variant: when ``spec.profile == "local-cpu"`` the same recipe runs a tiny model on
CPU on the local cluster (gloo, one process per node). Recipes switch config and program for it
(e.g. ``-m cookbook.local.compat.cpu torchtune full_finetune_distributed --config tiny.yaml``); the
launcher flags and everything else stay the same.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import cookbook_runtime
from cookbook.spec import LOCAL_CPU as LOCAL_CPU  # re-exported (notebook_runner imports it here)
from cookbook.spec import JobSpec


class Dataset(Protocol):
    """What a recipe reads of a dataset it plugs in (:class:`cookbook.data.DatasetSpec` is one: the data layer
    imports the recipes, never the reverse)."""

    @property
    def style(self) -> str: ...

    @property
    def component(self) -> str: ...

    def builder_kwargs(self) -> dict[str, Any]: ...


def path_problem(label: str, value: str, fix: str) -> str | None:
    """An error when a path given by the user is on this filesystem but missing (``fix`` says what to do).

    Only absolute paths whose top folder exists here are checked: a value with a shell variable
    (``$HOME``, ``${TINY_DIR}``), ``~``, a relative path or a Hub id is left to the job.
    """
    if "$" in value or not value.startswith("/"):
        return None
    top = Path("/", *Path(value).parts[1:2])
    if top.exists() and not Path(value).exists():
        return f"{label}={value} does not exist ({fix})"
    return None


def resolve_here(value: str, spec: JobSpec, variables: dict[str, str]) -> str | None:
    """``value`` with ``$RECIPE_DIR``/``$RUN_DIR``/script variables expanded as far as this machine knows
    them; None when something stays unknown (``$SLURM_*``, ``$HOME`` of another machine)."""
    known = {"RECIPE_DIR": spec.recipe_dir or "", **variables}
    for _ in range(4):
        new = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: known.get(m.group(1), m.group(0)), value)
        if new == value:
            break
        value = new
    return None if "$" in value or not value else value


@dataclass(frozen=True)
class StartPath:
    """A file or folder a recipe reads at start-up, set through a script variable.

    ``key`` is the framework's config key (torchtune dotted YAML key, torchtitan ``section.key``, FSDP flag);
    ``variable`` the script variable holding it (``MODEL_DIR=${MODEL_DIR:-default}``, so it is written once
    and can be changed in the environment before ``sbatch``), or None when the value derives from another
    variable; ``default`` an absolute path at run time (``$RECIPE_DIR/...``) or a Hugging Face repo id
    when ``hub_ok``. ``expect`` names files that must be inside a folder (checked by ``cookbook rehearse``);
    ``repo_id`` the Hub repo whose download the folder is (``cookbook stage`` fetches it; ``repo_files``: only
    these of its files, as globs).
    """

    key: str
    variable: str | None
    default: str
    kind: Literal["dir", "file"]
    what: str
    expect: tuple[str, ...] = ()
    hub_ok: bool = False
    repo_id: str | None = None
    repo_files: tuple[str, ...] = ()


# `datasets` builders that read local files (``source: json`` with ``data_files``): not a Hub fetch
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "imagefolder", "audiofolder", "webdataset"})
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def is_hub_id(value: str) -> bool:
    """``owner/name`` (or a bare canonical name): a value the Hub libraries fetch, not a path or a builder."""
    return bool(_HUB_ID.fullmatch(value)) and value not in LOCAL_BUILDERS and not Path(value).exists()


@dataclass(frozen=True)
class HubFetch:
    """A repo a job would fetch from the Hugging Face Hub at start-up: on many nodes every rank at once (HTTP 429,
    one shared ``HF_HOME`` written concurrently). ``key`` is the config key to point at a local copy instead
    (``variable``: its script variable, when it has one); ``allow`` the files worth staging (C4: ``en/*``) and
    ``subdir`` the folder of the download the key then names (C4: ``en``)."""

    repo_id: str
    repo_type: Literal["model", "dataset"]
    key: str
    variable: str | None = None
    allow: tuple[str, ...] = ()
    subdir: str = ""

    def folder(self, root: str) -> str:
        """Where ``cookbook stage --root ROOT`` puts it: ``ROOT/NAME`` (datasets under ``ROOT/datasets``)."""
        name = self.repo_id.split("/")[-1]
        return f"{root.rstrip('/')}/{'datasets/' if self.repo_type == 'dataset' else ''}{name}"

    def local(self, root: str) -> str:
        """The value of :attr:`key` once staged."""
        return self.folder(root) + (f"/{self.subdir}" if self.subdir else "")


#: The runtime's programs package (``slurm-recipes/cookbook_runtime/programs/``): a job reaches it through
#: ``$RUNTIME_DIR``, which the script puts on ``PYTHONPATH``; nothing of it is copied beside a script.
PROGRAMS = "cookbook_runtime.programs"
#: The folder holding ``cookbook_runtime/`` here (``slurm-recipes/``): what a job's ``RUNTIME_DIR`` is on the nodes.
RUNTIME_PARENT = Path(cookbook_runtime.__file__).resolve().parents[1]


def program_source(module: str) -> Path:
    """The source file, on this machine, of the runtime's module ``module`` (``cookbook_runtime.programs.X``)."""
    return RUNTIME_PARENT.joinpath(*module.split(".")).with_suffix(".py")


def program_file(name: str) -> str:
    """The launch-line path of the runtime's program ``name`` (e.g. ``fsdp_train.py``) in a job."""
    return f"$RUNTIME_DIR/{PROGRAMS.replace('.', '/')}/{name}"


@dataclass(frozen=True)
class Launch:
    """How a recipe is started on every node: ``LAUNCHER <launcher flags> *args <resume arguments>``.

    ``args`` are plain strings, shell-quoted by the template; only ``$RECIPE_DIR``, ``$RUN_DIR`` and
    the names in ``variables`` still expand (nothing else does: no ``$(...)``, no globbing).
    """

    launcher: Literal["torchrun", "tune"]
    args: tuple[str, ...]
    # exported shell variables with defaults (``NAME=${NAME:-value}``); values and args may use
    # ``$RECIPE_DIR``, ``$RUN_DIR`` and earlier variables, e.g. ``{"TINY_DIR": "$RECIPE_DIR/tiny"}``
    variables: dict[str, str] = field(default_factory=dict)
    # shell text run before RUN_DIR is set (e.g. the FSDP script's MODEL check), and the variables it sets
    # (args and RUN_DIR may use them)
    prelude: str = ""
    prelude_variables: tuple[str, ...] = ()
    # shell text run once the variables are set, before the run folder is made: a job that could only do harm
    # or nothing (e.g. sample from random weights) stops here with one `error:` line on stderr and exit status 2
    check: str = ""


class Recipe(ABC):
    """One training recipe; see the module docstring for the contract."""

    name: str  # set on the class, or per instance (one FsdpRecipe per model)
    framework: ClassVar[str]
    description: str
    config_paths: ClassVar[tuple[StartPath, ...]] = ()  # config keys naming files read at start-up
    # the Hugging Face download the job reads at start-up: a finetune's weights, a pretraining's tokenizer or
    # autoencoder (None: it reads none); its default place is ``models/<model_folder>``
    model_folder: str | None = None
    model_repo: str | None = None  # its Hub repo (``owner/<model_folder>``): what ``cookbook stage`` downloads
    trace_subdir: ClassVar[str] = "profiling/traces"  # where profiler traces land, under the run folder
    # the framework's config keys the planner understands, ``{config key: planner Settings field}``
    planner_keys: ClassVar[dict[str, str]] = {}
    # the planner's activation checkpointing (none/selective/full) as the value of this framework's key for it
    # (the planner_keys entry mapping to ``checkpointing``); a mode missing here cannot be set in this framework
    checkpointing_values: ClassVar[dict[str, str]] = {}
    # config keys whose value is a number > 0, ``{config key: what it is}`` (the LoRA rank, the learning rate):
    # a zero or negative one fails only on the nodes, after the queue
    positive_keys: ClassVar[dict[str, str]] = {}
    # the framework's own parser types every config value (tyro, argparse) and names a word where a number belongs
    typed_config: ClassVar[bool] = False
    # the planner's model key (None: no model to plan), the framework's settings and the recipe's on top
    planner_model: ClassVar[str | None] = None
    planner_base_settings: ClassVar[dict[str, Any]] = {}
    planner_settings: ClassVar[dict[str, Any]] = {}
    planner_source: ClassVar[str] = ""
    trains: ClassVar[bool] = False  # a training run: once it finished, submitting it again does nothing
    # the framework's key of the periodic-save interval, which GPU jobs get sized (None: the recipe has none)
    save_interval_key: ClassVar[str | None] = None
    script_nodes: ClassVar[int] = 2  # nodes of its slurm-recipes/ scripts (a job using a trained model: 1)
    # what the nodes' Python must have (the runtime's --needs: a node without them stops the job, naming the fix)
    packages: ClassVar[tuple[str, ...]] = ("torch",)

    @abstractmethod
    def validate(self, spec: JobSpec) -> list[str]:
        """Every problem with ``spec`` for this recipe, each saying what to change ([] = fine)."""

    def settable(self, key: str) -> bool:
        """Whether render accepts ``--set key=...`` for this recipe (every :attr:`planner_keys` key, unless the
        framework says otherwise)."""
        return True

    def planner_overrides(
        self, settings: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> dict[str, str] | None:
        """``{config key: value}`` that sets the planner's ``settings`` (Settings fields: ``micro_batch``, ``tp``,
        ``checkpointing`` ...) in this recipe's config: render's own ``--set`` keys. None when one cannot be set
        here; a value the config has already (``defaults``: the planner's settings of this recipe; tensor
        parallelism 1) needs no key."""
        keys: dict[str, str] = {}
        for key, name in self.planner_keys.items():
            if self.settable(key):
                keys.setdefault(name, key)
        out = {}
        for name, value in settings.items():
            text = self.checkpointing_values.get(str(value)) if name == "checkpointing" else str(value)
            if name not in keys or text is None:
                if (name == "tp" and value == 1) or (defaults is not None and defaults.get(name) == value):
                    continue
                return None
            out[keys[name]] = text
        return out

    def value_problems(self, spec: JobSpec) -> list[str]:
        """One line for each override of :attr:`positive_keys` that is not a finite number > 0 (``inf`` and ``nan``
        parse as numbers, and train nothing; a word: where the framework's parser does not say so itself,
        :attr:`typed_config`)."""
        out = []
        for key, what in self.positive_keys.items():
            if key not in spec.overrides:
                continue
            value = spec.overrides[key]
            try:
                number = float(value)
                ok = math.isfinite(number) and number > 0
            except ValueError:
                ok = self.typed_config
            if not ok:
                out.append(
                    f"{key}={value!r}: {what} must be a finite number > 0; set it with --set {key}=NUMBER or drop it"
                )
        return out

    @abstractmethod
    def command(self, spec: JobSpec) -> Launch:
        """The launcher and program arguments for ``spec`` (already validated)."""

    def files(self, spec: JobSpec) -> dict[str, str]:
        """Extra files written next to the script, ``{file name: text}``."""
        return {}

    def warnings(self, spec: JobSpec) -> list[str]:
        """Things worth telling the user that do not stop the job (e.g. a path not checkable here)."""
        return []

    def resume(self, spec: JobSpec) -> list[str]:
        """The runtime's resume switches (``--resume=FRAMEWORK`` ...; ``python3 -m cookbook_runtime.run --help``):
        after a requeue or a second submission the runtime finds the newest complete checkpoint and adds the
        framework's resume arguments. Values may use ``$RECIPE_DIR``/``$RUN_DIR``. [] = starts afresh."""
        return []

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        """Files and folders the job reads at start-up (model, tokenizer, dataset...), see :class:`StartPath`."""
        return []

    def hub_fetches(self, spec: JobSpec) -> list[HubFetch]:
        """What every rank of a GPU job would fetch from the Hub at start-up: start paths whose value is a Hub id
        (FLUX's encoders); recipes add their datasets. [] for local-cpu (its assets are local)."""
        if spec.local_cpu:
            return []
        variables = self.start_variables(spec)
        out: dict[str, HubFetch] = {}
        for sp in self.start_paths(spec):
            value = resolve_here(spec.overrides.get(sp.key, sp.default), spec, variables)
            if sp.hub_ok and value and is_hub_id(value) and value not in out:
                out[value] = HubFetch(value, "model", sp.key, sp.variable)
        return list(out.values())

    def stage_fetches(self, spec: JobSpec) -> list[HubFetch]:
        """Everything ``cookbook stage`` downloads to shared storage for this job: the downloads its start-up
        folders hold (the model, a tokenizer, FLUX's autoencoder), then :meth:`hub_fetches`."""
        out = {
            sp.repo_id: HubFetch(sp.repo_id, "model", sp.key, sp.variable, allow=sp.repo_files)
            for sp in self.start_paths(spec)
            if sp.repo_id
        }
        for fetch in self.hub_fetches(spec):
            out.setdefault(fetch.repo_id, fetch)
        return list(out.values())

    def hub_complete(self, spec: JobSpec) -> bool:
        """Whether :meth:`hub_fetches` names everything the job reads from the Hub (then, when it names nothing,
        the script sets ``HF_HUB_OFFLINE=1``). Training recipes know their inputs; a use job reads its trained
        run's dataset, known only at run time."""
        return self.trains

    def start_path_values(self, spec: JobSpec) -> dict[str, str]:
        """``{key: value}`` of :meth:`start_paths` as the job will see them: the user's override of the key
        if given, else the default (still with ``$VARIABLE`` references)."""
        return {sp.key: spec.overrides.get(sp.key, sp.default) for sp in self.start_paths(spec)}

    def start_variables(self, spec: JobSpec) -> dict[str, str]:
        """Script variables of :meth:`start_paths` with their values (an override of the key sets the default)."""
        return {sp.variable: spec.overrides.get(sp.key, sp.default) for sp in self.start_paths(spec) if sp.variable}

    def start_args(self, spec: JobSpec) -> dict[str, str]:
        """``{key: value}`` a recipe passes for its start paths: the variable where it has one."""
        return {
            sp.key: (f"${sp.variable}" if sp.variable else spec.overrides.get(sp.key, sp.default))
            for sp in self.start_paths(spec)
        }

    def expected_config(self, spec: JobSpec) -> dict[str, tuple[object, str]]:
        """Config values the recipe sets on purpose, ``{key: (value, why)}``: ``cookbook rehearse`` notes a
        script whose parsed config differs (an old or hand-edited copy)."""
        return {}

    def read_paths(self, spec: JobSpec) -> list[StartPath]:
        """Everything ``cookbook rehearse`` checks on the nodes: :meth:`start_paths`, then the framework's
        other config keys that name files read at start-up (:attr:`config_paths`; checked when set)."""
        own = self.start_paths(spec)
        keys = {sp.key for sp in own}
        return own + [sp for sp in self.config_paths if sp.key not in keys]

    # -------------------------------------------------- asked by the notebooks, widgets, planner, profiler
    def profiling_overrides(
        self, *, device: str = "cuda", steps: int = 3, warmup: int = 1, start_step: int = 3, memory: bool = False
    ) -> dict[str, str]:
        """Overrides that turn the PyTorch profiler on (see :mod:`cookbook.profiling.enable` for the
        schedule and why these defaults are safe); ``memory`` adds a CUDA memory snapshot where the
        framework has one."""
        raise ValueError(f"{self.name}: the {self.framework} recipe has no profiler settings")

    def model_overrides(self, model_dir: str) -> dict[str, str]:
        """Overrides pointing the recipe at the model downloaded into ``model_dir`` ({}: from scratch)."""
        return {}

    def dataset_overrides(
        self, dataset: Dataset, *, packed: bool = False, max_seq_len: int | None = None
    ) -> dict[str, str]:
        """Overrides that plug ``dataset`` in (the framework's dataset block)."""
        raise ValueError(
            f"{self.name}: plugging in a dataset is supported for torchtune recipes only "
            f"({self.framework} reads its dataset from its own config keys)"
        )

    def wandb_offline_runs(self, spec: JobSpec) -> str:
        """Where the framework's W&B writes this training run's offline runs, as a bash glob (variables of the
        tracker block quoted, the glob characters not): what ``wandb sync`` uploads. ``wandb.init(dir=D)``
        writes ``D/wandb/offline-run-<time>-<run id>``; by default D is ``$WANDB_DIR`` (the FSDP script and
        torchtune's WandBLogger pass it, a program of one's own gets it from W&B's environment)."""
        return '"$WANDB_DIR"/wandb/offline-run-*-"$WANDB_RUN_ID"'

    def metrics_files(self, run_dir: Path) -> list[Path]:
        """Files with metrics the framework writes under ``run_dir`` besides the Slurm log."""
        return []

    def stop_save_recipes(self) -> tuple[str, ...]:
        """The recipes whose checkpoint a stop of this job writes: the ``--signal`` lead time of its GPU scripts
        covers the largest (:func:`cookbook.planner.lead_time.signal_seconds`). Its own name."""
        return (self.name,)

    def save_overrides(self, spec: JobSpec) -> dict[str, str]:
        """``{save_interval_key: steps}``: the periodic-save interval resolved for ``spec`` (saving <= 5% of the
        step time, :attr:`cookbook.spec.JobSpec.sizing`); {} when it has none or the user set the key."""
        steps = spec.sizing.save_interval if spec.sizing else None
        key = self.save_interval_key
        return {} if key is None or steps is None or key in spec.overrides else {key: str(steps)}

    def run_time_sizes(self) -> tuple[str, str] | None:
        """The script's variables holding ``(one checkpoint's GB, the stop-save's seconds)`` when it picks its model
        at run time (the runtime sizes its space check, stop lead and hang floor from them; the ``--signal`` lead is
        the spec's own recipe's); None: the planner's figures for :meth:`stop_save_recipes`, written as numbers."""
        return None

    def planner_defaults(self) -> dict[str, Any] | None:
        """What the planner assumes for this recipe: ``model`` (a planner model key), ``nodes``,
        ``gpus_per_node``, ``gpu``, ``settings`` ({planner Settings field: value}, as the config ships) and
        ``source`` (where the numbers come from); None when the planner has no model for it.

        By default: ``planner_model`` on 2 nodes x 8 H100, the framework's ``planner_base_settings`` with
        the recipe's ``planner_settings`` on top."""
        if self.planner_model is None:
            return None
        return {
            "model": self.planner_model,
            "nodes": 2,
            "gpus_per_node": 8,
            "gpu": "h100",
            "settings": {**self.planner_base_settings, **self.planner_settings},
            "source": self.planner_source,
        }


_REGISTRY: dict[str, Recipe] = {}
# bring your own: ``PREFIX:REST`` names a recipe made on demand (``tune:llama3_1/8B_lora``, ``titan:my.py:tiny``,
# ``script:train.py``) by the factory its framework module registers; a factory raises KeyError with the reason
_FACTORIES: dict[str, tuple[Callable[[str], Recipe], str]] = {}


def register_factory(prefix: str, factory: Callable[[str], Recipe], usage: str) -> None:
    """Make ``PREFIX:REST`` names resolve to ``factory(REST)`` (``usage``: the form, for error messages)."""
    _FACTORIES[prefix] = (factory, usage)


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to the registry (a second recipe with the same name is an error)."""
    if recipe.name in _REGISTRY and type(_REGISTRY[recipe.name]) is not type(recipe):
        raise ValueError(f"two recipes named {recipe.name!r}: {type(_REGISTRY[recipe.name])} and {type(recipe)}")
    _REGISTRY[recipe.name] = recipe
    return recipe


def registered(name: str) -> Recipe:
    """The registered recipe called ``name`` (``cookbook.recipes.get_recipe`` imports every recipe first)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    prefix, sep, rest = name.partition(":")
    if sep and prefix in _FACTORIES:
        recipe = _FACTORIES[prefix][0](rest)
        recipe.name = name  # the name as the user typed it: a spec's recipe and its recipe's name agree
        return recipe
    own = "; or bring your own: " + ", ".join(usage for _, usage in _FACTORIES.values()) if _FACTORIES else ""
    raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(_REGISTRY))}{own}")


def all_registered() -> list[Recipe]:
    """Every registered recipe, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
