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
7. after the ranks exit: a hang recorded -> the node at fault excluded; a stop-save -> requeue
   (:data:`cookbook_runtime.decide.AFTER_EXIT`).

Exclusions run the job again without the nodes, at most ``--max-retries`` times per job
(``COOKBOOK_MAX_RETRIES`` overrides): ``scontrol update ExcNodeList`` while Slurm allows it, else a
resubmission with every option of the original job. ``COOKBOOK_PREFLIGHT=0`` skips the gate;
``COOKBOOK_REHEARSE`` (``cookbook rehearse``) runs a check in the launcher's place. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

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
    a("--save-seconds", type=float, default=0.0, help="the model's stop-save time (hang floor, KillWait check)")
    a("--max-retries", type=int, default=2, help="node exclusions per job (COOKBOOK_MAX_RETRIES overrides)")
    a("--script", default="", help="the job's script, \"$0\" (an array task's own): what excluding a node resubmits")
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
    """This batch step: Slurm's view of the job and the run folder's state."""

    def __init__(self, args: argparse.Namespace) -> None:
        env = os.environ
        self.args = args
        self.id = env.get("SLURM_JOB_ID", "0")
        self.self_id = slurm.self_id()
        self.restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        self.nodelist = env.get("SLURM_JOB_NODELIST", socket.gethostname())
        self.nodes = slurm.hostnames(self.nodelist)
        self.run_dir = Path(env.get("RUN_DIR") or os.getcwd())
        self.state = files.state_dir(self.run_dir)
        self.state.mkdir(parents=True, exist_ok=True)
        self.first_job = env.get("COOKBOOK_FIRST_JOB") or self.id
        env["COOKBOOK_FIRST_JOB"] = self.first_job  # resubmissions share the first job's ledger
        retries = env.get("COOKBOOK_MAX_RETRIES", "")
        self.max_retries = int(retries) if retries.isdigit() else args.max_retries
        self.started = time.time()
        self.signal: str | None = None

    # ------------------------------------------------------------ the records
    def record(self, end: float | None = None, how: str = "") -> None:
        with open(self.state / files.RUNS, "a") as f:
            stamp = f"{end:.0f}" if end is not None else ""
            f.write(f"{self.id}\t{self.restart}\t{','.join(self.nodes)}\t{self.started:.0f}\t{stamp}\t{how}\n")

    def ledger_rows(self) -> list[str]:
        try:
            return files.ledger(self.run_dir, self.first_job).read_text().splitlines()
        except OSError:
            return []

    def spend_retry(self, nodes: str, reason: str) -> None:
        with open(files.ledger(self.run_dir, self.first_job), "a") as f:
            f.write(f"{self.id}\t{nodes}\t{reason}\n")

    # ------------------------------------------------------------ exclusion
    def exclude_and_retry(self, nodes: list[str], reason: str) -> int:
        """Run the job again without ``nodes``; end this run. Returns the exit status."""
        names = ",".join(nodes)
        rows = self.ledger_rows()
        if decide.retries_left(rows, self.max_retries) <= 0:
            say(
                f"cookbook: not excluding {names} ({reason}): the retry budget is spent ({len(rows)} of "
                f"COOKBOOK_MAX_RETRIES={self.max_retries}); ending job {self.id}"
            )
            self.record(time.time(), "failed")
            return 1
        self.spend_retry(names, reason)
        used = len(rows) + 1
        record = slurm.job_record(self.id)
        excluded = [x for x in record.get("ExcNodeList", "").split(",") if x and x != "(null)"] + nodes
        self.record(time.time(), "excluded")
        if slurm.update_excluded(self.self_id, ",".join(excluded)):
            say(
                f"cookbook: excluding {names} ({reason}) by scontrol update ExcNodeList={','.join(excluded)}; "
                f"requeueing job {self.id} (retry {used} of {self.max_retries})"
            )
            slurm.requeue(self.self_id)
            return 0
        array_task = bool(os.environ.get("SLURM_ARRAY_TASK_ID"))
        own = self.args.script or os.environ.get("COOKBOOK_SCRIPT", "")
        script = decide.resubmit_script(record, own, array_task, Path(record.get("Command", "-")).is_file())
        args = decide.resubmit_args(record, nodes)
        cwd = os.environ.get("SLURM_SUBMIT_DIR", ".")
        ok, said = slurm.submit(args, script, cwd, slurm.clean_env(dict(os.environ)))
        if ok:
            exclude = next(a for a in args if a.startswith("--exclude="))
            say(
                f"cookbook: excluding {names} ({reason}) by resubmission with {exclude} (scontrol update "
                f"ExcNodeList is refused for a running job): job {said} (retry {used} of {self.max_retries}); "
                f"ending job {self.id}"
            )
        else:
            say(
                f"cookbook: could not exclude {names} ({reason}): scontrol update ExcNodeList refused and sbatch "
                f"--exclude failed: {said}; ending job {self.id}"
            )
        return 1

    # ------------------------------------------------------------ NODE_FAIL
    def node_fail(self) -> int | None:
        """Nodes that failed during the previous run of this job: excluded (an exit status) or, when Slurm
        already gave this run other nodes, one retry spent. None: nothing to do."""
        if self.restart == 0:
            return None
        try:
            runs = decide.parse_runs((self.state / files.RUNS).read_text())
        except OSError:
            return None
        previous = next((r for r in reversed(runs) if r.job == self.id and r.restart < self.restart), None)
        if previous is None:
            return None
        states = slurm.node_states(previous.nodes)
        failed = decide.node_fail_culprits(previous, states, self.started)
        if not failed:
            return None
        for node in failed:
            say(f"cookbook: node failure: {node} of job {self.id}'s previous run is {states[node].state} (NODE_FAIL)")
        if set(failed) & set(self.nodes):
            return self.exclude_and_retry(failed, "NODE_FAIL in the previous run")
        rows = self.ledger_rows()
        names = ",".join(failed)
        if decide.retries_left(rows, self.max_retries) <= 0:
            say(
                f"cookbook: not retrying after NODE_FAIL on {names}: the retry budget is spent "
                f"(COOKBOOK_MAX_RETRIES={self.max_retries}); ending job {self.id}"
            )
            return 1
        self.spend_retry(names, "NODE_FAIL")
        say(
            f"cookbook: excluding {names} (NODE_FAIL in the previous run) by Slurm's requeue: this run has other "
            f"nodes [{self.nodelist}] (retry {len(rows) + 1} of {self.max_retries})"
        )
        return None


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


def port_taken(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


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
    port = decide.rendezvous_port(args.port, job_id, not args.port_span, args.port_span or 1)
    for _ in range(8):
        if not port_taken(address, port):
            break
        say(f"cookbook: rendezvous port {port} is taken on {address}; trying {port + 1}")
        port += 1
    say(f"job {job.id}: {len(job.nodes)} node(s) [{job.nodelist}], rendezvous {address}:{port}, run dir {job.run_dir}")
    return address, port


def srun_prefix(args: argparse.Namespace) -> list[str]:
    """One task per node with every CPU the job has there (srun of Slurm 22.05-23.02 does not inherit
    ``--cpus-per-task``), log lines tagged with the node index."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE", "1")
    return ["srun", "--ntasks-per-node=1", "--label", f"--cpus-per-task={cpus}", *args.srun_arg]


def gate(job: Job, address: str, port: int, nproc: int) -> int | None:
    """The pre-flight gate; an exit status when the job ends here, None to train."""
    from .nodecheck import judge  # noqa: PLC0415  (torch-free: the module imports torch lazily)

    args = job.args
    gpus = int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0) if args.gate_matmul_fraction else 0
    out = files.gate_dir(job.run_dir, job.id, job.restart)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    budget = decide.gate_budget(args.gate_seconds, len(job.nodes))
    check = [
        "--out", str(out), f"--gpus={gpus}", f"--matmul-fraction={args.gate_matmul_fraction}",
        f"--matmul-min-tflops={args.gate_matmul_min_tflops}", f"--min-busbw={args.gate_busbw_floor}",
        f"--allreduce-mb={args.gate_allreduce_mb}", f"--min-free-gb={args.gate_min_free_gb}",
        f"--local-disk={os.environ.get('TMPDIR', '/tmp')}", f"--interface={os.environ.get('NCCL_SOCKET_IFNAME', '')}",
        f"--run-dir={job.run_dir}", f"--timeout={max(30.0, args.gate_seconds / 2):g}",
    ]  # fmt: skip
    if nproc > 1:
        program = [
            "python3", "-m", "torch.distributed.run", f"--nnodes={len(job.nodes)}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-id=preflight-{job.id}", f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-conf=join_timeout={int(budget * 0.6)}", "-m", "cookbook_runtime.nodecheck", "check", *check,
        ]  # fmt: skip
    else:
        program = ["python3", "-m", "cookbook_runtime.nodecheck", "check", f"--master={address}:{port}", *check]
    started = time.time()
    timed_out = ""
    step = subprocess.Popen([*srun_prefix(args), "--kill-on-bad-exit=0", *program])
    try:
        step.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        timed_out = f"the gate took longer than its {budget:.0f} s"
        step.terminate()  # srun passes it on to the checks
        try:
            step.wait(timeout=10)
        except subprocess.TimeoutExpired:
            step.kill()
            step.wait()
    limits = decide.GateThresholds(
        matmul_peer_ratio=args.gate_matmul_peer_ratio, busbw_peer_ratio=args.gate_busbw_peer_ratio,
        busbw_floor_gbps=args.gate_busbw_floor, strict=args.gate_strict,
    )  # fmt: skip
    verdict = judge(out, job.nodes, max(nproc, 1), gpus, limits, say)
    say(f"cookbook: pre-flight took {time.time() - started:.0f} s on {len(job.nodes)} node(s)")
    problems = "; ".join(p for p in (timed_out, verdict.unattributed) if p)
    if verdict.blame:
        reason = "pre-flight: " + "; ".join(dict.fromkeys(r for rs in verdict.blame.values() for r in rs))
        return job.exclude_and_retry(verdict.exclude, reason)
    if problems and (verdict.stop or args.gate_strict):
        say(f"cookbook: pre-flight failed across the nodes (no single node to blame): {problems}; not training "
            "(--gate-strict)")  # fmt: skip
        return 1
    if problems:
        say(f"cookbook: pre-flight: {problems}. No node is blamed for it: training anyway (the framework's own "
            "error, if any, is the truth; --gate-strict stops here instead)")  # fmt: skip
    return None


def python_environment(job: Job) -> int | None:
    """Every node's Python against ``--needs`` (:mod:`cookbook_runtime.pyenv`); an exit status when it lacks
    what the job runs (no node excluded), None to go on."""
    needs = dict(word.partition("==")[::2] for word in job.args.needs.split(",") if word)
    if not needs:
        return None
    command = [*srun_prefix(job.args), "--kill-on-bad-exit=0", "python3", "-m", "cookbook_runtime.pyenv", *needs]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=decide.gate_budget(30, len(job.nodes)))
        answers, said = pyenv.read_answers(done.stdout), done.stderr.strip().splitlines()
    except (subprocess.TimeoutExpired, ValueError):  # no answer, or a garbled one: not judged
        answers, said = {}, []
    verdict = decide.environment_verdict(job.nodes, answers, needs)
    for note in verdict.notes:
        say(f"cookbook: {note}" + (f" (srun: {said[-1]})" if said and "no answer" in note else ""))
    if verdict.stop:
        say(f"cookbook: {verdict.stop}")
        job.record(time.time(), "failed")
        return 2
    return None


def run_dir_space(job: Job) -> int | None:
    """The run folder can hold one checkpoint (``--checkpoint-gb``, the planner's size; ``COOKBOOK_CHECKPOINT_GB``
    overrides it, 0: no check); else an exit status."""
    try:
        usage = shutil.disk_usage(job.run_dir)
        need = float(os.environ.get("COOKBOOK_CHECKPOINT_GB") or job.args.checkpoint_gb)
    except (OSError, ValueError):
        return None
    problem = decide.run_dir_space_problem(usage.free, usage.total, int(need * 1e9))
    if not problem:
        return None
    say(f"cookbook: RUN_DIR {job.run_dir}: {problem}; not training")
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
    """The launch on every node: the shielded launcher, its node/process/rendezvous flags, the program."""
    argv = list(job.args.launcher)
    k = launcher_words(argv)
    launcher, program = argv[:k], argv[k:]
    # every rank's output in its own file (--log-dir); each node's first rank's in the job log too
    flags = [
        f"--nnodes={len(job.nodes)}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
        f"--rdzv-id={job.id}", f"--rdzv-endpoint={address}:{port}",
        "--role=rank", "--tee=3", "--local-ranks-filter=0", f"--log-dir={job.run_dir}/torchrun-logs",
    ]  # fmt: skip
    hook = os.environ.get("COOKBOOK_REHEARSE")
    if hook:  # cookbook rehearse: a check runs in the launcher's place with its arguments
        head = [hook, *launcher]
    elif launcher[0] in ("torchrun", "tune"):  # python3 of the nodes' PATH (a container's, if any)
        head = ["python3", "-m", "cookbook_runtime.launch", *launcher]
    else:
        head = launcher
    return [*srun_prefix(job.args), "--kill-on-bad-exit=1", *head, *flags, *program, *extra]


def watch_signals(job: Job, stop_file: Path) -> None:
    """USR1/TERM reaching the batch step: the stop flag every rank polls (the ranks save and exit 0)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        job.signal = signal.Signals(signum).name.removeprefix("SIG")
        say(f"cookbook: got {job.signal}: every rank saves at its next step boundary")
        stop_file.touch()

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, on_signal)


def hang_check(job: Job, hang_dir: Path) -> int | None:
    """After the ranks ended: a hang recorded -> name the node at fault and retry without it."""
    if not (hang_dir / files.HANG_TRIGGER).exists() and not any(hang_dir.glob(f"{files.TRACE_PREFIX}*")):
        return None
    from . import hang  # noqa: PLC0415

    try:
        found = hang.culprit(hang_dir)
        what = hang.mask(hang.describe(found))
    except Exception as e:  # noqa: BLE001  (a verdict that cannot be made blames nobody)
        found, what = {"hosts": []}, f"hang: no verdict ({type(e).__name__}: {e})"
    say(f"cookbook: {what}; dumps in {hang_dir}")
    if found["hosts"]:
        return job.exclude_and_retry(list(found["hosts"]), what)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.launcher[:1] == ["--"]:
        args.launcher = args.launcher[1:]
    if not args.launcher:
        build_parser().error("no launcher: end the switches with -- torchrun ... or -- tune run ...")
    job = Job(args)
    stop_file = job.state / files.STOP
    saved_file = Path(f"{stop_file}{files.SAVED_SUFFIX}")
    for stale in (stop_file, saved_file):
        stale.unlink(missing_ok=True)
    os.environ[files.STOP_FILE_ENV] = str(stop_file)
    if args.requeue:  # from here on a stop is kept (through the checks, the gate): the ranks save at their first step
        watch_signals(job, stop_file)
    rehearsal = bool(os.environ.get("COOKBOOK_REHEARSE"))
    here = os.path.dirname(sys.executable)  # VENV's python3 (the script's exec line): the nodes' python3 and launchers
    if here and not any("--container-image" in a for a in args.srun_arg):  # a container has its own
        rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != here]
        os.environ["PATH"] = os.pathsep.join([here, *rest])
    once = args.once and not rehearsal
    complete = job.state / files.COMPLETE
    if once and complete.exists():
        say(
            f"cookbook: the run in {job.run_dir} is complete ({complete.read_text().strip()}): nothing to do. "
            f"To train it again, remove {complete} (or use another RUN_DIR)"
        )
        return 0
    read_hf_token()
    if (status := job.node_fail()) is not None:
        return status
    job.record()
    address, port = rendezvous(job)
    nproc = args.nproc_per_node or int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0) or 1
    if args.requeue and args.save_seconds:
        partition = os.environ.get("SLURM_JOB_PARTITION", "")
        problem = decide.kill_wait_problem(
            args.save_seconds, slurm.config_seconds("KillWait"), slurm.partition_grace(partition)
        )
        if problem:
            say(f"cookbook: {problem}")
    if os.environ.get("COOKBOOK_PREFLIGHT", "1") != "0" and not rehearsal:
        for check in (python_environment, run_dir_space):
            if (status := check(job)) is not None:
                return status
        if args.gate and (status := gate(job, address, port, nproc)) is not None:
            return status
    checkpoint_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    extra, lines = resume.resume(
        args.resume, job.run_dir, checkpoint_dir=checkpoint_dir, adapter=args.resume_adapter,
        filename_format=args.resume_filename_format, job=job.id,
    )  # fmt: skip
    for line in lines:
        say(line)
    hang_dir = files.hang_dir(job.run_dir, job.id, job.restart)
    hang_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ
    env[files.HANG_DIR_ENV] = str(hang_dir)
    every = env.setdefault(files.TELEMETRY_S_ENV, "10")  # the nodes' GPU/NIC sampler (launch), 0: none
    env[files.TELEMETRY_DIR_ENV] = samples = str(files.telemetry_dir(job.run_dir, job.id, job.restart))
    if every.strip() not in ("0", ""):
        say(f"cookbook: node telemetry every {every} s in {samples}")
    env.setdefault("COOKBOOK_HANG_MIN_S", f"{decide.hang_min_seconds(args.save_seconds):.0f}")
    env[files.LEAD_ENV], env[files.SAVE_ENV] = f"{args.lead_seconds:g}", f"{args.save_seconds:g}"
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the last 2000 collectives per rank
    env["TORCH_FR_DUMP_TEMP_FILE"] = f"{hang_dir}/{files.TRACE_PREFIX}"  # + the rank
    env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", env["TORCH_FR_BUFFER_SIZE"])  # ProcessGroupNCCL's spellings
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = env["TORCH_FR_DUMP_TEMP_FILE"]
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:"  # the global rank; torchrun fills it in
    if job.signal == "TERM":  # cancelled, preempted or out of time before a step: nothing to save
        say("cookbook: got TERM before the launch: not training")
        job.record(time.time(), "TERM")
        return 128 + signal.SIGTERM
    command = launch_command(job, address, port, nproc, extra)
    say(f"cookbook: launching {shlex.join(args.launcher[: launcher_words(args.launcher)])} on {len(job.nodes)} "
        f"node(s), {nproc} process(es) each")  # fmt: skip
    ranks = subprocess.Popen(command)
    while True:
        try:
            status = ranks.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
    if status < 0:  # srun ended by a signal: the shell's 128 + N, as Slurm and sacct report it
        status = 128 - status
    if (excluded := hang_check(job, hang_dir)) is not None:
        return excluded
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)  # from here on Slurm's signals are its own (a requeue ends this step)
    saved = saved_file.exists()
    what = decide.after_exit(job.signal, status, saved)
    job.record(time.time(), decide.outcome(job.signal, status, saved))
    if what.action == "requeue" and not args.requeue:
        say(f"cookbook: the ranks stopped (status {status}); not requeueing: the job has no --requeue")
    elif what.say:
        detail = saved_file.read_text().strip() if saved else ""
        say("cookbook: " + what.say.format(job=job.id, status=status, saved=detail))
    if what.action == "requeue" and args.requeue:
        slurm.requeue(job.self_id)
    elif status == 0 and once and not saved and job.signal != "TERM":  # trained to its end
        complete.write_text(f"job {job.id} finished it at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
