"""The batch step (``cookbook_runtime.run``) as unit tests drive it, without Slurm.

- :func:`runtime_argv` / :func:`runtime_args`: the switches a rendered script's last line hands the runtime, as
  bash expands them (quoting included) and as the runtime's own parser reads them;
- :func:`job_view`: what ``run.rendezvous`` and ``run.launch_command`` read of a ``run.Job``;
  :func:`unset_env`: variables the runtime writes into ``os.environ``, unset for one test and restored after it;
- :class:`FakeSlurm`: stand-ins for ``srun``, ``scontrol``, ``sinfo``, ``squeue``, ``scancel`` and ``sbatch`` (which
  the runtime must never call) first on ``PATH`` (and a
  ``python3`` that is this interpreter), each recording what it was asked in ``calls.jsonl``, so the real
  runtime -- or a whole rendered script -- runs in a test. ``srun`` plays the nodes' Python check (this
  interpreter's answer on every node; ``FAKE_NO_TORCH=n2``: n2's lacks the packages), the gate (it writes no
  report: the gate logs that and the job trains) and the ranks, as ``FAKE_SRUN`` says: ``ok``, ``exit:N``,
  ``save`` (rank 0's stop-save), ``signal:USR1``/``signal:TERM`` (Slurm signals the batch step; the ranks see
  the stop flag and save), ``hang`` (rank 1 on n2 stalls: the hang watch's trigger and dumps), ``crash:NODE``
  (NODE's ranks die of SIGKILL at the first launch, as its launcher records it; later launches train),
  ``launcher-killed:NODE`` (NODE's launcher itself SIGKILLed at the first launch: no record, srun's lines),
  ``nodes`` (the launch line run here for real, once per node side by side, ``SLURMD_NODENAME`` the node's name:
  the real launcher, torchrun and ranks; ``FAKE_NODE_PREFIX``: tab-separated words before each node's command, a
  timer); ``FAKE_GATE=ok``: every node's gate check reports a pass (``FAKE_GATE_FAIL=n2``: n2's own
  check fails), ``real``: the real gate, run as ``nodes`` runs the launch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from cookbook_runtime import run

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_ROOT = ROOT / "slurm-recipes"  # holds cookbook_runtime/
EXEC = "exec python3 -m cookbook_runtime.run"  # the script's last line


def committed_scripts() -> dict[str, str]:
    """Every committed ``slurm-recipes/*/*.sbatch`` as ``{"fsdp/fsdp.nebius.sbatch": text}``: what a user copies.
    ``test_render.test_slurm_recipes_match_the_generator`` holds them equal to the generator's, both ways; read from
    disk, they cost collection nothing (rendering all 144 jobs took ~14 s of every worker's start)."""
    return {p.relative_to(RUNTIME_ROOT).as_posix(): p.read_text() for p in sorted(RUNTIME_ROOT.glob("*/*.sbatch"))}


_STANDIN = r"""#!{python}
import json, os, signal, sys, time
from pathlib import Path

name, args = Path(sys.argv[0]).name, sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps({{"cmd": name, "argv": args, "env": dict(os.environ)}}) + "\n")
if name == "scontrol":
    if args[:2] == ["show", "config"] and "FAKE_SIGNAL_AT_CONFIG" in os.environ:  # before the gate and the launch
        os.kill(os.getppid(), getattr(signal, "SIG" + os.environ["FAKE_SIGNAL_AT_CONFIG"]))
    if args[:2] == ["show", "hostnames"]:
        print("\n".join(args[2].split(",")))
    elif args[:3] == ["-o", "show", "job"]:
        print(os.environ.get("FAKE_JOB_RECORD", f"JobId={{args[3]}} ExcNodeList=(null)"))
    elif args[:1] == ["update"]:
        sys.exit(int(os.environ.get("FAKE_UPDATE_STATUS", "0")))
    elif args[:2] == ["write", "batch_script"]:
        print(os.environ.get("FAKE_BATCH_SCRIPT", ""))
    elif args[:1] == ["requeue"]:
        sys.exit(int(os.environ.get("FAKE_SCONTROL_STATUS", "0")))
    sys.exit(0)
if name == "sinfo":
    print(os.environ.get("FAKE_SINFO", ""))
    sys.exit(0)
if name == "sbatch":
    print("99;cluster")
    sys.exit(0)
if name in ("squeue", "scancel"):
    sys.exit(0)
if "cookbook_runtime.pyenv" in args:  # each node's Python: this one's (FAKE_NO_TORCH: nodes that lack it all)
    from cookbook_runtime import pyenv
    packages = args[args.index("cookbook_runtime.pyenv") + 1 :]
    for k, node in enumerate(os.environ["SLURM_JOB_NODELIST"].split(",")):
        os.environ["SLURMD_NODENAME"] = node
        answer = pyenv.probe(packages)
        if node in os.environ.get("FAKE_NO_TORCH", "").split(","):
            answer["versions"] = {{p: None for p in packages}}
        print(f"{{k}}: {{pyenv.TAG}} {{json.dumps(answer)}}")
    sys.exit(0)
if "cookbook_runtime.nodecheck" in args:  # the gate: no report (FAKE_GATE=ok: every node passes)
    if os.environ.get("FAKE_GATE") == "ok":
        out = Path(args[args.index("--out") + 1])
        listed = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")]
        for node in (listed[0] if listed else os.environ["SLURM_JOB_NODELIST"]).split(","):
            failures = ["GPU 0: uncorrectable ECC errors"] if node in os.environ.get("FAKE_GATE_FAIL", "") else []
            report = {{"node": node, "local_rank": 0, "failures": failures, "measures": {{}}, "seconds": 1.0}}
            (out / f"{{node}}.json").write_text(json.dumps({{"node": node, "ranks": [report]}}))
    if os.environ.get("FAKE_GATE") != "real":
        sys.exit(0)
action, stop = os.environ.get("FAKE_SRUN", "ok"), os.environ["COOKBOOK_STOP_FILE"]
if action == "nodes" or "cookbook_runtime.nodecheck" in args:  # each node's command for real, side by side
    import subprocess
    listed = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")]
    nodes = (listed[0] if listed else os.environ["SLURM_JOB_NODELIST"]).split(",")
    command = args[next(i for i, a in enumerate(args) if not a.startswith("-")) :]
    def on(i):  # every fake node is this machine: the first hosts torchrun's store, as the batch host does
        if "--rdzv-backend=c10d" not in command:
            return command
        conf = next((a for a in command if a.startswith("--rdzv-conf=")), "--rdzv-conf=")
        host = conf + ("," if conf[-1] != "=" else "") + f"is_host={{int(i == 0)}}"
        rest = [a for a in command if a != conf]
        return [*rest[: rest.index("--rdzv-backend=c10d")], host, *rest[rest.index("--rdzv-backend=c10d") :]]
    each = [dict(os.environ, SLURMD_NODENAME=n, SLURM_NODEID=str(i), SLURM_PROCID=str(i), SLURM_LOCALID="0",
                 SLURM_NTASKS=str(len(nodes))) for i, n in enumerate(nodes)]
    prefix = os.environ.get("FAKE_NODE_PREFIX", "").split("\t") if os.environ.get("FAKE_NODE_PREFIX") else []
    sys.exit(max(p.wait() for p in [subprocess.Popen([*prefix, *on(i)], env=env) for i, env in enumerate(each)]))
if action.startswith("signal:"):
    os.kill(os.getppid(), getattr(signal, "SIG" + action.split(":")[1]))
    for _ in range(200):  # the ranks poll the stop flag at every step
        if os.path.exists(stop):
            break
        time.sleep(0.05)
    action = "save" if os.path.exists(stop) else "exit:9"
if action == "save-if-stopped":  # the ranks' first step: a stop asked for before the launch is there
    action = "save" if os.path.exists(stop) else "exit:9"
if action == "save":
    Path(stop + ".saved").write_text("cookbook: saved at step 3 for preemption: ckpt/step-3\n")
elif action == "hang":
    hang = Path(os.environ["COOKBOOK_HANG_DIR"])
    (hang / "HANG").write_text(json.dumps({{"rank": 0, "host": "n1", "reason": "no step for 900 s"}}))
    for rank, host, step in ((0, "n1", 5), (1, "n2", 4)):
        meta = {{"rank": rank, "world_size": 2, "host": host, "step": step}}
        (hang / f"rank_{{rank}}.json").write_text(json.dumps(meta))
    sys.exit(1)
elif action.startswith("crash:"):
    exits = os.environ["COOKBOOK_EXITS_DIR"]
    if exits.endswith(".0"):  # the first launch: NODE's launcher saw its ranks die of SIGKILL
        os.makedirs(exits, exist_ok=True)
        record = {{"node": action.split(":")[1], "signals": ["SIGKILL"], "at": time.time()}}
        Path(exits, action.split(":")[1] + ".json").write_text(json.dumps(record))
        sys.exit(1)
elif action.startswith("launcher-killed:") and os.environ["COOKBOOK_EXITS_DIR"].endswith(".0"):
    node = action.split(":")[1]  # its launcher SIGKILLed: no exits record; srun's lines, then its teardown's
    print(f"srun: error: {{node}}: task 1: Killed", file=sys.stderr)
    print("srun: launch/slurm: _step_signal: Terminating StepId=41.0", file=sys.stderr)
    print("srun: error: n1: task 0: Killed", file=sys.stderr)
    sys.exit(137)
elif action == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
elif action.startswith("exit:"):
    sys.exit(int(action.split(":")[1]))
"""


def runtime_argv(script: str, env: dict[str, str] | None = None) -> list[str]:
    """The words the script's last line passes to ``python3 -m cookbook_runtime.run``, as bash expands them after
    the script's own "where things are" block (job 1234 on 2 nodes, submitted from ``/recipes``)."""
    where = script[script.index("# --- where things are") : script.index("\n", script.index("export PYTHONPATH="))]
    line = script[script.index(EXEC) :].replace(EXEC, "printf '%s\\0'", 1)
    base = {"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": "/recipes", "SLURM_JOB_ID": "1234"}
    base["SLURM_JOB_NUM_NODES"] = "2"
    out = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{where}\n{line}"],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split("\0")[:-1]


def runtime_args(script: str, env: dict[str, str] | None = None) -> argparse.Namespace:
    """The script's switches as the runtime's parser reads them (``launcher``: the words after ``--``)."""
    args = run.build_parser().parse_args(runtime_argv(script, env))
    if args.launcher[:1] == ["--"]:
        args.launcher = args.launcher[1:]
    return args


def job_view(args: argparse.Namespace, job_id: str = "1234", nodes: tuple[str, ...] = ("n1", "n2")) -> SimpleNamespace:
    """What ``run.rendezvous`` and ``run.launch_command`` read of a ``run.Job`` (run folder ``/runs/job``)."""
    return SimpleNamespace(
        args=args, id=job_id, nodes=list(nodes), allocated=list(nodes), spares=[], batch_host=nodes[0], launches=0,
        nodelist=",".join(nodes), run_dir=Path("/runs/job"),
    )  # fmt: skip


def unset_env(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset ``names`` for this test; whatever the code under test sets them to is undone after it."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@dataclass
class Ran:
    status: int
    out: str
    calls: list[dict]

    def argv(self, cmd: str) -> list[list[str]]:
        """The arguments of every call of ``cmd``, in order."""
        return [c["argv"] for c in self.calls if c["cmd"] == cmd]

    def launches(self) -> list[dict]:
        """The srun calls that started the ranks (not the pre-flight's)."""
        checks = ("cookbook_runtime.nodecheck", "cookbook_runtime.pyenv")
        return [c for c in self.calls if c["cmd"] == "srun" and not set(checks) & set(c["argv"])]


class FakeSlurm:
    """A folder with the stand-ins (``bin/``), a home, a submit folder and a run folder (``run/``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True)
        self.calls = folder / "calls.jsonl"
        self.run_dir = folder / "run"
        standin = _STANDIN.format(python=sys.executable, calls=str(self.calls))
        for name in ("srun", "scontrol", "sinfo", "squeue", "scancel", "sbatch"):
            (self.bin / name).write_text(standin)
            (self.bin / name).chmod(0o755)
        (self.bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (self.bin / "python3").chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        """A batch step's environment: job 41 on n1,n2, nothing of this machine's NCCL/HF/Slurm settings."""
        return {
            "PATH": f"{self.bin}:{os.environ['PATH']}:/usr/sbin:/sbin",
            "HOME": str(self.folder),
            "HF_HOME": str(self.folder / "hf"),
            "PYTHONPATH": str(RUNTIME_ROOT),
            "RUN_DIR": str(self.run_dir),
            "SLURM_SUBMIT_DIR": str(self.folder),
            "SLURM_JOB_ID": "41",
            "SLURM_JOB_NODELIST": "n1,n2",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_CPUS_ON_NODE": "4",
            "COOKBOOK_CHECKPOINT_GB": "0",  # a 70B checkpoint is more than /tmp holds: test_runtime_decide checks it
            **extra,
        }

    def _ran(self, cmd: list[str], env: dict[str, str]) -> Ran:
        self.calls.unlink(missing_ok=True)
        log = self.folder / "job.out"  # as Slurm runs a batch step: stdout and stderr appended to one file
        log.unlink(missing_ok=True)
        with open(log, "ab") as out:
            r = subprocess.run(cmd, env=env, cwd=self.folder, stdout=out, stderr=out, timeout=120)
        calls = [json.loads(line) for line in self.calls.read_text().splitlines()] if self.calls.exists() else []
        return Ran(r.returncode, log.read_text(errors="replace"), calls)

    def run_step(self, argv: list[str], **env: str) -> Ran:
        """``python3 -m cookbook_runtime.run ARGV`` as the batch step."""
        return self._ran([sys.executable, "-m", "cookbook_runtime.run", *argv], self.env(**env))

    def run_script(self, script: Path, **env: str) -> Ran:
        """A whole written script under bash, as the batch step: its last line execs the runtime it ships."""
        environ = self.env(**env)
        del environ["PYTHONPATH"]
        return self._ran(["bash", str(script)], environ)
