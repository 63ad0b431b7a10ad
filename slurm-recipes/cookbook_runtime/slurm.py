"""What the batch step asks Slurm, through its commands (standard library only). Each function answers
what Slurm said, or an empty value when it did not answer: the caller decides (see :mod:`.decide`)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Sequence

from .decide import NodeState, parse_job_record, time_limit_seconds
from .decide import preemption_grace as preemption_grace_of

_SAID: set[str] = set()  # the failures already logged (a NodeWatch asks every 10 s)


def _run(args: Sequence[str], timeout: float = 30) -> str:
    """The command's output, or "" when it failed: then one log line, once per command and answer, saying so (the
    caller acts on the empty answer: see :mod:`.decide`)."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
        said = (done.stderr.strip() or "-").splitlines()[0]
        failed = "" if done.returncode == 0 else f"exit {done.returncode}: {said}"
    except (OSError, subprocess.TimeoutExpired) as e:
        done, failed = None, f"{type(e).__name__}: {e}"
    if failed and (line := f"cookbook: `{' '.join(args[:4])}` did not answer ({failed})") not in _SAID:
        _SAID.add(line)
        print(line, flush=True)
    return done.stdout if done is not None and not failed else ""


def hostnames(nodelist: str) -> list[str]:
    """``n[1-3]`` -> ``[n1, n2, n3]`` (``scontrol show hostnames``; the list as it is when Slurm does not answer)."""
    out = _run(["scontrol", "show", "hostnames", nodelist]).split()
    return out or [x for x in nodelist.split(",") if x]


def hostlist(nodes: Sequence[str]) -> str:
    """``[n1, n2, n3]`` -> ``n[1-3]`` (``scontrol show hostlist``; the names joined when Slurm does not answer)."""
    if len(nodes) < 2:
        return ",".join(nodes)
    return _run(["scontrol", "show", "hostlist", ",".join(nodes)]).strip() or ",".join(nodes)


def job_record(job: str) -> dict[str, str]:
    return parse_job_record(_run(["scontrol", "-o", "show", "job", job]).strip())


def node_states(nodes: Sequence[str]) -> dict[str, NodeState]:
    """``{node: NodeState}``: sinfo's state and when its reason was set (``%H``)."""
    if not nodes:
        return {}
    return _states(_run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%H"]))


def _states(text: str) -> dict[str, NodeState]:
    """sinfo's ``%N|%T|%H`` lines as ``{node: NodeState}`` (a node in several partitions: its first line)."""
    out: dict[str, NodeState] = {}
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
    """The partition's preemption ``GraceTime`` in seconds; None where Slurm does not say."""
    m = re.search(r"GraceTime=(\d+)", _run(["scontrol", "-o", "show", "partition", partition]) if partition else "")
    return float(m.group(1)) if m else None


def qos_grace(qos: str) -> float | None:
    """The QOS's preemption ``GraceTime`` in seconds (``sacctmgr``: ``00:05:00``); None where Slurm does not say."""
    text = _run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=GraceTime"]) if qos else ""
    return time_limit_seconds(text.strip().splitlines()[0]) if text.strip() else None


def preemption_grace(partition: str, qos: str) -> float | None:
    """The grace a preemption of this job gets: the QOS's or the partition's, as ``PreemptType`` says."""
    kind = config_value("PreemptType")
    if kind in ("", "preempt/none"):
        return None
    return preemption_grace_of(kind, partition_grace(partition), qos_grace(qos) if kind == "preempt/qos" else None)


def scontrol(*args: str, timeout: float = 30) -> tuple[bool, str]:
    """``scontrol ARGS``: (accepted, Slurm's answer or error), never raising."""
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def requeue(job: str) -> tuple[bool, str]:
    """``scontrol requeue`` of this same job."""
    return scontrol("requeue", job)


def requeue_updated(job: str, *updates: str, tries: int = 20, pause: float = 1.0) -> tuple[bool, str]:
    """The same job requeued with ``updates`` (``ExcNodeList=...``, ``StartTime=now+N``): ``requeuehold``,
    ``update``, ``release``, each answer checked (accepted only when all three are). Slurm takes the update only
    once the job is pending again, so it is retried for a few seconds; the caller ignores TERM meanwhile (the
    requeue signals this batch step). Every option of the job stays as submitted; a release follows whatever
    the update said (never a job held for a human)."""
    ok, said = scontrol("requeuehold", job)
    if not ok:
        return False, f"scontrol requeuehold {job}: {said}"
    for _ in range(tries):
        ok, said = scontrol("update", f"JobId={job}", *updates)
        if ok:
            break
        time.sleep(pause)
    released, answer = scontrol("release", job)
    if not ok:
        return False, f"scontrol update {' '.join(updates)}: {said} (released: {released or answer})"
    return released, "" if released else f"scontrol release {job}: {answer}"


def requeue_excluding(job: str, excluded: str) -> tuple[bool, str]:
    """The same job requeued without some nodes (:func:`requeue_updated`). It may start 10 s later (Slurm would
    hold a requeued job back ~2 min; a start within the second of the requeue meets a revoked credential)."""
    return requeue_updated(job, f"ExcNodeList={excluded}", "StartTime=now+10")


def partition_states(partition: str, reservation: str = "") -> dict[str, NodeState]:
    """The states of the nodes the job may run on: its reservation's, else its partition's."""
    nodes = ""
    if reservation and reservation not in ("(null)", "None"):
        m = re.search(r"Nodes=(\S+)", _run(["scontrol", "-o", "show", "reservation", reservation]))
        nodes = m.group(1) if m else ""
    if nodes:
        return node_states(hostnames(nodes))
    return _states(_run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T|%H"]) if partition else "")


def batch_script(job: str) -> str:
    """The job's batch script as Slurm holds it (``scontrol write batch_script JOB -``; "" when it does not say)."""
    return _run(["scontrol", "write", "batch_script", job, "-"])


def node_address(node: str) -> str:
    """The address slurmctld reaches ``node``'s slurmd at (``NodeAddr``; the name itself when Slurm is silent)."""
    m = re.search(r"NodeAddr=(\S+)", _run(["scontrol", "-o", "show", "node", node]))
    return m.group(1) if m else node


def reachable(address: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``address:port`` opens (a slurmd, a rendezvous store)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def job_steps(job: str) -> list[str]:
    """The job's running steps other than the batch and extern steps (``41.0``, ``41.1``)."""
    text = _run(["squeue", "-h", "-s", "-j", job, "-o", "%i"])
    return [x for x in text.split() if not x.endswith((".batch", ".extern"))]


def kill_step(step: str) -> bool:
    """``scancel --signal=KILL`` a step (what is left of it on the nodes that still answer)."""
    try:
        done = subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def self_id() -> str:
    """This job for scontrol: a task of an array is ``ARRAY_TASK`` (the bare id of task 0 names the whole array)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
