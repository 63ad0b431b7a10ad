"""The job a user asks for (:class:`JobSpec`) and the cluster profile it runs under.

A profile is the environment a kind of cluster needs (NCCL/EFA/InfiniBand, socket interface,
backend), read from data files by :mod:`cookbook.profiles`. Every value says where it comes from; the
rendered script carries that as a comment.
:func:`check_spec` lists every problem with a spec at once; recipe-specific checks live in the
recipe (:meth:`cookbook.recipes.base.Recipe.validate`), and :func:`cookbook.render.validate` runs both.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

# Profiles are data (cookbook/profiles/): read only through these two functions, re-exported here.
from cookbook.profiles import EnvVar as EnvVar
from cookbook.profiles import Profile as Profile
from cookbook.profiles import ProfileError as ProfileError
from cookbook.profiles import get_profile as get_profile
from cookbook.profiles import profiles as profiles

#: The profile of the embedded local cluster (CPU, tiny models); every other profile is a GPU cluster.
LOCAL_CPU = "local-cpu"

SECRET_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)
#: experiment trackers a job can log to (``tracker``); "none" keeps each framework's own default logging
TRACKERS = ("none", "tensorboard", "wandb", "mlflow")
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MEM = re.compile(r"^\d+[KMGTkmgt]?$")
_GRES = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(:[A-Za-z0-9_.-]+)?(:\d+)?$")  # name[:type][:count]
# --dependency: TYPE:ID[:ID...] items (or singleton), joined by "," (all) or "?" (any); IDs may be array tasks 12_3
_DEPENDENCY = re.compile(
    r"^((after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+(_\d+)?(\+\d+)?)+|singleton)"
    r"([,?]((after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+(_\d+)?(\+\d+)?)+|singleton))*$"
)
_SBATCH_ARG = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=.*)?$", re.S)
#: the most GPUs any node offers (16: the DGX-2/HGX-2 class; H100/H200/B200 nodes have 8, GB200 trays 4)
MAX_GPUS_PER_NODE = 16
#: the most nodes a Slurm partition holds (the largest Slurm machines, e.g. El Capitan, have ~11,000)
MAX_NODES = 16384
#: a job name is a folder name (``runs/<name>``) and a log name (``<name>-<job id>.out``): one safe path component
MAX_JOB_NAME = 100
_JOB_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
#: fields naming a path or an image: None means "the default", but an empty value is a mistake
_PATH_FIELDS = ("log_dir", "run_dir", "recipe_dir", "runtime_dir", "venv", "assets_dir", "container_image")

#: sbatch options every rendered script writes itself -> the JobSpec field (and CLI flag) that sets them;
#: ``sbatch_extra`` may not repeat them (a second line would silently win or contradict the first).
SBATCH_OWN: dict[str, str] = {
    "--job-name": "job_name (--job-name)",
    "--nodes": "nodes (--nodes)",
    "--ntasks": "nodes (--nodes): the script starts one launcher per node",
    "--ntasks-per-node": "nodes (--nodes): the script starts one launcher per node",
    "--gpus": "gpus_per_node (--gpus-per-node)",
    "--gpus-per-node": "gpus_per_node (--gpus-per-node)",
    "--cpus-per-task": "cpus_per_task (--cpus-per-task)",
    "--time": "time (--time)",
    "--partition": "partition (--partition)",
    "--account": "account (--account)",
    "--qos": "qos (--qos)",
    "--exclude": "exclude (--exclude)",
    "--constraint": "constraint (--constraint)",
    "--reservation": "reservation (--reservation)",
    "--mem": "mem (--mem)",
    "--gres": "gres (--gres)",
    "--exclusive": "exclusive (--no-exclusive shares nodes)",
    "--output": "log_dir (--log-dir)",
    "--error": "log_dir (--log-dir): the cookbook reads one log per job",
    "--open-mode": "log_dir (--log-dir): the log is appended to across requeues",
    "--requeue": "requeue (--no-requeue)",
    "--no-requeue": "requeue (--no-requeue)",
    "--no-kill": "spare_nodes (--spare-nodes): a job with spares keeps its allocation when a node fails",
    "--signal": "signal_seconds (--signal-seconds)",
    "--dependency": "dependency (--dependency)",
    "--array": "Executor.map_array(..., parallelism=N): one array, a script per task",
}
SHARED_PORT_SPAN = 2000  # non-exclusive jobs: rendezvous port = port + job id % SHARED_PORT_SPAN
# Linux's ephemeral ports (net.ipv4.ip_local_port_range) start here: an outgoing connection (gloo, NCCL, another
# job's store) may hold any of them, and a store that binds one fails with EADDRINUSE although nothing listens
EPHEMERAL_PORTS_START = 32768


class SpecError(ValueError):
    """A job spec that cannot run; ``problems`` lists each one with what to change."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:  # one problem, one line
            super().__init__(f"invalid job: {self.problems[0]}")
        else:
            super().__init__("invalid job:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class ProfileDefaults:
    """The fields a profile decides unless the user says otherwise (see :func:`profile_defaults`)."""

    gpus_per_node: int
    time: str
    exclusive: bool
    signal_seconds: int | None  # None: the recipe's lead time (cookbook/planner/lead_time.py), set at render


# GPU profiles: 8 GPUs per node, 4 hours, whole nodes, USR1 early enough for the recipe's stop-save (its model's
# checkpoint: 2 to 16 minutes, see cookbook/planner/lead_time.py). ``local-cpu`` (the embedded cluster): no GPUs,
# 10 minutes, shared nodes, a 30-second preemption warning (tiny models save in under a second).
GPU_DEFAULTS = ProfileDefaults(gpus_per_node=8, time="04:00:00", exclusive=True, signal_seconds=None)
LOCAL_CPU_DEFAULTS = ProfileDefaults(gpus_per_node=0, time="00:10:00", exclusive=False, signal_seconds=30)


@dataclass(frozen=True)
class Sizing:
    """The planner's figures a recipe writes into a job, computed once by :func:`cookbook.resolve.resolve` (the
    recipes never ask the planner). ``save_interval``: steps between periodic saves, written as the framework's
    key (:attr:`cookbook.recipes.base.Recipe.save_interval_key`) unless the user's overrides set it; None: the
    config's own. ``saves``: ``{stop-save recipe: (bytes of its largest save, seconds of its stop-save)}`` for a
    script that picks its model at run time (:meth:`cookbook.recipes.base.Recipe.run_time_sizes`)."""

    save_interval: int | None = None
    saves: dict[str, tuple[int, float]] = field(default_factory=dict)


@dataclass
class JobSpec:
    """Everything about one job that is not the recipe's own config.

    ``overrides`` are recipe config ``key=value`` pairs (torchtune dotted YAML keys; torchtitan
    ``section.key``); ``env`` is extra environment (never secrets: the script reads HF_TOKEN itself).
    """

    recipe: str
    nodes: int = 2  # the nodes that train (world size, lead time, planner); Slurm is asked for nodes + spare_nodes
    # nodes allocated beyond ``nodes`` that stand by: the runtime swaps a faulty node for one inside the job
    # (#SBATCH --no-kill keeps the allocation when a node fails); 0: a node fault requeues the job
    spare_nodes: int = 0
    gpus_per_node: int = GPU_DEFAULTS.gpus_per_node  # JobSpec's own defaults are the GPU profiles'
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    exclude: str | None = None  # --exclude: nodes never to use (e.g. n7,gpu[12-13])
    constraint: str | None = None  # --constraint: node features (e.g. h100&ib)
    reservation: str | None = None  # --reservation
    mem: str | None = None  # --mem per node: 64G, 500000M, 0 (all of it)
    gres: str | None = None  # --gres: generic resources (e.g. gpu:h100:8); GPUs usually via gpus_per_node
    sbatch_extra: list[str] = field(default_factory=list)  # any other sbatch option, one #SBATCH line each
    dependency: str | None = None  # --dependency: start after other jobs, e.g. afterok:1234 (a data job)
    time: str = GPU_DEFAULTS.time
    exclusive: bool = GPU_DEFAULTS.exclusive
    job_name: str | None = None
    log_dir: str = "."  # one log per job: LOG_DIR/<job name>-<job id>.out ("." = where
    # sbatch runs: always exists, Slurm creates no folder)
    script_name: str | None = None  # the script's file name; its configs are named after it
    # a config's file name shared by several scripts (slurm-recipes/: one torchtune YAML for every GPU profile);
    # None: named after the script (two scripts in one folder never share one)
    config_name: str | None = None
    run_dir: str | None = None  # checkpoints/metrics; default $RECIPE_DIR/runs/<job name>
    recipe_dir: str | None = None  # where the script's configs live; default $SLURM_SUBMIT_DIR
    # the folder holding cookbook_runtime/ on the nodes; None: a copy is written into the job's own folder
    runtime_dir: str | None = None
    container_image: str | None = None  # pyxis/enroot: --container-image
    container_mounts: list[str] = field(default_factory=list)  # SRC:DST[:ro]
    profile: str = "generic"
    requeue: bool = True
    signal_seconds: int | None = GPU_DEFAULTS.signal_seconds  # --signal=B:USR1@N before the time limit; None:
    # the recipe's lead time (render sets it: cookbook/planner/lead_time.py; local-cpu: LOCAL_CPU_DEFAULTS')
    sizing: Sizing | None = None  # the planner's figures the recipe writes; None: resolve sets them (GPU profiles)
    env: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    venv: str | None = None  # the Python environment every node runs: a venv or conda prefix (may use $RECIPE_DIR)
    assets_dir: str | None = None  # local-cpu: tiny assets root (default .cache/tiny; may use $RECIPE_DIR)
    port: int = 29500  # rendezvous port on the head node
    tracker: str = "none"  # experiment tracking (TRACKERS); run name <job name>-<first job id>, see cookbook.tracking
    program_args: list[str] = field(default_factory=list)  # the script recipe's program arguments (after --)

    @property
    def name(self) -> str:
        return self.job_name or recipe_slug(self.recipe).replace("_", "-")

    @property
    def script_stem(self) -> str:
        """The script's name without ``.sbatch``: configs written next to it are named after it."""
        if self.script_name:
            name = self.script_name.rsplit("/", 1)[-1]
            return name[: -len(".sbatch")] if name.endswith(".sbatch") else name.rsplit(".", 1)[0] or name
        return f"{recipe_slug(self.recipe)}.{self.profile}"

    @property
    def profile_info(self) -> Profile:
        return get_profile(self.profile)

    @property
    def local_cpu(self) -> bool:
        """The job runs the tiny CPU variant on the embedded local cluster (profile ``local-cpu``)."""
        return is_local_cpu(self.profile)

    @property
    def procs_per_node(self) -> int:
        """Processes torchrun starts per node: one per GPU, one on CPU."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def describe(self) -> str:
        """The job in short for a notebook (``repr`` shows all 35 fields): recipe, profile, shape, time and
        partition on one line, then one line per override."""
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        spare = f" (+{self.spare_nodes} spare)" if self.spare_nodes else ""
        gpus = f" x {self.gpus_per_node} GPUs" if self.gpus_per_node else ", CPU only"
        line = (
            f"{self.name}: {self.recipe} on {self.profile}, {nodes}{spare}{gpus}, time {self.time}, "
            f"partition {self.partition or 'default'}"
        )
        return "\n".join([line, *(f"  {key} = {value}" for key, value in self.overrides.items())])


def is_local_cpu(profile: str) -> bool:
    """Whether jobs under ``profile`` run the tiny CPU variant of the local bench: ``local-cpu`` itself or any
    profile without GPUs (e.g. one that ``extends: local-cpu``); False for an unknown or unreadable profile."""
    if profile == LOCAL_CPU:
        return True
    try:
        return not get_profile(profile).uses_gpus
    except ProfileError:
        return False


def recipe_slug(recipe: str) -> str:
    """A recipe name fit for a file or job name: bring-your-own names (``tune:llama3_1/8B_lora``,
    ``script:/home/me/train.py``) lose their ``:`` and ``/``, and a file counts by its stem."""
    parts = [PurePath(p).stem if p.endswith((".py", ".yaml", ".yml")) else p for p in recipe.split(":")]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts)).strip("-.") or "job"


def profile_defaults(profile: str) -> dict[str, Any]:
    """What a job under ``profile`` gets unless the user says otherwise: the one place the CLI, the
    notebooks, the job builder, the rehearsal and ``slurm-recipes/`` take them from (:data:`GPU_DEFAULTS`,
    :data:`LOCAL_CPU_DEFAULTS`; a bare ``JobSpec`` gets the GPU ones).
    """
    return dataclasses.asdict(LOCAL_CPU_DEFAULTS if is_local_cpu(profile) else GPU_DEFAULTS)


def session_defaults(profile: str) -> dict[str, Any]:
    """:func:`profile_defaults` plus what a job submitted from this process needs: this virtualenv (the nodes'
    Python: on a shared filesystem, as the login node's home is) and on ``local-cpu`` a random rendezvous port
    (shared nodes: jobs on one node must not collide)."""
    defaults = profile_defaults(profile)
    if sys.prefix != sys.base_prefix:
        defaults["venv"] = sys.prefix
    if is_local_cpu(profile):
        defaults["port"] = random.randint(20000, EPHEMERAL_PORTS_START - SHARED_PORT_SPAN)  # all below the ephemeral
    return defaults


def make_spec(recipe: str, profile: str = "generic", **fields: Any) -> JobSpec:
    """A :class:`JobSpec` with ``profile``'s defaults for every field not given (``None`` = not given)."""
    given = {k: v for k, v in fields.items() if v is not None}
    return JobSpec(recipe=recipe, profile=profile, **{**session_defaults(profile), **given})


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["a.b=1", "c=x=y"]`` -> ``{"a.b": "1", "c": "x=y"}``; SpecError for items without ``=``."""
    out, bad = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            bad.append(f"override {item!r} is not KEY=VALUE (e.g. --set batch_size=4)")
        else:
            out[key.strip()] = value
    if bad:
        raise SpecError(bad)
    return out


def time_seconds(text: str) -> int:
    """Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    else:
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


@functools.cache
def _field_types() -> dict[str, Any]:
    """``{field: its annotation}`` of :class:`JobSpec`, resolved (the one statement of each field's type)."""
    return typing.get_type_hints(JobSpec)


def _has_type(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of ``hint`` (``int``, ``str``, ``bool``, ``X | None``, ``list[str]``,
    ``dict[str, str]``); a bool is no whole number."""
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(hint)
    if origin is list:
        return isinstance(value, list) and all(_has_type(v, typing.get_args(hint)[0]) for v in value)
    if origin is dict:
        key, val = typing.get_args(hint)
        return isinstance(value, dict) and all(_has_type(k, key) and _has_type(v, val) for k, v in value.items())
    return isinstance(value, hint)


def _type_rule(name: str, value: Any, hint: Any) -> str:
    """One line for a field whose value is not of its type: the value, the type wanted, an example."""
    optional = isinstance(hint, types.UnionType)
    wanted = next(h for h in typing.get_args(hint) if h is not type(None)) if optional else hint
    unset = " (or None: the default)" if optional else ""
    if wanted is bool:
        return f"{name}={value!r}: give True or False"
    if wanted is int:
        example = {"nodes": "2", "gpus_per_node": "8", "port": "29500"}.get(name, "1")
        return f"{name}={value!r}: give a whole number, e.g. {name}={example}{unset}"
    if typing.get_origin(wanted) is list:
        if isinstance(value, str):
            return f"{name}={value!r} is one string: give a list of strings, e.g. {name}=[{value!r}]"
        return f"{name}={value!r}: give a list of strings, e.g. {name}=['--mail-type=END']"
    if typing.get_origin(wanted) is dict:
        return f"{name}={value!r}: give a dict of text to text, e.g. {name}={{'KEY': '1'}} (numbers as strings)"
    return f"{name}={value!r}: give text (a str){unset}"


def type_problems(spec: JobSpec) -> list[str]:
    """One line for each field of ``spec`` whose value is not of the type :class:`JobSpec` declares (a job built
    in Python: ``nodes='two'``, ``sbatch_extra='--mail-type=END'``); the other checks assume the types."""
    hints = _field_types()
    return [
        _type_rule(f.name, getattr(spec, f.name), hints[f.name])
        for f in dataclasses.fields(spec)
        if not _has_type(getattr(spec, f.name), hints[f.name])
    ]


def shape_problems(nodes: int, gpus_per_node: int, spare_nodes: int = 0) -> list[str]:
    """The job's size against what Slurm and the hardware can hold: 1..:data:`MAX_NODES` nodes (spares
    included), 0..:data:`MAX_GPUS_PER_NODE` GPUs per node. Shared by ``render`` and ``plan``."""
    p = []
    if nodes < 1:
        p.append(f"nodes={nodes}: need at least 1 node (e.g. --nodes 2)")
    elif nodes + max(spare_nodes, 0) > MAX_NODES:
        p.append(
            f"nodes={nodes + max(spare_nodes, 0)}: no Slurm partition holds more than {MAX_NODES} nodes; "
            "ask for fewer (--nodes, --spare-nodes)"
        )
    if gpus_per_node < 0:
        p.append(f"gpus_per_node={gpus_per_node}: cannot be negative (0: a CPU job)")
    elif gpus_per_node > MAX_GPUS_PER_NODE:
        p.append(
            f"gpus_per_node={gpus_per_node}: no node offers more than {MAX_GPUS_PER_NODE} GPUs; give the GPUs of "
            "one node (e.g. --gpus-per-node 8)"
        )
    return p


def name_problems(spec: JobSpec) -> list[str]:
    """The job name (a folder and a log file's name) and the paths given empty."""
    p = []
    name = spec.job_name
    if name is not None and not _CONTROL.search(name) and (len(name) > MAX_JOB_NAME or not _JOB_NAME.match(name)):
        shown = name if len(name) <= 40 else f"{name[:37]}..."
        p.append(
            f"job_name={shown!r}: a job name is one folder name of at most {MAX_JOB_NAME} characters (letters, "
            f"digits, . _ + -; not starting with . or -), e.g. --job-name {recipe_slug(name)[:MAX_JOB_NAME]}"
        )
    for label in _PATH_FIELDS:
        value = getattr(spec, label)
        if value is not None and not value.strip():
            default = "." if label == "log_dir" else "unset"
            p.append(f"{label}={value!r} is empty: give a path, or leave it {default} for the default")
    return p


def check_spec(spec: JobSpec, cpu_job: bool = False, signal_source: str = "") -> list[str]:
    """Every problem with the Slurm/profile side of ``spec``, each saying what to change (``cpu_job``: a
    job without GPUs under any profile, e.g. data preparation before the training job; ``signal_source``: where
    ``signal_seconds`` came from when the user did not set it, for the message). The values' types first: the
    other checks assume them."""
    if typed := type_problems(spec):
        return typed
    p: list[str] = []
    try:
        known = profiles()
    except ProfileError as e:  # a profile file with a mistake: its one line
        return [str(e)]
    prof = known.get(spec.profile)
    if prof is None:
        try:
            get_profile(spec.profile)
        except ProfileError as e:
            p.append(str(e))
    if spec.tracker not in TRACKERS:
        p.append(f"unknown tracker {spec.tracker!r}: use one of {', '.join(TRACKERS)}")
    p += shape_problems(spec.nodes, spec.gpus_per_node, spec.spare_nodes)
    p += name_problems(spec)
    p += _limit_problems(spec, signal_source)
    p += _control_problems(spec)
    p += check_slurm_options(spec)
    p += _env_and_mount_problems(spec)
    if prof is not None:
        p += _profile_problems(spec, prof, cpu_job)
    return p


def _limit_problems(spec: JobSpec, signal_source: str) -> list[str]:
    """Spares, CPUs per task, the time limit, the warning signal and the port against their ranges."""
    p: list[str] = []
    if spec.spare_nodes < 0:
        p.append(f"spare_nodes={spec.spare_nodes}: cannot be negative; use 0 for no spares")
    elif spec.nodes >= 1 and spec.spare_nodes > spec.nodes:
        p.append(
            f"spare_nodes={spec.spare_nodes} is more than nodes={spec.nodes}: at most one spare per training node; "
            f"set --spare-nodes {spec.nodes} or fewer"
        )
    if spec.cpus_per_task is not None and spec.cpus_per_task < 1:
        p.append(f"cpus_per_task={spec.cpus_per_task}: need at least 1 (or leave it unset)")
    if not _TIME.match(spec.time):
        p.append(f"time={spec.time!r}: use Slurm's format, e.g. 04:00:00, 90 (minutes) or 1-12:00:00")
    elif spec.requeue and spec.signal_seconds is not None and spec.signal_seconds >= time_seconds(spec.time):
        p.append(
            f"signal_seconds={spec.signal_seconds}{signal_source} is not shorter than time={spec.time}: the warning "
            "signal would come before the job starts; lower it (--signal-seconds) or raise the time limit"
        )
    if spec.signal_seconds is not None and not 0 <= spec.signal_seconds <= 65535:
        p.append(f"signal_seconds={spec.signal_seconds}: Slurm accepts 0..65535")
    if not 1024 <= spec.port <= 65535:
        p.append(f"port={spec.port}: pick an unprivileged port (1024..65535)")
    elif not spec.exclusive and spec.port + SHARED_PORT_SPAN - 1 > 65535:
        p.append(
            f"port={spec.port}: jobs on shared nodes rendezvous on port + job id % {SHARED_PORT_SPAN}; "
            f"pick a port <= {65536 - SHARED_PORT_SPAN}"
        )
    return p


def _control_problems(spec: JobSpec) -> list[str]:
    """Every text the script writes that holds a newline or control character."""
    p: list[str] = []
    for label, value in (
        ("job_name", spec.job_name),
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("exclude", spec.exclude),
        ("constraint", spec.constraint),
        ("reservation", spec.reservation),
        ("mem", spec.mem),
        ("gres", spec.gres),
        ("dependency", spec.dependency),
        *(("sbatch_extra", a) for a in spec.sbatch_extra),
        ("log_dir", spec.log_dir),
        ("run_dir", spec.run_dir),
        ("recipe_dir", spec.recipe_dir),
        ("container_image", spec.container_image),
        ("venv", spec.venv),
        ("assets_dir", spec.assets_dir),
        *(("container_mounts", m) for m in spec.container_mounts),
        *((f"env {k}", v) for k, v in spec.env.items()),
        *((f"override {k}", v) for k, v in spec.overrides.items()),
        *(("program argument", a) for a in spec.program_args),
    ):
        if value is not None and _CONTROL.search(value):
            p.append(f"{label}={value!r} contains a newline or control character: remove it")
    return p


def _env_and_mount_problems(spec: JobSpec) -> list[str]:
    """The log folder, the job's environment (names, no secrets) and the container's mounts."""
    p: list[str] = []
    if spec.log_dir and "%" in spec.log_dir:
        p.append(f"log_dir={spec.log_dir!r}: give a folder; the file name is always <job name>-%j.out")
    for name in spec.env:
        if not _ENV_NAME.match(name):
            p.append(f"env name {name!r} is not a valid variable name (letters, digits, _)")
        if name.upper() in SECRET_NAMES:
            p.append(
                f"env {name}: secrets are never written into scripts nor given to Slurm (it keeps a job's "
                "environment in its record): use its file on the node (`hf auth login`, `wandb login`)"
            )
    for m in spec.container_mounts:
        if len(m.split(":")) not in (2, 3):
            p.append(f"container mount {m!r}: use SRC:DST or SRC:DST:ro")
    if spec.container_mounts and not spec.container_image:
        p.append("container_mounts given without container_image: set --container-image too")
    return p


def _profile_problems(spec: JobSpec, prof: Profile, cpu_job: bool) -> list[str]:
    """What the profile asks of the job: GPUs or none, exclusive nodes for EFA, the venv on the local bench."""
    p: list[str] = []
    if prof.uses_gpus and spec.gpus_per_node == 0 and not cpu_job:
        p.append(f"profile {prof.name} trains on GPUs: set gpus_per_node >= 1 (or use profile local-cpu)")
    if not prof.uses_gpus and spec.gpus_per_node > 0:
        p.append(f"profile {prof.name} has no GPUs: set gpus_per_node=0 (one CPU process per node)")
    if prof.fabric == "efa" and not spec.exclusive:
        p.append(f"profile {prof.name}: EFA devices are per node; set exclusive=True so no other job shares them")
    if not prof.uses_gpus and spec.container_image:
        p.append(f"profile {prof.name} runs in the project venv (no GPUs: the local bench): drop container_image")
    return p


def check_slurm_options(spec: JobSpec) -> list[str]:
    """Static checks of the options written as ``#SBATCH`` lines (Slurm itself judges names and limits:
    ``cookbook render --test-only`` asks it). Control characters are reported by :func:`check_spec`."""
    p: list[str] = []
    slurm_values = {
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "exclude": spec.exclude,
        "constraint": spec.constraint,
        "reservation": spec.reservation,
        "mem": spec.mem,
        "gres": spec.gres,
    }
    examples = {"exclude": "n7,gpu[12-13]", "constraint": "h100&ib", "reservation": "my-reservation"}
    for label, value in slurm_values.items():
        if value is None:
            continue
        if "\\" in value:
            p.append(f"{label}={value!r}: Slurm's #SBATCH parser drops backslashes; remove them")
        if label in examples and not value.strip():
            p.append(f"{label}={value!r} is empty: give a value (e.g. {examples[label]}) or leave it unset")
    if spec.mem is not None and not _MEM.match(spec.mem):
        p.append(
            f"mem={spec.mem!r}: give memory per node as Slurm does, a number with an optional unit K/M/G/T "
            "(e.g. 64G, 500000M; 0 = all of the node's memory)"
        )
    if spec.gres is not None and not all(_GRES.match(item) for item in spec.gres.split(",")):
        p.append(
            f"gres={spec.gres!r}: use NAME[:TYPE][:COUNT], comma-separated (e.g. gpu:8, gpu:h100:8); "
            "GPUs are usually asked for with gpus_per_node"
        )
    if spec.dependency is not None and not _CONTROL.search(spec.dependency) and not _DEPENDENCY.match(spec.dependency):
        p.append(
            f"dependency={spec.dependency!r}: use Slurm's TYPE:JOBID[:JOBID...] (TYPE after, afterany, afterok, "
            "afternotok, aftercorr), e.g. afterok:1234, several joined by ',' (all) or '?' (any), or singleton"
        )
    for arg in spec.sbatch_extra:
        if "\n" in arg or "\r" in arg:
            continue  # reported by check_spec as a control character
        if not _SBATCH_ARG.match(arg):
            p.append(f"sbatch_extra {arg!r}: write one sbatch option as --name or --name=value (e.g. --mail-type=END)")
            continue
        if "\\" in arg:
            p.append(f"sbatch_extra {arg!r}: Slurm's #SBATCH parser drops backslashes; remove them")
        name = arg.split("=", 1)[0]  # sbatch also takes unambiguous abbreviations (--part=gpu)
        own = name if name in SBATCH_OWN else next((o for o in SBATCH_OWN if o.startswith(name)), None)
        if own is not None:
            p.append(f"sbatch_extra {arg!r}: the cookbook writes {own} itself; set {SBATCH_OWN[own]} instead")
    return p
