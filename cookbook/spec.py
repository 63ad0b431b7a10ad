"""The job a user asks for (:class:`JobSpec`) and the cluster profiles it runs under.

A profile is the environment a kind of cluster needs (NCCL/EFA/InfiniBand, socket interface,
backend). Every value says where it comes from; the rendered script carries that as a comment.
:func:`check_spec` lists every problem with a spec at once; recipe-specific checks live in the
recipe (:meth:`cookbook.recipes.base.Recipe.validate`), and :func:`cookbook.render.validate` runs both.
"""

from __future__ import annotations

import dataclasses
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal

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
_SBATCH_ARG = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=.*)?$", re.S)

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
    "--signal": "signal_seconds (--signal-seconds)",
}
SHARED_PORT_SPAN = 10000  # non-exclusive jobs: rendezvous port = port + job id % SHARED_PORT_SPAN


class SpecError(ValueError):
    """A job spec that cannot run; ``problems`` lists each one with what to change."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:  # one problem, one line
            super().__init__(f"invalid job: {self.problems[0]}")
        else:
            super().__init__("invalid job:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class EnvVar:
    """One environment variable a profile sets, with where its value comes from.

    ``expand``: the value is bash (e.g. ``${TMPDIR:-/tmp}/...``) evaluated on the node, not a literal.
    """

    name: str
    value: str
    source: str
    expand: bool = False


@dataclass(frozen=True)
class Profile:
    """What one kind of cluster needs: backend, GPUs or not, its environment and network interface.

    ``interface``: ``"detect"`` sets ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` at run time to the
    interface holding the head node's address (names differ between sites and images: eth0, ens*, enp*,
    bond0); a pinned value is written as it is; None leaves NCCL's own choice.

    ``gpu``: the GPU kind (a key of :data:`cookbook.gpus.GPU_KINDS`) costs and forecasts assume when the user
    names none; ``price_per_gpu_hour``: the site's price (None: ``gpu``'s list price in :mod:`cookbook.gpus`);
    ``fabric``: the inter-node network NCCL should use (``"ib"``, ``"efa"``; None: TCP is all there is).
    """

    name: str
    description: str
    backend: Literal["nccl", "gloo"]
    env: tuple[EnvVar, ...]
    uses_gpus: bool = True
    interface: str | None = None
    interface_source: str = ""
    gpu: str | None = None
    price_per_gpu_hour: float | None = None
    fabric: str | None = None

    def gpu_hour_price(self, gpu: str | None = None) -> float | None:
        """Price per GPU-hour (per node-hour without GPUs): the profile's own, else the list price of
        ``gpu`` (default: the profile's kind); None when neither is known."""
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour
        from cookbook.gpus import list_price_per_gpu_hour

        kind = gpu or self.gpu
        return list_price_per_gpu_hour(kind) if kind else None


_DETECTED = (
    "names differ between images (eth0, ens*, enp*): a wrong NCCL_SOCKET_IFNAME fails silently or hangs, "
    "so the script takes the interface holding the head node's address; export NCCL_SOCKET_IFNAME to pin one"
)

_COMMON_GPU = (
    EnvVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        "https://pytorch.org/docs/stable/torch_nccl_environment_variables.html: a failed collective aborts "
        "the job instead of hanging it",
    ),
    EnvVar(
        "NCCL_DEBUG",
        "WARN",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; set INFO to see the transport NCCL picked",
    ),
    EnvVar(
        "HF_HUB_ETAG_TIMEOUT",
        "60",
        "https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables: the 10 s "
        "default times out when hundreds of ranks hit the Hub at once",
    ),
    EnvVar("HF_HUB_DOWNLOAD_TIMEOUT", "60", "same page, same reason"),
    EnvVar("OMP_NUM_THREADS", "1", "torchrun's own default per process; avoids CPU oversubscription"),
    EnvVar(
        "TRITON_CACHE_DIR",
        "${TMPDIR:-/tmp}/triton-cache-$SLURM_JOB_ID",
        "Triton compiles kernels into ~/.triton by default: on a shared home every rank of every node "
        "writes the same files; a node-local folder avoids the contention",
        expand=True,
    ),
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "generic", "any Slurm cluster with NVIDIA GPUs; NCCL picks its transport and interface", "nccl", _COMMON_GPU
        ),
        Profile(
            "nebius",
            "Nebius Soperator: H100/H200 nodes with InfiniBand",
            "nccl",
            _COMMON_GPU
            + (EnvVar("NCCL_IB_HCA", "mlx5", "Nebius GPU hosts: InfiniBand HCAs are mlx5_* (check: `ibv_devices`)"),),
            interface="detect",
            gpu="h100",
            fabric="ib",
            interface_source="Nebius Soperator sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME "
            "(https://github.com/nebius/ml-cookbook slurm/torchtitan/multinode_flux.sh uses eth0); " + _DETECTED,
        ),
        Profile(
            "crusoe",
            "Crusoe Cloud Slurm: H100/H200/GB200 nodes with InfiniBand",
            "nccl",
            _COMMON_GPU + (EnvVar("NCCL_IB_HCA", "mlx5", "Crusoe IB nodes: HCAs are mlx5_* (check: `ibv_devices`)"),),
            interface="detect",
            gpu="h100",
            fabric="ib",
            interface_source="Crusoe VM images: the VPC interface; " + _DETECTED,
        ),
        Profile(
            "aws-efa",
            "AWS ParallelCluster / HyperPod p4d/p5 nodes with EFA",
            "nccl",
            _COMMON_GPU
            + (
                EnvVar("FI_PROVIDER", "efa", "https://github.com/aws/aws-ofi-nccl: use the EFA libfabric provider"),
                EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", "AWS EFA docs: GPUDirect RDMA on p4d/p5"),
                EnvVar("FI_EFA_SET_CUDA_SYNC_MEMOPS", "0", "aws-ofi-nccl README (p5 recommended setting)"),
                EnvVar(
                    "FI_EFA_USE_HUGE_PAGE",
                    "0",
                    "awsome-distributed-training and the AWS EFA troubleshooting notes: EFA "
                    "huge pages make os.fork() of data-loader workers fail with 'Cannot allocate memory'",
                ),
            ),
            interface="^docker,lo,veth",
            gpu="h100",  # p5
            fabric="efa",
            interface_source="https://github.com/aws-samples/awsome-distributed-training: "
            "every interface but loopback/containers (instance interface names differ: ens*, enp*); NCCL_BUFFSIZE "
            "and NCCL_P2P_NET_CHUNKSIZE stay at NCCL's defaults, as its NCCL cheat sheet advises",
        ),
        Profile(
            "local-cpu",
            "the embedded local cluster: tiny models on CPU, gloo",
            "gloo",
            (
                EnvVar("OMP_NUM_THREADS", "1", "2-core machine: one thread per rank keeps both ranks responsive"),
                EnvVar("CUDA_VISIBLE_DEVICES", "", "no GPU: make sure nothing tries one"),
                EnvVar("HF_HUB_OFFLINE", "1", "tiny assets are local; never wait for the hub"),
                EnvVar("HF_DATASETS_OFFLINE", "1", "same, for datasets"),
                EnvVar("TOKENIZERS_PARALLELISM", "false", "no tokenizer thread pool next to the training threads"),
            ),
            uses_gpus=False,
            price_per_gpu_hour=0.0,  # your own machine
        ),
    )
}


@dataclass(frozen=True)
class ProfileDefaults:
    """The fields a profile decides unless the user says otherwise (see :func:`profile_defaults`)."""

    gpus_per_node: int
    time: str
    exclusive: bool
    signal_seconds: int


# GPU profiles: 8 GPUs per node, 4 hours, whole nodes, USR1 two minutes before the limit. ``local-cpu``
# (the embedded cluster): no GPUs, 10 minutes, shared nodes, a 30-second preemption warning.
GPU_DEFAULTS = ProfileDefaults(gpus_per_node=8, time="04:00:00", exclusive=True, signal_seconds=120)
LOCAL_CPU_DEFAULTS = ProfileDefaults(gpus_per_node=0, time="00:10:00", exclusive=False, signal_seconds=30)


@dataclass
class JobSpec:
    """Everything about one job that is not the recipe's own config.

    ``overrides`` are recipe config ``key=value`` pairs (torchtune dotted YAML keys; torchtitan
    ``section.key``); ``env`` is extra environment (never secrets: the script reads HF_TOKEN itself).
    """

    recipe: str
    nodes: int = 2
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
    time: str = GPU_DEFAULTS.time
    exclusive: bool = GPU_DEFAULTS.exclusive
    job_name: str | None = None
    log_dir: str = "."  # one log per job: LOG_DIR/<job name>-<job id>.out ("." = where
    # sbatch runs: always exists, Slurm creates no folder)
    script_name: str | None = None  # the script's file name; its configs are named after it
    run_dir: str | None = None  # checkpoints/metrics; default $RECIPE_DIR/runs/<job name>
    recipe_dir: str | None = None  # where the script's configs live; default $SLURM_SUBMIT_DIR
    container_image: str | None = None  # pyxis/enroot: --container-image
    container_mounts: list[str] = field(default_factory=list)  # SRC:DST[:ro]
    profile: str = "generic"
    requeue: bool = True
    signal_seconds: int = GPU_DEFAULTS.signal_seconds  # --signal=B:USR1@N before the time limit
    env: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    venv: str | None = None  # a virtualenv to activate on every node (may use $RECIPE_DIR)
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
        return PROFILES[self.profile]

    @property
    def local_cpu(self) -> bool:
        """The job runs the tiny CPU variant on the embedded local cluster (profile ``local-cpu``)."""
        return self.profile == LOCAL_CPU

    @property
    def procs_per_node(self) -> int:
        """Processes torchrun starts per node: one per GPU, one on CPU."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


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
    return dataclasses.asdict(LOCAL_CPU_DEFAULTS if profile == LOCAL_CPU else GPU_DEFAULTS)


def session_defaults(profile: str) -> dict[str, Any]:
    """:func:`profile_defaults` plus what a job submitted from this process needs: on ``local-cpu`` a
    random rendezvous port (shared nodes: jobs on one node must not collide) and this virtualenv."""
    defaults = profile_defaults(profile)
    if profile == LOCAL_CPU:
        defaults["port"] = random.randint(20000, 39999)
        if sys.prefix != sys.base_prefix:
            defaults["venv"] = sys.prefix
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


def check_spec(spec: JobSpec) -> list[str]:
    """Every problem with the Slurm/profile side of ``spec``, each saying what to change."""
    p: list[str] = []
    if spec.profile not in PROFILES:
        p.append(f"unknown profile {spec.profile!r}: use one of {', '.join(PROFILES)}")
    if spec.tracker not in TRACKERS:
        p.append(f"unknown tracker {spec.tracker!r}: use one of {', '.join(TRACKERS)}")
    if spec.nodes < 1:
        p.append(f"nodes={spec.nodes}: need at least 1 node")
    if spec.gpus_per_node < 0:
        p.append(f"gpus_per_node={spec.gpus_per_node}: cannot be negative")
    if spec.cpus_per_task is not None and spec.cpus_per_task < 1:
        p.append(f"cpus_per_task={spec.cpus_per_task}: need at least 1 (or leave it unset)")
    if not _TIME.match(spec.time):
        p.append(f"time={spec.time!r}: use Slurm's format, e.g. 04:00:00, 90 (minutes) or 1-12:00:00")
    elif spec.requeue and spec.signal_seconds >= time_seconds(spec.time):
        p.append(
            f"signal_seconds={spec.signal_seconds} is not shorter than time={spec.time}: the warning "
            "signal would come before the job starts; lower it or raise the time limit"
        )
    if spec.signal_seconds < 0 or spec.signal_seconds > 65535:
        p.append(f"signal_seconds={spec.signal_seconds}: Slurm accepts 0..65535")
    if not 1024 <= spec.port <= 65535:
        p.append(f"port={spec.port}: pick an unprivileged port (1024..65535)")
    elif not spec.exclusive and spec.port + SHARED_PORT_SPAN - 1 > 65535:
        p.append(
            f"port={spec.port}: jobs on shared nodes rendezvous on port + job id % {SHARED_PORT_SPAN}; "
            f"pick a port <= {65536 - SHARED_PORT_SPAN}"
        )
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
    p += check_slurm_options(spec)
    if spec.log_dir and "%" in spec.log_dir:
        p.append(f"log_dir={spec.log_dir!r}: give a folder; the file name is always <job name>-%j.out")
    for name in spec.env:
        if not _ENV_NAME.match(name):
            p.append(f"env name {name!r} is not a valid variable name (letters, digits, _)")
        if name.upper() in SECRET_NAMES:
            p.append(
                f"env {name}: secrets are never written into scripts; export {name} before sbatch "
                "(Slurm passes your environment) or use its token file"
            )
    for m in spec.container_mounts:
        if len(m.split(":")) not in (2, 3):
            p.append(f"container mount {m!r}: use SRC:DST or SRC:DST:ro")
    if spec.container_mounts and not spec.container_image:
        p.append("container_mounts given without container_image: set --container-image too")
    prof = PROFILES.get(spec.profile)
    if prof is not None:
        if prof.uses_gpus and spec.gpus_per_node < 1:
            p.append(f"profile {prof.name} trains on GPUs: set gpus_per_node >= 1 (or use profile local-cpu)")
        if not prof.uses_gpus and spec.gpus_per_node != 0:
            p.append(f"profile {prof.name} has no GPUs: set gpus_per_node=0 (one CPU process per node)")
        if prof.name == "aws-efa" and not spec.exclusive:
            p.append("profile aws-efa: EFA devices are per node; set exclusive=True so no other job shares them")
        if prof.name == "local-cpu" and spec.container_image:
            p.append("profile local-cpu runs in the project venv: drop container_image")
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
