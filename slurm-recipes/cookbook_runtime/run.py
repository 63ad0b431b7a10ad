"""``python3 -m cookbook_runtime.run [SWITCHES] -- LAUNCHER ARGS``: the batch step of a training job.

The sbatch script states the job (its ``#SBATCH`` lines, paths, environment) and ends with this one line; the
runtime does the rest, in order, each step one log line:

1. a run that already finished (``--once``) says so and does nothing;
2. a requeue after a node failure (NODE_FAIL): the nodes that failed during the previous run are excluded;
3. the rendezvous: the batch host's own address (never the NodeName), its interface, a free port;
4. the pre-flight: the nodes' Python has torch and the framework (``--needs``; else the job stops, naming the
   nodes and the fix: the environment is at fault, no node is excluded), the run folder holds a checkpoint
   (``--checkpoint-gb``), and the gate (``--gate``): every node checks itself, the verdict blames only what
   it can attribute (:func:`cookbook_runtime.decide.gate_verdict`) and excludes those nodes; anything else
   is logged, and the job trains;
5. the resume point (``--resume FRAMEWORK``): the newest complete checkpoint of the run folder;
6. one launcher per node (``srun``), shielded from USR1/TERM (:mod:`cookbook_runtime.launch`); USR1 or TERM
   reaching this step becomes the stop flag every rank polls (``--requeue``): the ranks save at the next step
   boundary and exit 0;
7. after the ranks exit: a node at fault (the hang verdict's culprit, a node whose ranks or launcher died of a
   signal while its peers' did not, a node the batch host lost) is recovered from inside the allocation
   (:func:`recover`); a stop-save -> requeue (:data:`cookbook_runtime.decide.AFTER_EXIT`).

Recovery never leaves the job (:func:`cookbook_runtime.decide.recovery`): a spare of the allocation
(``--spare-nodes K``: Slurm gave N+K nodes, N train) takes the node's place and the ranks are launched again
in this same job from the newest checkpoint; with no spare left, the same job is requeued without the node
(``scontrol requeuehold``/``update ExcNodeList``/``release``) where the partition still holds it, else it trains
on. At most ``--max-retries`` recoveries per ``--retry-window`` (``COOKBOOK_MAX_RETRIES`` overrides); a spent
budget requeues a resumable job to start by itself when a recovery is allowed again (never held, never ended).
Nothing here calls ``sbatch``. ``COOKBOOK_PREFLIGHT=0`` skips the gate; ``COOKBOOK_REHEARSE`` (``cookbook
rehearse``) runs a check in the launcher's place. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from . import decide, files, pyenv, resume, slurm


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m cookbook_runtime.run",
        description="Run one training job's batch step: gate, resume, launch one launcher per node, save on "
        "USR1/TERM, watch for hangs, exclude a node at fault and retry.",
        epilog="Everything after -- is the launcher (torchrun ... or tune run ...) and the program's arguments; "
        "the runtime adds the launcher's node, process and rendezvous flags.",
    )
    a = p.add_argument
    a("--nproc-per-node", type=int, default=0, help="processes per node (default: $SLURM_GPUS_ON_NODE, else 1)")
    a("--port", type=int, default=29500, help="rendezvous port on the head node (the next free one if taken)")
    a("--port-span", type=int, default=0, help="nodes shared with other jobs: port + job id %% SPAN (0: exclusive)")
    a("--interface", default="detect", help="NCCL/gloo interface: detect (the head address's), a name, or none")
    a("--resume", choices=resume.FRAMEWORKS, default="none", help="whose checkpoints to resume from")
    a("--resume-adapter", action="store_true", help="torchtune LoRA: resume the adapter of a step checkpoint")
    a("--resume-filename-format", default="", help="torchtune: the checkpointer's filename_format")
    a("--checkpoint-dir", default="", help="torchtitan/fsdp: where the checkpoints are (default under RUN_DIR)")
    a("--once", action="store_true", help="a run that finished its training does nothing when submitted again")
    a("--requeue", action="store_true", help="USR1/TERM: every rank saves at its next step boundary; requeue")
    a("--lead-seconds", type=float, default=0.0, help="the --signal lead time: how often the ranks agree on a stop")
    a("--lead-from-signal", action="store_true", help="the lead time is the job's own #SBATCH --signal's")
    a("--save-seconds", type=float, default=0.0, help="the model's stop-save time (hang floor, KillWait check)")
    a("--lead-for-save", action="store_true", help="MODEL picked at run time: a too short --signal, our own stop")
    a("--spare-nodes", type=int, default=0, help="K of the allocation's nodes stand by; a node at fault is swapped")
    a("--max-retries", type=int, default=2, help="recoveries per --retry-window (COOKBOOK_MAX_RETRIES overrides)")
    a("--retry-window", type=float, default=3600.0, help="seconds over which --max-retries recoveries are counted")
    a("--node-watch-seconds", type=float, default=10.0, help="how often the batch host checks the training nodes")
    g = p.add_argument_group("pre-flight gate (thresholds and their sources: cookbook profiles show PROFILE)")
    g.add_argument("--gate", action="store_true", help="check every node before training")
    g.add_argument("--gate-strict", action="store_true", help="stop on a problem no node can be blamed for")
    g.add_argument("--gate-seconds", type=float, default=60.0, help="the checks' budget (start-up added)")
    g.add_argument("--gate-matmul-fraction", type=float, default=0.0, help="GPU: clearly broken below F x peak")
    g.add_argument("--gate-matmul-min-tflops", type=float, default=0.0, help="CPU: clearly broken below")
    g.add_argument("--gate-matmul-peer-ratio", type=float, default=0.7, help="below R x the peers' median: blamed")
    g.add_argument("--gate-busbw-floor", type=float, default=0.0, help="all-reduce bus bandwidth, GB/s, broken below")
    g.add_argument("--gate-busbw-peer-ratio", type=float, default=0.6, help="below R x the peers' median: blamed")
    g.add_argument("--gate-allreduce-mb", type=int, default=256, help="all-reduce payload per rank, MiB")
    g.add_argument("--gate-min-free-gb", type=float, default=0.0, help="free node-local disk ($TMPDIR)")
    g.add_argument("--needs", default="", help="PKG==VERSION,...: the nodes' Python must have these (else stop)")
    g.add_argument("--checkpoint-gb", type=float, default=0.0, help="one checkpoint's size, GB: RUN_DIR must hold it")
    p.add_argument("--srun-arg", action="append", default=[], help="an extra srun option (container image...)")
    p.add_argument("launcher", nargs=argparse.REMAINDER, help="-- torchrun|tune run ARGS")
    return p


def say(line: str) -> None:
    print(line, flush=True)


class Job:
    """This batch step: Slurm's view of the job, the nodes that train and stand by, the run folder's state."""

    def __init__(self, args: argparse.Namespace) -> None:
        env = os.environ
        self.args = args
        self.id = env.get("SLURM_JOB_ID", "0")
        self.self_id = slurm.self_id()
        self.restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        self.nodelist = env.get("SLURM_JOB_NODELIST", socket.gethostname())
        self.allocated = slurm.hostnames(self.nodelist)
        self.batch_host = self.allocated[0]
        self.nodes, self.spares = decide.placement(self.allocated, args.spare_nodes)
        self.run_dir = Path(env.get("RUN_DIR") or os.getcwd())
        self.state = files.state_dir(self.run_dir)
        self.state.mkdir(parents=True, exist_ok=True)
        retries = env.get("COOKBOOK_MAX_RETRIES", "")
        self.max_retries = int(retries) if retries.isdigit() else args.max_retries
        self.started = time.time()
        self.launches = 0  # launches of the ranks in this run (a recovery launches again)
        self.signal: str | None = None
        self.timer: threading.Timer | None = None  # the runtime's own stop (:func:`lead_time`)

    # ------------------------------------------------------------ the records
    def record(self, end: float | None = None, how: str = "") -> None:
        with open(self.state / files.RUNS, "a") as f:
            stamp = f"{end:.0f}" if end is not None else ""
            f.write(f"{self.id}\t{self.restart}\t{','.join(self.allocated)}\t{self.started:.0f}\t{stamp}\t{how}\n")

    def incidents(self) -> list[decide.Incident]:
        try:
            return decide.parse_incidents(files.recoveries(self.run_dir).read_text())
        except OSError:
            return []

    def note(self, incident: decide.Incident) -> None:
        try:
            with open(files.recoveries(self.run_dir), "a") as f:
                f.write(incident.row() + "\n")
        except OSError as e:  # the ledger is for reading later: never a reason to stop
            say(f"cookbook: could not write {files.recoveries(self.run_dir)}: {e}")

    def swap(self, out: Sequence[str], spares: Sequence[str]) -> None:
        """``out`` leave the training nodes (and the spares), ``spares`` take their places."""
        self.nodes = [spares[list(out).index(x)] if x in out else x for x in self.nodes]
        self.spares = [x for x in self.spares if x not in spares and x not in out]

    def resume_args(self) -> tuple[list[str], list[str]]:
        """The launch arguments and log lines of the newest complete checkpoint (:mod:`.resume`)."""
        args = self.args
        return resume.resume(
            args.resume, self.run_dir, checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else None,
            adapter=args.resume_adapter, filename_format=args.resume_filename_format, job=self.id,
        )  # fmt: skip


def local_addresses() -> list[tuple[str, str]]:
    """This host's ``(interface, IPv4)`` pairs (``ip -o -4 addr``)."""
    try:
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] == "inet":
            out.append((words[1], words[3].split("/")[0]))
    return out


def resolved_addresses() -> list[str]:
    try:
        return [str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        return []


def rendezvous(job: Job) -> tuple[str, int]:
    """The head address and a free port; NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME exported when detected."""
    args, env = job.args, os.environ
    pinned = env.get("NCCL_SOCKET_IFNAME", "") or ("" if args.interface in ("detect", "none") else args.interface)
    found = decide.head_address(local_addresses(), resolved_addresses(), pinned)
    address, interface = found if found else (socket.gethostname(), "")
    if args.interface != "none" and interface and not env.get("NCCL_SOCKET_IFNAME"):
        if args.interface == "detect":
            env["NCCL_SOCKET_IFNAME"] = interface
        else:
            env["NCCL_SOCKET_IFNAME"] = args.interface
    if env.get("NCCL_SOCKET_IFNAME"):
        # gloo takes an interface name, not NCCL's selectors (^docker,lo): the one the selector picked here
        plain = re.fullmatch(r"[\w.:-]+", env["NCCL_SOCKET_IFNAME"])
        if plain or interface:
            env.setdefault("GLOO_SOCKET_IFNAME", env["NCCL_SOCKET_IFNAME"] if plain else interface)
        say(f"network interface: {env['NCCL_SOCKET_IFNAME']}")
    job_id = int(job.id) if job.id.isdigit() else 0
    port = free_port(address, decide.rendezvous_port(args.port, job_id, not args.port_span, args.port_span or 1))
    return address, port


def free_port(address: str, port: int) -> int:
    """``port``, or the next one free on ``address``."""
    for _ in range(8):
        if not slurm.reachable(address, port, timeout=2):
            break
        say(f"cookbook: rendezvous port {port} is taken on {address}; trying {port + 1}")
        port += 1
    return port


def say_start(job: Job, address: str, port: int) -> None:
    """The start line (``files.START``: goodput and the metrics read a start from it), the nodes in Slurm's
    hostlist form (``gpu[0001-1000]``, not 1,000 names)."""
    nodes = job.nodelist if job.nodes == job.allocated else slurm.hostlist(job.nodes)
    spares = f", spare(s) [{slurm.hostlist(job.spares)}]" if job.args.spare_nodes else ""
    say(f"job {job.id}: {len(job.nodes)} node(s) [{nodes}], rendezvous {address}:{port}, run dir {job.run_dir}"
        f"{spares}")  # fmt: skip


def srun_prefix(args: argparse.Namespace, nodes: Sequence[str] = (), overlap: bool = False) -> list[str]:
    """One task per node of ``nodes`` (all the allocation's when empty) with every CPU the job has there (srun of
    Slurm 22.05-23.02 does not inherit ``--cpus-per-task``), log lines tagged with the node index; ``overlap``:
    beside what is left of an earlier step (a lost node never reports its end)."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE", "1")
    # the step's own counts: the job's (SLURM_NTASKS of N+K nodes) would not fit the N nodes named
    where = [f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", f"--nodelist={','.join(nodes)}"] if nodes else []
    return ["srun", *where, "--ntasks-per-node=1", "--label", f"--cpus-per-task={cpus}",
            *(["--overlap"] if overlap else []), *args.srun_arg]  # fmt: skip


def recent_pass(job: Job, checked: list[str]) -> float | None:
    """Seconds since every node of ``checked`` passed the whole gate in this job (their own checks then
    suffice; said), None when they did not within ``COOKBOOK_GATE_WINDOW_S``."""
    try:
        passes = files.gate_passes(job.run_dir).read_text()
    except OSError:
        passes = ""
    window = float(os.environ.get("COOKBOOK_GATE_WINDOW_S") or decide.GATE_WINDOW_S)
    since = decide.gate_shortcut(passes, job.id, checked, time.time(), window)
    if since is not None:
        say(f"cookbook: pre-flight: every node passed the whole gate in job {job.id} {since / 60:.0f} min ago: "
            f"their own checks only (COOKBOOK_GATE_WINDOW_S={window:.0f})")  # fmt: skip
    return since


def gate_program(
    job: Job, out: Path, checked: list[str], gpus: int, nproc: int, endpoint: str, budget: float, local: bool
) -> list[str]:
    """The check every node runs: its own checks only (``local``), under torchrun (several processes a node),
    or one process a node."""
    args = job.args
    check = [
        "--out", str(out), f"--gpus={gpus}", f"--matmul-fraction={args.gate_matmul_fraction}",
        f"--matmul-min-tflops={args.gate_matmul_min_tflops}", f"--min-busbw={args.gate_busbw_floor}",
        f"--allreduce-mb={args.gate_allreduce_mb}", f"--min-free-gb={args.gate_min_free_gb}",
        f"--local-disk={os.environ.get('TMPDIR', '/tmp')}", f"--interface={os.environ.get('NCCL_SOCKET_IFNAME', '')}",
        f"--run-dir={job.run_dir}", f"--busbw-peer-ratio={args.gate_busbw_peer_ratio}",
        f"--timeout={decide.collective_timeout(max(15.0, args.gate_seconds / 4), len(checked) * max(nproc, 1)):g}",
    ]  # fmt: skip
    if local:
        return ["python3", "-m", "cookbook_runtime.nodecheck", "check", "--local-only", *check]
    if nproc > 1:
        return [
            "python3", "-m", "torch.distributed.run", f"--nnodes={len(checked)}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-id=preflight-{job.id}", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-conf=join_timeout={int(budget * 0.6)}", "-m", "cookbook_runtime.nodecheck", "check", *check,
        ]  # fmt: skip
    return ["python3", "-m", "cookbook_runtime.nodecheck", "check", f"--master={endpoint}", *check]


def run_gate_step(command: list[str], budget: float) -> str:
    """Run the gate's step, ended after ``budget`` seconds; why it was cut short, or ``""``."""
    step = subprocess.Popen(command)
    try:
        step.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        step.terminate()  # srun passes it on to the checks
        try:
            step.wait(timeout=10)
        except subprocess.TimeoutExpired:
            step.kill()
            step.wait()
        return f"the gate took longer than its {budget:.0f} s"
    return ""


def gate_limits(args: argparse.Namespace) -> decide.GateThresholds:
    """The verdict's thresholds: the switches, and ``COOKBOOK_FABRIC_STOP``."""
    return decide.GateThresholds(
        matmul_peer_ratio=args.gate_matmul_peer_ratio, busbw_peer_ratio=args.gate_busbw_peer_ratio,
        busbw_floor_gbps=args.gate_busbw_floor, strict=args.gate_strict,
        fabric_stop=os.environ.get(decide.FABRIC_OVERRIDE.split("=")[0]) != "0",
    )  # fmt: skip


def record_gate_pass(job: Job, checked: list[str], took: float, mode: str) -> None:
    """A line in the run's gate passes: a restart of this job soon after checks the nodes' own checks only."""
    try:
        with open(files.gate_passes(job.run_dir), "a") as f:
            f.write(f"{time.time():.0f}\t{job.id}\t{','.join(checked)}\t{took:.1f}\t{mode}\n")
    except OSError:
        pass  # the record only saves a later start time


def act_on_gate(job: Job, verdict: decide.GateVerdict, problems: str) -> int | None:
    """The verdict acted on: a blamed spare stops standing by, a blamed training node is recovered from; then
    a stop, or training on what nobody is blamed for. An exit status when the job ends here, None to train."""
    args = job.args
    if verdict.blame:
        reason = "pre-flight: " + "; ".join(dict.fromkeys(r for rs in verdict.blame.values() for r in rs))
        idle = [x for x in verdict.exclude if x in job.spares]  # a bad spare simply stops standing by
        if idle:
            job.spares = [x for x in job.spares if x not in idle]
            say(f"cookbook: recovery: spare {','.join(idle)} ({reason}) no longer stands by")
        training = [x for x in verdict.exclude if x in job.nodes]
        if training and (status := recover(job, training, reason, at_gate=True)) is not None:
            return status
    if verdict.stop and not args.gate_strict:  # a fabric that cannot serve the job: one line, nobody blamed
        say(f"cookbook: pre-flight: {problems}; not training")
        return 1
    if problems and (verdict.stop or args.gate_strict):
        say(f"cookbook: pre-flight failed across the nodes (no single node to blame): {problems}; not training "
            "(--gate-strict)")  # fmt: skip
        return 1
    if problems:
        say(f"cookbook: pre-flight: {problems}. No node is blamed for it: training anyway (the framework's own "
            "error, if any, is the truth; --gate-strict stops here instead)")  # fmt: skip
    return None


def gate(job: Job, address: str, port: int, nproc: int) -> int | None:
    """The pre-flight gate; an exit status when the job ends here, None to train."""
    from .nodecheck import judge  # noqa: PLC0415  (torch-free: the module imports torch lazily)

    args = job.args
    gpus = int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0) if args.gate_matmul_fraction else 0
    out = files.gate_dir(job.run_dir, job.id, job.restart)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    checked = [*job.nodes, *job.spares]  # a spare is checked like any node
    budget = decide.gate_budget(args.gate_seconds, len(checked))
    since = recent_pass(job, checked)
    program = gate_program(job, out, checked, gpus, nproc, f"{address}:{port}", budget, since is not None)
    started = time.time()
    timed_out = run_gate_step([*srun_prefix(args, checked), "--kill-on-bad-exit=0", *program], budget)
    verdict = judge(out, checked, 1 if since is not None else max(nproc, 1), gpus, gate_limits(args), say)
    took = time.time() - started
    say(f"cookbook: pre-flight took {took:.0f} s on {len(checked)} node(s)")
    problems = "; ".join(p for p in (timed_out, verdict.unattributed) if p)
    if not problems and not verdict.blame:
        record_gate_pass(job, checked, took, "local" if since is not None else "full")
    return act_on_gate(job, verdict, problems)


def python_environment(job: Job) -> int | None:
    """Every node's Python against ``--needs`` (:mod:`cookbook_runtime.pyenv`); an exit status when it lacks
    what the job runs (no node excluded), None to go on."""
    needs = dict(word.partition("==")[::2] for word in job.args.needs.split(",") if word)
    if not needs:
        return None
    nodes = [*job.nodes, *job.spares]
    command = [*srun_prefix(job.args, nodes), "--kill-on-bad-exit=0", "python3", "-m", "cookbook_runtime.pyenv", *needs]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=decide.gate_budget(30, len(nodes)))
        answers, said = pyenv.read_answers(done.stdout), done.stderr.strip().splitlines()
    except (subprocess.TimeoutExpired, ValueError):  # no answer, or a garbled one: not judged
        answers, said = {}, []
    verdict = decide.environment_verdict(nodes, answers, needs)
    for note in verdict.notes:
        say(f"cookbook: {note}" + (f" (srun: {said[-1]})" if said and "no answer" in note else ""))
    if verdict.stop:
        say(f"cookbook: {verdict.stop}")
        job.record(time.time(), "failed")
        return 2
    return None


def run_dir_space(job: Job) -> int | None:
    """The run folder can hold the next checkpoint: certain (the newest one there is larger than the free space)
    stops, the planner's estimate (``--checkpoint-gb``; ``COOKBOOK_CHECKPOINT_GB`` overrides, 0: no check) only
    warns; an exit status when the job ends here."""
    try:
        usage = shutil.disk_usage(job.run_dir)
        need = float(os.environ.get("COOKBOOK_CHECKPOINT_GB") or job.args.checkpoint_gb)
    except (OSError, ValueError):
        return None
    if os.environ.get("COOKBOOK_CHECKPOINT_GB", "").strip() in ("0", "0.0"):
        return None
    quota = user_quota(job.run_dir)
    if quota is not None:
        say(f"cookbook: RUN_DIR {job.run_dir}: {quota.line()}")
    checkpoints = Path(job.args.checkpoint_dir) if job.args.checkpoint_dir else None
    measured = resume.newest_checkpoint_bytes(job.args.resume, job.run_dir, checkpoints)
    problem, stop = decide.run_dir_space_problem(usage.free, usage.total, int(need * 1e9), measured, quota)
    if not problem:
        return None
    say(f"cookbook: RUN_DIR {job.run_dir}: {problem}" + ("; not training" if stop else ""))
    if stop:
        job.record(time.time(), "failed")
        return 2
    return None


def user_quota(path: Path) -> decide.Quota | None:
    """The user's quota where ``path`` is, where the site has ``lfs quota`` (Lustre) or ``quota`` (Linux quota
    tools, ``-f`` the mount point); None: no tool, no quota, or no answer in 10 s."""
    mount = path.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    user = os.environ.get("USER") or str(os.getuid())
    for tool in (["lfs", "quota", "-u", user, "-h", str(path)], ["quota", "-s", "-f", str(mount)]):
        if shutil.which(tool[0]):
            try:
                done = subprocess.run(tool, capture_output=True, text=True, timeout=10, check=False)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if quota := decide.parse_quota(done.stdout, " ".join(tool[:2])) if done.returncode == 0 else None:
                return quota
    return None


def lead_time(job: Job, refuse: bool = True) -> int | None:
    """The ``--signal`` lead, written once (``--lead-from-signal``: the script's own ``#SBATCH --signal``); one over
    half the time limit requeues for ever: one line, and the job ends."""
    args = job.args
    if args.lead_from_signal and not args.lead_seconds:
        args.lead_seconds = decide.signal_lead(slurm.batch_script(job.self_id)) or 0.0
    if not (args.requeue and (args.lead_seconds or args.save_seconds) and refuse):  # a rehearsal: a short --time
        return None
    record = slurm.job_record(job.self_id)
    limit = decide.time_limit_seconds(record.get("TimeLimit", ""))
    problem = decide.lead_problem(args.lead_seconds, limit)
    elapsed = decide.time_limit_seconds(record.get("RunTime", "")) or 0.0
    stop_in = decide.own_stop_in(args.lead_seconds, args.save_seconds, limit, elapsed) if args.lead_for_save else None
    if stop_in is not None and not problem:  # the model picked at run time saves for longer than the lead allows
        lead, args.lead_seconds = args.lead_seconds, float(decide.stop_lead_seconds(args.save_seconds))
        say(
            f"cookbook: this model's stop-save (~{args.save_seconds:.0f} s) needs a {args.lead_seconds:.0f} s lead, "
            f"the job's --signal gives {lead:.0f} s: the runtime raises the stop itself in {stop_in:.0f} s"
        )
        job.timer = threading.Timer(stop_in, os.kill, (os.getpid(), signal.SIGUSR1))
        job.timer.daemon = True
        job.timer.start()
    if not problem:
        return None
    say(f"cookbook: {problem}")
    job.record(time.time(), "failed")
    return 2


def read_hf_token() -> None:
    """HF_TOKEN from the environment or the token file, for the ranks' environment only: never in the script,
    its arguments or a log (the log says present or absent)."""
    if not os.environ.get("HF_TOKEN"):
        home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
        path = Path(os.environ.get("HF_TOKEN_PATH") or f"{home}/token")
        try:
            token = path.read_text().strip()
        except OSError:
            token = ""
        if token:
            os.environ["HF_TOKEN"] = token
    say(f"HF token: {'present' if os.environ.get('HF_TOKEN') else 'absent'}")


def launcher_words(argv: list[str]) -> int:
    """How many words of ``argv`` are the launcher itself (``torchrun``: 1, ``tune run``: 2)."""
    if argv[:2] == ["tune", "run"]:
        return 2
    if argv[:3] == ["python3", "-m", "torch.distributed.run"] or argv[:3] == ["python", "-m", "torch.distributed.run"]:
        return 3
    return 1


def launch_command(job: Job, address: str, port: int, nproc: int, extra: list[str]) -> list[str]:
    """The launch on every training node: the shielded launcher, its node/process/rendezvous flags (a new
    rendezvous id per launch: nothing of an earlier one joins), the program."""
    argv = list(job.args.launcher)
    k = launcher_words(argv)
    launcher, program = argv[:k], argv[k:]
    rdzv = job.id if not job.launches else f"{job.id}-{job.launches}"
    # each node's first rank in the job log; every rank's output in one file a node (launch.keep_rank_logs)
    flags = [
        f"--nnodes={len(job.nodes)}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
        f"--rdzv-id={rdzv}", f"--rdzv-endpoint={address}:{port}", "--role=rank", "--tee=3", "--local-ranks-filter=0",
    ]  # fmt: skip
    hook = os.environ.get("COOKBOOK_REHEARSE")
    if hook:  # cookbook rehearse: a check runs in the launcher's place with its arguments
        head = [hook, *launcher]
    elif launcher[0] in ("torchrun", "tune"):  # python3 of the nodes' PATH (a container's, if any)
        head = ["python3", "-m", "cookbook_runtime.launch", *launcher]
    else:
        head = launcher
    where = job.nodes if job.args.spare_nodes or job.launches or job.nodes != job.allocated else []
    srun = srun_prefix(job.args, where, overlap=bool(job.launches))
    return [*srun, "--kill-on-bad-exit=1", *head, *flags, *program, *extra]


def watch_signals(job: Job, stop_file: Path) -> None:
    """USR1/TERM reaching the batch step: the stop flag every rank polls (the ranks save and exit 0). The
    handler never raises: a run folder that errs (EIO, ESTALE, EDQUOT) is said, and the job goes on."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        job.signal = signal.Signals(signum).name.removeprefix("SIG")
        line = f"cookbook: got {job.signal}: every rank saves at its next step boundary"
        try:  # the flag first: a log that errs must not keep the ranks from saving
            stop_file.touch()
        except Exception as e:  # noqa: BLE001  (a signal handler that raises ends the batch step, unsaved)
            line = f"cookbook: got {job.signal} but could not raise the stop flag {stop_file}: {e}"
        try:
            say(line)
        except Exception:  # noqa: BLE001, S110  (the log itself is gone: nothing left to tell)
            pass

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, on_signal)


def hang_culprit(hang_dir: Path) -> tuple[list[str], str]:
    """After the ranks ended: the hosts a recorded hang names (none: no hang, or no verdict) and the verdict."""
    if not (hang_dir / files.HANG_TRIGGER).exists() and not any(hang_dir.glob(f"{files.TRACE_PREFIX}*")):
        return [], ""
    from . import hang  # noqa: PLC0415

    try:
        found = hang.culprit(hang_dir)
        what = hang.mask(hang.describe(found))
    except Exception as e:  # noqa: BLE001  (a verdict that cannot be made blames nobody)
        found, what = {"hosts": []}, f"hang: no verdict ({type(e).__name__}: {e})"
    say(f"cookbook: {what}; dumps in {hang_dir}")
    return list(found["hosts"]), what


class NodeWatch(threading.Thread):
    """The batch host's eye on the other training nodes while the ranks run: a node whose slurmd stops
    answering (or that Slurm calls down) twice in a row is lost; the step is then ended (srun would wait for
    a lost node for ever) so that :func:`recover` can replace it."""

    def __init__(self, job: Job, step: subprocess.Popen[bytes], every: float) -> None:
        super().__init__(daemon=True)
        self.job, self.step, self.every = job, step, every
        self.lost: list[str] = []
        self.lost_at = 0.0
        self.done = threading.Event()
        port = slurm.config_value("SlurmdPort")
        self.port = int(port) if port.isdigit() else 6818
        others = [x for x in job.nodes if x != job.batch_host]
        self.addresses = {x: slurm.node_address(x) for x in others} if every > 0 else {}
        self.probed: dict[str, str] = {}  # the nodes whose slurmd answered at the start: only these are probed

    def failing(self) -> list[str]:
        """Nodes that look lost now: down in Slurm's view, or (where slurmd answered at the start) not answering
        the batch host. Slurm's "not responding" mark (``*``) lingers after a node is back: for a node whose
        slurmd the batch host can reach, only the probe and a DOWN state count."""
        states = slurm.node_states(list(self.addresses))
        lost = set()
        for x, st in states.items():
            if decide.node_lost(st.state) and (x not in self.probed or st.state.lower().startswith(("down", "fail"))):
                lost.add(x)
        return sorted(lost | {x for x, a in self.probed.items() if not slurm.reachable(a, self.port)})

    def run(self) -> None:
        self.probed = {x: a for x, a in self.addresses.items() if slurm.reachable(a, self.port)}
        strikes: dict[str, int] = {}
        first: dict[str, float] = {}
        while self.addresses and not self.done.wait(self.every):
            now = time.time()
            failing = self.failing()
            strikes = {x: strikes.get(x, 0) + 1 for x in failing}
            first = {x: first.get(x, now) for x in failing}
            lost = [x for x, n in strikes.items() if n >= 2]
            if lost and not self.done.is_set() and self.job.signal is None:  # never cut a stop-save short
                self.lost, self.lost_at = lost, min(first[x] for x in lost)
                say(f"cookbook: lost {','.join(lost)}: its slurmd does not answer the batch host; ending the step")
                self.end_step()
                return

    def end_step(self) -> None:
        for step in slurm.job_steps(self.job.id):  # the ranks on the nodes that still answer
            slurm.kill_step(step)
        try:
            self.step.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.step.kill()  # srun waits for the lost node's tasks for ever


def node_fail(job: Job) -> int | None:
    """Nodes that failed during the previous run of this job: one in this allocation is recovered from like any
    fault (a spare, else the same job requeued without it); one Slurm already moved the run off costs nothing."""
    if job.restart == 0:
        return None
    try:
        runs = decide.parse_runs((job.state / files.RUNS).read_text())
    except OSError:
        return None
    previous = next((r for r in reversed(runs) if r.job == job.id and r.restart < job.restart), None)
    if previous is None:
        return None
    states = slurm.node_states(previous.nodes)
    failed = decide.node_fail_culprits(previous, states, job.started)
    for node in failed:
        say(f"cookbook: node failure: {node} of job {job.id}'s previous run is {states[node].state} (NODE_FAIL)")
    here = [x for x in failed if x in job.allocated]
    if failed and not here:
        say(f"cookbook: excluding {','.join(failed)} (NODE_FAIL in the previous run) by Slurm's requeue: this run "
            f"has other nodes [{job.nodelist}]")  # fmt: skip
    if not here:
        return None
    idle = [x for x in here if x in job.spares]
    job.spares = [x for x in job.spares if x not in idle]
    training = [x for x in here if x in job.nodes]
    return recover(job, training, "NODE_FAIL in the previous run", lost=True, at_gate=True) if training else None


def find_fault(
    job: Job, watch: NodeWatch, hang_dir: Path, exits: Path, srun_said: dict[str, dict[str, Any]]
) -> tuple[list[str], str, bool, float]:
    """After the ranks ended: ``(nodes at fault, why, lost, when seen)``, in order of certainty: the hang
    verdict's culprit, a node the batch host lost, a node whose ranks died of a signal first."""
    hosts, what = hang_culprit(hang_dir)
    nodes = [x for x in job.nodes if x in hosts or any(h.split(".")[0] == x for h in hosts)] or hosts
    if nodes:
        return nodes, what, False, 0.0
    if watch.lost:
        return watch.lost, "lost: its slurmd stopped answering", True, watch.lost_at
    records: dict[str, dict[str, Any]] = {}
    for f in exits.glob("*.json") if exits.is_dir() else ():
        try:
            records[f.stem] = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
    for node, said in srun_said.items():  # a launcher killed outright wrote nothing: srun saw its task die
        records.setdefault(node, said)
    crashed = decide.crashed_nodes(records, job.nodes)
    if crashed:
        sigs = sorted({str(s) for x in crashed for s in records[x].get("signals", [])})
        at = min(float(records[x].get("at", 0) or 0) for x in crashed)
        who = "launcher" if all(records[x].get("by") == "srun" for x in crashed) else "ranks"
        return crashed, f"its {who} died of {','.join(sigs)}", False, at
    return [], "", False, 0.0


def recover(
    job: Job, fault: Sequence[str], reason: str, *, lost: bool = False, at_gate: bool = False,
    fault_at: float = 0.0, ended_at: float = 0.0,
) -> int | None:  # fmt: skip
    """Act on nodes at fault (:func:`cookbook_runtime.decide.recovery`): None to launch (again) on the nodes
    the job now has, else the batch step's exit status (the job requeued, held, or ended)."""
    now = time.time()
    budget = decide.budget_left(job.incidents(), now, job.max_retries, job.args.retry_window)
    record = slurm.job_record(job.self_id)
    excluded = decide.excluded_nodes(record, fault)
    eligible = None
    if budget > 0 and (job.batch_host in fault or len(job.spares) < len(fault)):
        states = slurm.partition_states(record.get("Partition", ""), record.get("Reservation", ""))
        eligible = decide.eligible_nodes(states, excluded) if states else None
    checkpoints = Path(job.args.checkpoint_dir) if job.args.checkpoint_dir else None
    resumable = resume.newest_checkpoint(job.args.resume, job.run_dir, checkpoints) is not None  # no side effects
    what = decide.recovery(
        fault, job.spares, job.batch_host, budget=budget, lost=lost, resumable=resumable, at_gate=at_gate,
        eligible=eligible, job_nodes=len(job.allocated),
    )  # fmt: skip
    names = ",".join(fault)
    action = "train-on-gate" if what.action == "train-on" and at_gate else what.action
    job.note(decide.Incident(now, job.id, tuple(fault), reason, action, fault_at or now, ended_at, what.spares))
    left = f"{budget - 1} of {job.max_retries} recoveries left in {job.args.retry_window / 3600:g} h"
    if what.action == "spare":
        job.swap(fault, what.spares)
        say(f"cookbook: recovery: {names} ({reason}) replaced by spare {','.join(what.spares)} in job {job.id} "
            f"({left})")  # fmt: skip
        return None
    if what.action == "train-on":
        say(f"cookbook: keeping {names} ({reason}): {what.why}; training on it")
        return None
    return requeue_or_end(job, what, names, reason, excluded, left)


def requeue_or_end(job: Job, what: decide.Recovery, names: str, reason: str, excluded: Sequence[str], left: str) -> int:
    """No recovery inside this run: the same job requeued (without the nodes, or to start later by itself), else
    ended; the batch step's exit status."""
    for sig in (signal.SIGUSR1, signal.SIGTERM):  # the requeue signals this step: finish what was started
        signal.signal(sig, signal.SIG_IGN)
    if what.action == "requeue-excluding":
        ok, said = slurm.requeue_excluding(job.self_id, ",".join(excluded))
        if ok:
            say(f"cookbook: excluding {names} ({reason}): job {job.id} requeued with ExcNodeList={','.join(excluded)}, "
                f"every option kept ({what.why}; {left})")  # fmt: skip
            job.record(time.time(), "requeued")
            return 0
        say(f"cookbook: could not exclude {names} ({reason}): {said}; ending job {job.id}")
        job.record(time.time(), "failed")
        return 1
    if what.action in ("requeue", "requeue-later"):
        ok, said, verdict = requeue_later(job) if what.action == "requeue-later" else (*slurm.requeue(job.self_id), "")
        if ok:
            say(f"cookbook: not recovering in this run from {names} ({reason}): {what.why}; job {job.id} requeued "
                + (verdict or "as it is"))  # fmt: skip
            job.record(time.time(), "requeued")
            return 0
        say(f"cookbook: could not requeue job {job.id} after {names} ({reason}): {said}; ending it")
        job.record(time.time(), "failed")
        return 1
    say(f"cookbook: not recovering from {names} ({reason}): {what.why}; ending job {job.id}")
    job.record(time.time(), "failed")
    return 1


def requeue_later(job: Job) -> tuple[bool, str, str]:
    """The same job requeued to start by itself once the recovery budget allows one again (never held for a
    human): ``(accepted, Slurm's refusal, when it starts and how to start or cancel it)``."""
    args = job.args
    delay = max(60, int(decide.budget_back_in(job.incidents(), time.time(), job.max_retries, args.retry_window)))
    ok, said = slurm.requeue_updated(job.self_id, f"StartTime=now+{delay}")
    at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(time.time() + delay))
    how = f"`scontrol update JobId={job.self_id} StartTime=now` starts it now, `scancel {job.self_id}` cancels it"
    return ok, said, f"to start again by itself at {at} (in {delay / 60:.0f} min, once a recovery is allowed): {how}"


def set_launch_env(job: Job, hang_dir: Path, exits: Path, telemetry: Path, save_seconds: float, suffix: str) -> None:
    """What the launchers and the ranks read from the environment (hang dumps, exits, telemetry, rank output,
    stop times)."""
    env = os.environ
    env[files.HANG_DIR_ENV] = str(hang_dir)
    logs = files.rank_logs_dir(job.run_dir, job.id, job.restart)
    env[files.RANK_LOGS_ENV] = str(logs.with_name(logs.name + suffix))
    env[files.EXITS_DIR_ENV] = str(exits)
    every = env.setdefault(files.TELEMETRY_S_ENV, "10")  # the nodes' GPU/NIC sampler (launch), 0: none
    env[files.TELEMETRY_DIR_ENV] = str(telemetry)
    if every.strip() not in ("0", "") and not job.launches:
        say(f"cookbook: node telemetry every {every} s in {telemetry}")
    env.setdefault("COOKBOOK_HANG_MIN_S", f"{decide.hang_min_seconds(save_seconds):.0f}")
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the last 2000 collectives per rank
    env["TORCH_FR_DUMP_TEMP_FILE"] = f"{hang_dir}/{files.TRACE_PREFIX}"  # + the rank
    env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", env["TORCH_FR_BUFFER_SIZE"])  # ProcessGroupNCCL's spellings
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = env["TORCH_FR_DUMP_TEMP_FILE"]
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:"  # the global rank; torchrun fills it in


def launch(job: Job, address: str, port: int, nproc: int) -> tuple[int, list[str], str, bool, float]:
    """One launch of the ranks on the training nodes, watched: ``(srun's status, nodes at fault, why, lost,
    when the fault was seen)``."""
    extra, lines = job.resume_args()
    for line in lines:
        say(line)
    suffix = f".{job.launches}" if job.launches else ""
    hang_dir = files.hang_dir(job.run_dir, job.id, job.restart)
    hang_dir = hang_dir.with_name(hang_dir.name + suffix)
    hang_dir.mkdir(parents=True, exist_ok=True)  # torch's own dump on an NCCL timeout makes no folder
    telemetry = files.telemetry_dir(job.run_dir, job.id, job.restart)
    exits = files.exits_dir(job.run_dir, job.id, job.restart, job.launches)
    set_launch_env(job, hang_dir, exits, telemetry.with_name(telemetry.name + suffix), job.args.save_seconds, suffix)
    command = launch_command(job, address, port, nproc, extra)
    say(f"cookbook: launching {shlex.join(job.args.launcher[: launcher_words(job.args.launcher)])} on "
        f"{len(job.nodes)} node(s), {nproc} process(es) each")  # fmt: skip
    log, start = own_log()
    ranks = subprocess.Popen(command)  # srun writes to the job log itself: its lines keep their order
    every = 0.0 if os.environ.get("COOKBOOK_REHEARSE") else job.args.node_watch_seconds
    watch = NodeWatch(job, ranks, every if len(job.nodes) > 1 else 0.0)
    watch.start()
    status = ranks.wait()  # PEP 475: a signal handled meanwhile does not interrupt the wait
    watch.done.set()
    job.launches += 1
    if status < 0:  # srun ended by a signal: the shell's 128 + N, as Slurm and sacct report it
        status = 128 - status
    if os.environ.get("COOKBOOK_REHEARSE") or job.signal:  # a stop asked for is no node's fault
        return status, [], "", False, 0.0
    watch.join(timeout=15)
    return (status, *find_fault(job, watch, hang_dir, exits, srun_killed(log, start)))


SRUN_TAIL_BYTES = 8 << 20  # how much of the log's end srun_killed reads


def own_log() -> tuple[Path | None, int]:
    """The file this batch step's stderr is (the job log Slurm opened, where srun writes its own lines too) and
    its size now; ``(None, 0)`` when stderr is no regular file."""
    try:
        path = Path(os.readlink("/proc/self/fd/2"))
        return (path, path.stat().st_size) if path.is_file() else (None, 0)
    except OSError:
        return None, 0


def srun_killed(log: Path | None, start: int) -> dict[str, dict[str, Any]]:
    """Each node whose task srun saw end by a signal before it tore the step down (``srun: error: n2: task 1:
    Killed``: a launcher killed outright, which leaves no exits record), from what the step added to the log;
    first by construction (the teardown ended the others), so its ``at`` is 0."""
    found: dict[str, dict[str, Any]] = {}
    if log is None:
        return found
    try:
        with open(log, "rb") as f:
            f.seek(max(start, f.seek(0, os.SEEK_END) - SRUN_TAIL_BYTES))  # srun's last words, not a long run's log
            text = f.read().decode(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        if decide.SRUN_TEARDOWN.match(line):
            break
        if task := decide.srun_task_signal(line):
            found.setdefault(task[0], {"signals": [task[1]], "at": 0.0, "by": "srun"})
    return found


def train(job: Job, address: str, port: int, nproc: int) -> tuple[int, bool]:
    """Launch the ranks; after a fault, recover inside the allocation and launch again. ``(status, ended)``:
    ``ended`` when a recovery already decided the batch step's end (``status`` is then its exit status)."""
    while True:
        status, fault, why, lost, seen = launch(job, address, port, nproc)
        if not fault or status == 0:
            return status, False
        ended = time.time()
        end = recover(job, fault, why, lost=lost, fault_at=seen or ended, ended_at=ended)
        if end is not None:
            return end, True
        port = free_port(address, port)
        say(f"cookbook: relaunching on {','.join(job.nodes)} from the newest checkpoint "
            f"({time.time() - (seen or ended):.0f} s after the fault)")  # fmt: skip
        say_start(job, address, port)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The switches, and the launcher after ``--`` (argparse's own error without one)."""
    args = build_parser().parse_args(argv)
    if args.launcher[:1] == ["--"]:
        args.launcher = args.launcher[1:]
    if not args.launcher:
        build_parser().error("no launcher: end the switches with -- torchrun ... or -- tune run ...")
    return args


def arm_stop(job: Job) -> Path:
    """A fresh stop flag for the ranks to poll (with ``--requeue``, USR1/TERM set it from now on); the file a
    stop-save leaves beside it."""
    stop_file = job.state / files.STOP
    saved_file = Path(f"{stop_file}{files.SAVED_SUFFIX}")
    for stale in (stop_file, saved_file):
        stale.unlink(missing_ok=True)
    os.environ[files.STOP_FILE_ENV] = str(stop_file)
    # from here on a stop is kept (through the checks, the gate): the ranks save at their first step
    if job.args.requeue:
        watch_signals(job, stop_file)
    return saved_file


def python_first_on_path(args: argparse.Namespace) -> None:
    """This interpreter's folder first on ``PATH`` (outside a container): the nodes' python3 and launchers."""
    here = os.path.dirname(sys.executable)  # VENV's python3 (the script's exec line): the nodes' python3 and launchers
    if here and not any("--container-image" in a for a in args.srun_arg):  # a container has its own
        rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != here]
        os.environ["PATH"] = os.pathsep.join([here, *rest])


def warn_kill_wait(args: argparse.Namespace) -> None:
    """Say so when the stop-save would outlast Slurm's KillWait (or the partition's preemption grace)."""
    if args.requeue and args.save_seconds:
        env = os.environ
        grace = slurm.preemption_grace(env.get("SLURM_JOB_PARTITION", ""), env.get("SLURM_JOB_QOS", ""))
        problem = decide.kill_wait_problem(args.save_seconds, slurm.config_seconds("KillWait"), grace)
        if problem:
            say(f"cookbook: {problem}")


def pre_flight(job: Job, address: str, port: int, nproc: int, rehearsal: bool) -> int | None:
    """The lead time, then (unless ``COOKBOOK_PREFLIGHT=0`` or a rehearsal) the nodes' Python, the run folder's
    space and the gate; an exit status when the job ends here, None to train."""
    if (status := lead_time(job, refuse=not rehearsal)) is not None:
        return status
    if os.environ.get("COOKBOOK_PREFLIGHT", "1") != "0" and not rehearsal:
        for check in (python_environment, run_dir_space):
            if (status := check(job)) is not None:
                return status
        if job.args.gate and (status := gate(job, address, port, nproc)) is not None:
            return status
        if job.nodes != job.allocated[: len(job.nodes)]:  # a spare took a blamed node's place
            say_start(job, address, port)
    return None


def after_training(job: Job, status: int, saved_file: Path, complete: Path, once: bool) -> int:
    """After the ranks' exit: the run's record, the requeue a stop-save asks for, or the mark of a run trained
    to its end; the batch step's exit status."""
    args = job.args
    if job.timer is not None:
        job.timer.cancel()
    saved = saved_file.exists()
    what = decide.after_exit(job.signal, status, saved)
    requeue = what.action == "requeue" and args.requeue
    for sig in (signal.SIGUSR1, signal.SIGTERM):  # Slurm's signals are its own; a requeue's ends this step: said first
        signal.signal(sig, signal.SIG_IGN if requeue else signal.SIG_DFL)
    job.record(time.time(), decide.outcome(job.signal, status, saved))
    ok, said = slurm.requeue(job.self_id) if requeue else (True, "")
    if requeue:
        say(f"cookbook: scontrol requeue {job.self_id} " + ("accepted" if ok else f"refused: {said}; the job ends"))
    if what.action == "requeue" and not args.requeue:
        say(f"cookbook: the ranks stopped (status {status}); not requeueing: the job has no --requeue")
    elif what.say and ok:  # "requeueing job N" only once Slurm took the requeue
        detail = saved_file.read_text().strip() if saved else ""
        say("cookbook: " + what.say.format(job=job.id, status=status, saved=detail))
    if not requeue and status == 0 and once and not saved and job.signal != "TERM":  # trained to its end
        complete.write_text(f"job {job.id} finished it at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    return status


def main(argv: list[str] | None = None) -> int:
    """The batch step, in the order of the module's docstring; its exit status."""
    args = parse_args(argv)
    job = Job(args)
    saved_file = arm_stop(job)
    rehearsal = bool(os.environ.get("COOKBOOK_REHEARSE"))
    python_first_on_path(args)
    once = args.once and not rehearsal
    complete = job.state / files.COMPLETE
    if once and complete.exists():
        say(
            f"cookbook: the run in {job.run_dir} is complete ({complete.read_text().strip()}): nothing to do. "
            f"To train it again, remove {complete} (or use another RUN_DIR)"
        )
        return 0
    read_hf_token()
    if (status := node_fail(job)) is not None:
        return status
    job.record()
    address, port = rendezvous(job)
    say_start(job, address, port)
    nproc = args.nproc_per_node or int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0) or 1
    warn_kill_wait(args)
    if (status := pre_flight(job, address, port, nproc, rehearsal)) is not None:
        return status
    env = os.environ
    env[files.LEAD_ENV], env[files.SAVE_ENV] = f"{args.lead_seconds:g}", f"{args.save_seconds:g}"
    if job.signal == "TERM":  # cancelled, preempted or out of time before a step: nothing to save
        say("cookbook: got TERM before the launch: not training")
        job.record(time.time(), "TERM")
        return 128 + signal.SIGTERM
    status, ended = train(job, address, port, nproc)
    return status if ended else after_training(job, status, saved_file, complete, once)


if __name__ == "__main__":
    sys.exit(main())
