"""What the batch step asks Slurm, through its commands (standard library only). Each function answers
what Slurm said, or an empty value when it did not answer: the caller decides (see :mod:`.decide`)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence

from .decide import NodeState, parse_job_record


def _run(args: Sequence[str], timeout: float = 30) -> str:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def hostnames(nodelist: str) -> list[str]:
    """``n[1-3]`` -> ``[n1, n2, n3]`` (``scontrol show hostnames``; the list as it is when Slurm does not answer)."""
    out = _run(["scontrol", "show", "hostnames", nodelist]).split()
    return out or [x for x in nodelist.split(",") if x]


def job_record(job: str) -> dict[str, str]:
    return parse_job_record(_run(["scontrol", "-o", "show", "job", job]).strip())


def node_states(nodes: Sequence[str]) -> dict[str, NodeState]:
    """``{node: NodeState}``: sinfo's state and when its reason was set (``%H``)."""
    out: dict[str, NodeState] = {}
    if not nodes:
        return out
    text = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%H"])
    for line in text.splitlines():
        name, _, rest = line.partition("|")
        state, _, since = rest.partition("|")
        out.setdefault(name.strip(), NodeState(state.strip(), _epoch(since.strip())))
    return out


def _epoch(stamp: str) -> float | None:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def config_value(name: str) -> str:
    """A ``scontrol show config`` value as Slurm writes it (``KillWait = 30 sec`` -> ``30 sec``; "" unknown)."""
    m = re.search(rf"^{name}\s*=\s*(.*?)\s*$", _run(["scontrol", "show", "config"]), re.M)
    return m.group(1) if m else ""


def config_seconds(name: str) -> float | None:
    """A ``scontrol show config`` value in seconds (``KillWait = 30 sec``)."""
    m = re.match(r"\d+", config_value(name))
    return float(m.group(0)) if m else None


def partition_grace(partition: str) -> float | None:
    """The partition's preemption ``GraceTime`` in seconds; None where Slurm preempts nothing
    (``PreemptType=preempt/none``) or does not say."""
    if not partition or config_value("PreemptType") in ("", "preempt/none"):
        return None
    m = re.search(r"GraceTime=(\d+)", _run(["scontrol", "-o", "show", "partition", partition]))
    return float(m.group(1)) if m else None


def requeue(job: str) -> bool:
    return subprocess.run(["scontrol", "requeue", job], check=False).returncode == 0


def update_excluded(job: str, excluded: str) -> bool:
    """``scontrol update ExcNodeList=``: Slurm takes it only while a job is pending (22.05 answers a running
    job "Job is no longer pending execution")."""
    done = subprocess.run(
        ["scontrol", "update", f"JobId={job}", f"ExcNodeList={excluded}"], capture_output=True, check=False
    )
    return done.returncode == 0


def submit(args: Sequence[str], script: str, cwd: str, env: dict[str, str]) -> tuple[bool, str]:
    """``sbatch ARGS SCRIPT`` from ``cwd`` with ``env``: (accepted, the new job id or Slurm's message)."""
    try:
        done = subprocess.run(
            ["sbatch", *args, script], capture_output=True, text=True, cwd=cwd, env=env, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    text = (done.stdout + done.stderr).strip()
    return done.returncode == 0, text.split(";")[0] if done.returncode == 0 else text


def clean_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment for a resubmission: this job's own ``SLURM_*`` variables removed (sbatch would take
    them as options), ``SLURM_CONF`` kept."""
    return {k: v for k, v in environ.items() if not re.match(r"SLURMD?_", k) or k == "SLURM_CONF"}


def self_id() -> str:
    """This job for scontrol: a task of an array is ``ARRAY_TASK`` (the bare id of task 0 names the whole array)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
