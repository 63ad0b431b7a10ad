#!/usr/bin/env python3
"""The check ``cookbook rehearse`` runs on every node in the training launcher's place.

A generated sbatch script ends with ``exec python3 -m cookbook_runtime.run ... -- LAUNCHER ARGS`` (VENV's
python3 if set); with ``COOKBOOK_REHEARSE`` set, the runtime starts ``node-check tune run ...`` or
``node-check torchrun ...`` in the launcher's place (no gate, no stop-save), so this program receives the
launcher and exactly the arguments the training would get, on every node of the same allocation, in the
same environment. It trains nothing. It reports, as JSON in ``$COOKBOOK_REHEARSE_OUT/<node>.json``:

- the command it would run (secrets masked) and the environment that matters;
- GPUs visible (Slurm's ``CUDA_VISIBLE_DEVICES``, ``nvidia-smi -L`` where present) against ``--nproc-per-node``;
- CPUs the launcher may use (its affinity) against the CPUs the job has on the node;
- the rendezvous: the head node binds the address and port every node was given, every other node connects;
- the training interpreter (the launcher's ``#!``): it runs on this node and has torch and the framework at
  the tested versions (a venv built on a login node of another architecture does not run);
- the config parsed by the framework's own parser, in that interpreter, once (on the first node; the others
  read its values from the shared reports folder), and on every node the paths it names (model files,
  tokenizer, dataset, autoencoder/encoders) present and readable, the run folder writable, each inside a
  container mount when the job uses a container;
- the network interface NCCL/gloo are told to use, present on the node, and the EFA / InfiniBand device
  the profile names (``FI_PROVIDER=efa``, ``NCCL_IB_HCA``) under ``/sys/class/infiniband``; with EFA, the
  aws-ofi-nccl plugin NCCL needs (else it falls back to sockets);
- the recipe's intended settings (profiling off unless asked, timeouts, HSDP...), the profile's
  environment and log lines tagged with node and global rank.

Standard library only: it runs under any ``python3`` on the node; framework code runs only in the
``--parse`` child started with the launcher's interpreter. It always exits 0 (srun's
``--kill-on-bad-exit`` would otherwise stop the other nodes' checks); the verdict is in the report.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cookbook_runtime import probe
from cookbook_runtime.decide import ENV_FIX, devices_selected, interface_matches

SECRET = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)|_KEY($|_)", re.I)
ENV_SHOWN = re.compile(
    r"^(NCCL_|FI_|GLOO_|TORCH_|TORCHELASTIC_|CUDA_VISIBLE_DEVICES$|OMP_NUM_THREADS$|HF_|TRITON_CACHE_DIR$|"
    r"SLURM_CPUS|SLURM_GPUS|SLURM_JOB_NUM_NODES$|SLURM_NODEID$|PYTHONPATH$|VIRTUAL_ENV$|"
    r"RECIPE_DIR$|RUN_DIR$|MODEL_DIR$|FLUX_DIR$|T5_DIR$|CLIP_DIR$|TINY_DIR$|UCX_)"
)
RDZV_WAIT_S = float(os.environ.get("COOKBOOK_REHEARSE_RDZV_WAIT", "45"))


def secret_values() -> list[str]:
    return [v for k, v in os.environ.items() if SECRET.search(k) and len(v) >= 6]


def mask(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


def launcher_split(argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """``["tune", "run", "--nnodes=2", ..., "recipe", ...]`` -> (launcher words, launcher flags, program args)."""
    words = argv[:2] if argv[:2] == ["tune", "run"] else argv[:1]
    rest = argv[len(words) :]
    flags: dict[str, str] = {}
    i = 0
    while i < len(rest) and rest[i].startswith("--"):
        key, sep, value = rest[i][2:].partition("=")
        if not sep and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            value, i = rest[i + 1], i + 1
        flags[key.replace("_", "-")] = value
        i += 1
    return words, flags, rest[i:]


def program_of(words: list[str], args: list[str]) -> tuple[str, list[str]]:
    """(framework, its own arguments) from what follows the launcher flags."""
    if words == ["tune", "run"]:
        return "torchtune", args
    if args[:2] == ["-m", "cookbook.local.compat.cpu"] and len(args) > 2:
        # local-cpu: torchtune RECIPE ... / torchtitan ... / torchtitan-flux-infer ... (FLUX sampling)
        return ("torchtitan" if args[2].startswith("torchtitan") else args[2]), args[3:]
    if args[:2] in (["-m", "torchtitan.train"], ["-m", "torchtitan.models.flux.inference.infer"]):
        return "torchtitan", args[2:]  # training, or FLUX sampling from its checkpoint (same config parser)
    if args and args[0].endswith(".py"):  # our own programs, each with build_parser(): the use job's or FSDP's
        return ("use" if os.path.basename(args[0]) == "use_lm.py" else "fsdp"), args
    return "unknown", args


# ------------------------------------------------------------------------------------------ parse
def torchtitan_without_triton() -> bool:
    """Runs in the training interpreter: where triton is not installed, import torchtitan through the runtime's
    inert stand-in (:mod:`cookbook_runtime.titan_import`), as the engine's parser and local-cpu jobs do. True
    when it was used; False where triton is installed (a GPU node: nothing is patched)."""
    from cookbook_runtime.titan_import import import_torchtitan_without_triton

    return import_torchtitan_without_triton()


def parse_in_training_env(framework: str, args: list[str], keys: list[str]) -> dict:
    """Runs in the training interpreter: the framework's own parser on ``args``; values of ``keys``."""
    values: dict[str, object] = {}
    if framework == "torchtune":
        from omegaconf import OmegaConf
        from torchtune.config._parse import TuneRecipeArgumentParser
        from torchtune.config._utils import _merge_yaml_and_cli_args

        recipe_args = list(args)  # after the recipe's name(s): `cookbook_tune RECIPE --config ...`
        while recipe_args and not recipe_args[0].startswith("-"):
            recipe_args = recipe_args[1:]
        cfg = _merge_yaml_and_cli_args(*TuneRecipeArgumentParser(description="").parse_known_args(recipe_args))
        for key in keys:
            node = OmegaConf.select(cfg, key, default=None)
            values[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        values["tensor_parallel"] = int(cfg.get("tensor_parallel_dim", 1) or 1)
        files = OmegaConf.select(cfg, "checkpointer.checkpoint_files", default=None)
        if OmegaConf.is_dict(files) and "filename_format" in files:
            n = int(str(files.max_filename))
            values["checkpoint_files"] = [
                str(files.filename_format).format(str(i).zfill(len(str(files.max_filename))), files.max_filename)
                for i in range(1, n + 1)
            ]
        elif OmegaConf.is_list(files):
            values["checkpoint_files"] = [str(f) for f in files]
    elif framework == "torchtitan":
        from torchtitan.config.manager import ConfigManager

        cfg = ConfigManager().parse_args(args)
        for key in keys:
            field: object = cfg
            for part in key.split("."):
                field = getattr(field, part, None)
            values[key] = field if isinstance(field, (str, int, float, bool, type(None))) else str(field)
        par = cfg.parallelism
        values["tensor_parallel"] = par.tensor_parallel_degree
        values["fixed_parallel"] = (
            par.tensor_parallel_degree * par.pipeline_parallel_degree * par.context_parallel_degree
        )
        values["replicate"] = par.data_parallel_replicate_degree
        values["shard"] = par.data_parallel_shard_degree
    elif framework in ("fsdp", "use"):
        import importlib.util

        spec = importlib.util.spec_from_file_location("cookbook_fsdp_train", args[0])
        if spec is None or spec.loader is None:
            raise ImportError(f"{args[0]}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses in the script look their module up here
        spec.loader.exec_module(module)
        ns = module.build_parser().parse_args(args[1:])
        values.update({k: getattr(ns, k, None) for k in keys})
    else:
        raise ValueError(f"unknown program: {' '.join(args[:3])}")
    return values


def interpreter_of(launcher: str) -> str | None:
    """The Python that runs ``launcher`` (its ``#!`` line), e.g. the venv's python for ``torchrun``."""
    path = shutil.which(launcher)
    if not path:
        return None
    try:
        first = Path(path).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and parts[0].endswith("/env") and len(parts) > 1:
            return shutil.which(parts[1])
        return parts[0] if parts else None
    return None


# ------------------------------------------------------------------------------------------ checks
def gpus(expected: int, uses_gpus: bool) -> tuple[dict, list[str]]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len([d for d in (visible or "").split(",") if d.strip()]) if visible is not None else None
    names = probe.gpu_names()
    smi = None if names is None else len(names)
    info = {"CUDA_VISIBLE_DEVICES": visible, "visible": count, "nvidia_smi": smi}
    problems = []
    if uses_gpus:
        seen = count if count is not None else smi
        if not seen:
            problems.append(
                f"no GPU visible (CUDA_VISIBLE_DEVICES={visible!r}): the job asked for GPUs; "
                "check #SBATCH --gpus-per-node and the node's gres.conf"
            )
        elif seen < expected:
            problems.append(
                f"--nproc-per-node={expected} but only {seen} GPU(s) visible: lower --gpus-per-node "
                "to what the nodes have"
            )
        if smi is not None and count is not None and smi < count:
            problems.append(f"nvidia-smi lists {smi} GPU(s) but Slurm gave {count}: a GPU is missing or failed")
    return info, problems


def step_cpus() -> int | None:
    """CPUs Slurm gave this step's task: ``TresPerTask=cpu:N`` of ``scontrol show step`` (absent: 1, what CPU
    binding pins the task to); None when scontrol cannot say."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not (job and step and shutil.which("scontrol")):
        return None
    r = subprocess.run(["scontrol", "show", "step", "-o", f"{job}.{step}"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    m = re.search(r"TresPerTask=\S*?cpu[:=](\d+)", r.stdout)
    return int(m.group(1)) if m else 1


def cpus() -> tuple[dict, list[str]]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    job_cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE")
    given = step_cpus()
    info = {"affinity": affinity, "step": given, "job_on_node": int(job_cpus) if job_cpus else None}
    problems = []
    if given is not None and job_cpus and given < int(job_cpus):
        problems.append(
            f"the launcher's step has {given} CPU(s) but the job has {job_cpus} on this node: pass "
            '--cpus-per-task="${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}" to srun (Slurm 22.05-23.02 '
            "srun does not inherit it), else torchrun, its workers and data loaders share them"
        )
    return info, problems


def interfaces() -> list[str]:
    """This node's network interfaces (netlink: its own network namespace, not the host's /sys)."""
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def interface_problems(names: list[str]) -> tuple[dict, list[str]]:
    """NCCL_SOCKET_IFNAME (prefixes, ``=exact``, ``^exclusions``: the gate's parser, ``decide.interface_matches``)
    and GLOO_SOCKET_IFNAME against this node."""
    nccl, gloo = os.environ.get("NCCL_SOCKET_IFNAME"), os.environ.get("GLOO_SOCKET_IFNAME")
    info = {"interfaces": names, "NCCL_SOCKET_IFNAME": nccl, "GLOO_SOCKET_IFNAME": gloo}
    problems = []
    if nccl and not any(interface_matches(nccl, n) for n in names):
        problems.append(
            f"NCCL_SOCKET_IFNAME={nccl}: no such interface on this node (it has {', '.join(names)}); "
            "unset it to let the script detect the interface, or name one of these"
        )
    if gloo and any(g not in names for g in gloo.split(",")):
        problems.append(f"GLOO_SOCKET_IFNAME={gloo}: no such interface on this node (it has {', '.join(names)})")
    return info, problems


def rendezvous(endpoint: str, nnodes: int) -> tuple[dict, list[str]]:
    """The head node (SLURM_NODEID 0) binds the endpoint; every other node connects and says its name."""
    host, _, port_text = endpoint.rpartition(":")
    port = int(port_text)
    info: dict[str, object] = {"endpoint": endpoint, "head": os.environ.get("SLURM_NODEID", "0") == "0"}
    if nnodes <= 1 and not info["head"]:
        return info, []
    if info["head"]:
        return info, head_listens(info, endpoint, host, port, nnodes)
    return info, joins_head(info, endpoint, host, port)


def head_listens(info: dict[str, object], endpoint: str, host: str, port: int, nnodes: int) -> list[str]:
    """The head node's side: bind the endpoint, wait for every other node's name (into ``info``); problems."""
    try:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
    except OSError as e:
        return [
            f"rendezvous {endpoint}: the head node cannot listen there ({e.strerror}): "
            + (
                "the port is taken by another process; set another --port"
                if e.errno == 98
                else "the address is not one of this node's"
            )
        ]
    srv.listen(64)
    srv.settimeout(1.0)
    seen: list[str] = []
    end = time.monotonic() + RDZV_WAIT_S
    while len(seen) < nnodes - 1 and time.monotonic() < end:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            seen.append(conn.recv(256).decode(errors="replace").strip())
            conn.sendall(b"ok\n")
    srv.close()
    info["reached_by"] = seen
    missing = nnodes - 1 - len(seen)
    return (
        [
            f"rendezvous {endpoint}: {missing} node(s) never reached the head node "
            f"(reached by: {', '.join(seen) or 'none'}); a firewall or the wrong address"
        ]
        if missing > 0
        else []
    )


def joins_head(info: dict[str, object], endpoint: str, host: str, port: int) -> list[str]:
    """Another node's side: connect to the head node and say this node's name (``info["reached"]``); problems."""
    me = socket.gethostname()
    end, err = time.monotonic() + RDZV_WAIT_S, ""
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=3) as c:
                c.sendall(me.encode() + b"\n")
                c.settimeout(5)
                if c.recv(16).startswith(b"ok"):
                    info["reached"] = True
                    return []
        except OSError as e:
            err = e.strerror or str(e)
        time.sleep(0.5)
    info["reached"] = False
    return [
        f"rendezvous {endpoint}: cannot reach the head node from here ({err}): the address must be one "
        "every node can route to (not 127.x), and the port open between nodes"
    ]


def path_check(label: str, value: str, kind: str, expect: list[str], mounts: list[str]) -> list[str]:
    p = Path(value)
    problems = []
    if not p.is_absolute():
        return [
            f"{label}: {value} is a relative path, read from whatever folder the job starts in ({os.getcwd()}): "
            "give an absolute path on the shared filesystem"
        ]
    if not p.exists():
        return [
            f"{label}: {value} does not exist on this node ({'folder' if kind == 'dir' else 'file'} expected; "
            "is it on the shared filesystem every node mounts?)"
        ]
    if kind == "dir" and not p.is_dir():
        return [f"{label}: {value} is not a folder"]
    if not os.access(value, os.R_OK | (os.X_OK if p.is_dir() else 0)):
        problems.append(f"{label}: {value} is not readable by {os.environ.get('USER', 'this user')} on this node")
    missing = [e for e in expect if not (p / e).exists()]
    if missing:
        problems.append(
            f"{label}: {value} lacks {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            + " (an incomplete download?)"
        )
    if mounts and not any(value == d or value.startswith(d.rstrip("/") + "/") for d in mounts):
        problems.append(f"{label}: {value} is inside no --container-mounts destination ({', '.join(mounts)})")
    return problems


def paths(framework: str, values: dict, manifest: dict, mounts: list[str], notes: list[str]) -> tuple[dict, list[str]]:
    shown, problems = {}, []
    for entry in manifest.get("paths", {}).get(framework, []):
        value = values.get(entry["key"])
        if value in (None, ""):
            continue
        value = str(value)
        shown[entry["key"]] = value
        looks_local = value.startswith(("/", "./", "../", "~"))
        if entry.get("hub_ok") and not looks_local:
            continue  # a Hub id: read from the Hub (or its cache) at start-up
        expect = list(entry.get("expect", []))
        if entry["key"] == "checkpointer.checkpoint_dir":
            expect += values.get("checkpoint_files", [])
        problems += path_check(
            f"{entry['key']} ({entry['what']})", os.path.expanduser(value), entry["kind"], expect, mounts
        )
        if value.startswith(("/tmp/", "/dev/shm/")) and int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) > 1:
            notes.append(
                f"{entry['key']}: {value} is on node-local storage on most clusters: every node needs its own "
                "copy; prefer the shared filesystem"
            )
    run_dir = os.environ.get("RUN_DIR")
    if run_dir:
        try:
            os.makedirs(run_dir, exist_ok=True)
            probe = Path(run_dir) / f".rehearse-{socket.gethostname()}-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
            shown["RUN_DIR"] = run_dir
        except OSError as e:
            problems.append(f"run folder {run_dir} is not writable on this node ({e.strerror})")
    return shown, problems


def parallel_problems(framework: str, values: dict, nproc: int, nnodes: int) -> list[str]:
    tp = int(values.get("tensor_parallel") or 1)
    problems = []
    if tp > 1 and nproc % tp:
        key = "tensor_parallel_dim" if framework == "torchtune" else "parallelism.tensor_parallel_degree"
        problems.append(
            f"{key}={tp} does not divide the {nproc} processes per node (--nproc-per-node): tensor "
            "parallelism stays inside a node; use a divisor of the GPUs per node"
        )
    world = nproc * nnodes
    fixed = int(values.get("fixed_parallel") or tp)
    if world % fixed:
        problems.append(f"world size {world} is not a multiple of the model-parallel degrees ({fixed})")
    rep, shard = values.get("replicate"), values.get("shard")
    if isinstance(rep, int) and isinstance(shard, int) and shard > 0 and rep * shard * fixed != world:
        problems.append(f"data_parallel_replicate_degree {rep} x shard {shard} x {fixed} != world size {world}")
    return problems


def config_problems(values: dict, expected: dict, nnodes: int, profiling_requested: bool = False) -> tuple[list, list]:
    """Values the recipe sets on purpose (``expected``: key -> [value, why]) that this config does not have:
    (problems, notes). A profiler setting the user asked for (``profiling_requested``) is only a note."""
    problems, notes = [], []
    for key, (want, why) in expected.items():
        want = nnodes if want == "$SLURM_JOB_NUM_NODES" else want
        if key in values and values[key] != want:
            text = f"{key}={values[key]!r} where the recipe sets {want!r}: {why}"
            if profiling_requested and key.startswith("profiler."):
                notes.append(text + " (profiling was asked for)")
            else:
                problems.append(text + f"; set {key}={want} (or render the script again)")
    return problems, notes


def env_problems(expected: dict) -> list[str]:
    """Profile variables (name -> [value, source]) missing or different here."""
    return [
        f"{name}={os.environ.get(name)!r} where the profile sets {value!r} ({source}): export {name}={value} "
        "in the script"
        for name, (value, source) in expected.items()
        if os.environ.get(name) != value
    ]


def log_tag_problems(flags: dict) -> list[str]:
    """Every log line must say its node (srun --label) and its GLOBAL rank: torchrun's own ``--tee`` tag is
    the local rank (``[rank0]`` on every node) unless TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE names ``${rank}``."""
    template = os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "")
    if os.environ.get("SLURM_LABELIO") == "1" and "tee" in flags and "${rank}" in template:
        return []
    return [
        "log lines are not tagged with node and global rank: use srun --label, torchrun --role=rank --tee=3 "
        "and export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:' (torchrun's own tag is the local "
        "rank); else ranks cannot be told apart and a parser may keep another rank's numbers"
    ]


def rdma_check(
    sysfs: str | os.PathLike = "/sys/class/infiniband", gpu_node: bool | None = None
) -> tuple[dict, list, list]:
    """The RDMA devices the profile names (``FI_PROVIDER=efa``: an EFA device; ``NCCL_IB_HCA``: a matching
    HCA, prefixes / ``=exact`` / ``^exclusions``, ``:port`` ignored) present under ``sysfs``: (info, problems,
    notes). Missing is a problem on a GPU node (``nvidia-smi`` present), a note elsewhere (a CPU test bench)."""
    root = Path(sysfs)
    devices = probe.rdma_devices(root)
    info: dict[str, object] = {"devices": devices}
    missing = []
    if os.environ.get("FI_PROVIDER") == "efa":
        info["efa"] = efa = probe.efa_devices(root)  # the gate's and the doctor's EFA test too
        if not efa:
            missing.append(f"FI_PROVIDER=efa but no EFA device under {root} (has: {', '.join(devices) or 'none'})")
        from cookbook_runtime.nodecheck import nccl_net_plugin

        info["nccl_net_plugin"] = plugin = nccl_net_plugin()
        if plugin is None:
            missing.append(
                "FI_PROVIDER=efa but aws-ofi-nccl's NCCL plugin (libnccl-net*.so) is not on LD_LIBRARY_PATH, in "
                "/opt/amazon/ofi-nccl/lib or the ld cache: NCCL would fall back to sockets"
            )
    hca = os.environ.get("NCCL_IB_HCA", "")
    if hca and not hca.startswith("^"):  # the one NCCL_IB_HCA parser, the gate's too
        info["NCCL_IB_HCA"] = ok = devices_selected(hca, devices)
        if not ok:
            missing.append(f"NCCL_IB_HCA={hca} matches no device under {root} (has: {', '.join(devices) or 'none'})")
    fix = "; check `ibv_devices`, load the driver, or unset the variable on a cluster without that fabric"
    gpu_node = bool(shutil.which("nvidia-smi")) if gpu_node is None else gpu_node
    return info, ([m + fix for m in missing] if gpu_node else []), ([] if gpu_node else [m + fix for m in missing])


def python_environment(interp: str, needs: dict[str, str], login_machine: str) -> tuple[dict, list[str]]:
    """The training interpreter's answer (``cookbook_runtime.pyenv``: its machine, the installed versions of
    ``needs``) and the problems: a package missing or at another version than tested, or an interpreter that
    does not run here (built for the login node's machine, not this node's)."""
    answer, why = probe.ask_python(interp, list(needs))  # Exec format error: built for another machine
    if answer is None:
        here = platform.machine()
        other = f" (this node is {here}, the login node {login_machine})" if login_machine not in ("", here) else ""
        return {"python": interp, "error": why}, [f"the training interpreter {interp} does not run here{other}: {why}. "
                                                   f"Fix: {ENV_FIX}"]  # fmt: skip
    problems = []
    for package, want in needs.items():
        have = answer["versions"].get(package)
        if have is None:
            problems.append(f"{package} is not installed for {interp} ({answer['machine']}). Fix: {ENV_FIX}")
        elif want and have.split("+")[0] != want:
            problems.append(f"{package} {have} for {interp}, tested with {want}: install the pinned version")
    return answer, problems


def shared_parse(path: Path, seconds: float = 300.0) -> dict[str, Any]:
    """The first node's parse of the config (``parsed.json`` in the shared reports folder): the config is the
    same on every node, so one node parses it (seconds of framework import) and the others check their paths
    and settings against its values."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(0.5)
    return {"ok": False, "error": f"the first node did not parse the config within {seconds:.0f} s"}


# ------------------------------------------------------------------------------------------ main
def parse_child(framework: str, keys: list[str], args: list[str]) -> int:
    """The ``--parse`` child, in the training interpreter: the framework's parse of ``args`` as one JSON line."""
    try:
        standin = framework == "torchtitan" and torchtitan_without_triton()
        answer = {"ok": True, "values": parse_in_training_env(framework, args, keys), "triton_standin": standin}
        print(json.dumps(answer, default=str))
    except BaseException as e:  # noqa: BLE001  (SystemExit from argparse included: report, never raise)
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
    return 0


def read_manifest() -> dict[str, Any]:
    """What the recipe and the profile expect (``COOKBOOK_REHEARSE_MANIFEST``); empty when none was written."""
    path = os.environ.get("COOKBOOK_REHEARSE_MANIFEST")
    return json.loads(Path(path).read_text()) if path else {}


def new_report(argv: list[str], framework: str, secrets: list[str]) -> dict[str, object]:
    """The report's head: this node, the framework, the command and the environment that matters (masked)."""
    return {
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "host": socket.gethostname(),
        "nodeid": os.environ.get("SLURM_NODEID"),
        "framework": framework,
        "command": mask(" ".join(argv), secrets),
        "env": {
            k: ("set (hidden)" if SECRET.search(k) else mask(v, secrets))
            for k, v in sorted(os.environ.items())
            if ENV_SHOWN.match(k) or SECRET.search(k)
        },
    }


def node_problems(
    report: dict[str, object], launcher_word: str, flags: dict[str, str], nproc: int, nnodes: int, manifest: dict
) -> list[str]:
    """The node's own checks (launcher on PATH, GPUs, CPUs, interfaces, rendezvous) into ``report``; problems."""
    problems: list[str] = []
    launcher = shutil.which(launcher_word)
    report["launcher"] = launcher
    if not launcher:
        problems.append(
            f"{launcher_word} is not on PATH on this node: activate the training environment in the script "
            "(render with --venv) or before sbatch"
        )
    report["gpus"], p = gpus(nproc, bool(manifest.get("uses_gpus", True)))
    problems += p
    report["cpus"], p = cpus()
    problems += p
    report["network"], p = interface_problems(interfaces())
    problems += p
    if "rdzv-endpoint" in flags:  # first: every node starts it at about the same time
        report["rendezvous"], p = rendezvous(flags["rdzv-endpoint"], nnodes)
        problems += p
    return problems


def first_parse(interp: str, framework: str, keys: list[str], program_args: list[str], shared: Path) -> dict:
    """The first node's parse of the config in the training interpreter, left in ``shared`` for the others."""
    r = subprocess.run(
        [interp, os.path.abspath(__file__), "--parse", framework, json.dumps(keys), *program_args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    parsed: dict[str, Any] = (
        json.loads(lines[-1]) if lines else {"ok": False, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    )
    shared.parent.mkdir(parents=True, exist_ok=True)
    (shared.parent / f"parsed.{os.getpid()}.tmp").write_text(json.dumps(parsed, default=str))
    os.replace(shared.parent / f"parsed.{os.getpid()}.tmp", shared)
    return parsed


def config_values(
    report: dict[str, object], interp: str, framework: str, args: list[str], program_args: list[str],
    manifest: dict, out_dir: Path, secrets: list[str],
) -> tuple[dict, list[str], list[str]]:  # fmt: skip
    """The config as the framework parses it (on the first node; the others read its answer): ``(values,
    problems, notes)``, its verdict in ``report``."""
    keys = [e["key"] for e in manifest.get("paths", {}).get(framework, [])]
    keys += list(manifest.get("expect_config", {}).get(framework, {}))
    first = (os.environ.get("SLURM_NODEID") or "0") == "0"
    shared = out_dir / "parsed.json"
    parsed = first_parse(interp, framework, keys, program_args, shared) if first else shared_parse(shared)
    if parsed["ok"]:
        report["config"] = "parsed by " + framework + ("" if first else " on the first node")
        notes = []
        if parsed.get("triton_standin") and args[:2] != ["-m", "cookbook.local.compat.cpu"]:
            notes.append(
                f"triton is not installed for {interp}: torchtitan imports it to train on GPUs; the config "
                "was parsed with an inert stand-in (cookbook_runtime.titan_import)"
            )
        return parsed["values"], [], notes
    if first:
        report["config"] = "rejected"
        return {}, [f"{framework} rejects the config: {mask(parsed['error'], secrets)[:500]}"], []
    report["config"] = "rejected on the first node"
    return {}, [], []


def settings_problems(
    framework: str, values: dict, manifest: dict, flags: dict[str, str], nproc: int, nnodes: int
) -> tuple[list[str], list[str]]:
    """The parsed settings, the profile's environment and the log tags against what the job expects:
    ``(problems, notes)``."""
    problems: list[str] = []
    notes: list[str] = []
    if values:
        problems += parallel_problems(framework, values, nproc, nnodes)
        expected = manifest.get("expect_config", {}).get(framework, {})
        p, notes = config_problems(values, expected, nnodes, bool(manifest.get("profiling_requested")))
        problems += p
    problems += env_problems(manifest.get("expect_env", {}))
    problems += log_tag_problems(flags)
    return problems, notes


def write_report(
    report: dict[str, object], problems: list[str], notes: list[str], secrets: list[str], out_dir: Path, took: float
) -> None:
    """``node-N.json`` in the reports folder, and the node's one line."""
    report["problems"] = [mask(x, secrets) for x in problems]
    report["notes"] = [mask(x, secrets) for x in notes]
    report["seconds"] = round(took, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"node-{report['nodeid'] or '0'}.json").write_text(json.dumps(report, indent=1, default=str))
    print(
        f"rehearsal {report['node']}: {'ok' if not problems else str(len(problems)) + ' problem(s)'}"
        + (f", {len(notes)} note(s)" if notes else ""),
        flush=True,
    )


def main(argv: list[str]) -> int:
    """Check this node for the launcher command ``argv`` and write its report; always 0."""
    if argv[:1] == ["--parse"]:  # child in the training interpreter
        return parse_child(argv[1], json.loads(argv[2]), argv[3:])
    started = time.monotonic()
    out_dir = Path(os.environ.get("COOKBOOK_REHEARSE_OUT", "."))
    manifest = read_manifest()
    secrets = secret_values()
    words, flags, args = launcher_split(argv)
    framework, program_args = program_of(words, args)
    nproc = int(flags.get("nproc-per-node", "1") or 1)
    nnodes = int(flags.get("nnodes", os.environ.get("SLURM_JOB_NUM_NODES", "1")).split(":")[-1])
    report = new_report(argv, framework, secrets)
    problems = node_problems(report, words[0], flags, nproc, nnodes, manifest)
    interp = interpreter_of(words[0]) if report["launcher"] else None
    python = interp or shutil.which("python3")  # no launcher on PATH: the job's own python3 (VENV's) says why
    if python:
        report["python"], p = python_environment(python, manifest.get("needs", {}), manifest.get("login_machine", ""))
        problems += p
    values: dict = {}
    notes: list[str] = []
    if interp and framework != "unknown":
        values, p, notes = config_values(report, interp, framework, args, program_args, manifest, out_dir, secrets)
        problems += p
    report["paths"], p = paths(framework, values, manifest, list(manifest.get("mounts", [])), notes)
    problems += p
    p, n = settings_problems(framework, values, manifest, flags, nproc, nnodes)
    problems += p
    notes += n
    report["rdma"], p, n = rdma_check()
    problems += p
    notes += n
    write_report(report, problems, notes, secrets, out_dir, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
