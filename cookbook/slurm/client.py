"""A small typed client over the Slurm commands (sbatch, squeue, scontrol, sacct, scancel).

It honours ``SLURM_CONF`` and whatever the cluster's defaults are: nothing here assumes the local
cluster. Slurm's own error text reaches the caller in :class:`SlurmError`.
"""

from __future__ import annotations

import configparser
import netrc
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cookbook.spec import SECRET_NAMES

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)

REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD"})  # back in the queue after a requeue
REQUEUE_SETTLE_S = 5.0  # requeue to forced start: slurmd revokes the last start's credential by the second


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is Slurm's own error text."""

    def __init__(self, command: Sequence[str], returncode: int, stderr: str):
        self.command, self.returncode, self.stderr = list(command), returncode, stderr.strip()
        super().__init__(f"{command[0]} failed (exit {returncode}): {self.stderr or '(no message)'}")

    @property
    def line(self) -> str:
        """Slurm's message as one line: its ``fatal:`` line where it has one, else its last line (a squeue with
        no configuration to find prints three ``error:`` lines on the way to the fatal one that says it)."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        fatal = [ln for ln in lines if "fatal:" in ln]
        return (fatal or lines or [str(self)])[-1]


DEFAULT_CONF = "/etc/slurm/slurm.conf"  # where Slurm's commands look without SLURM_CONF (Debian's and upstream's)
DEFAULT_PORT = "6817"  # SlurmctldPort's default
# what Slurm's commands print when slurmctld does not answer (squeue, sinfo, scontrol, sbatch, scancel)
UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Communication connection failure",
)
# what may say the same but also something else (``scontrol requeue`` with no controller): `scontrol ping` decides
AMBIGUOUS = ("Unexpected message received",)


class SlurmUnreachable(SlurmError):
    """Slurm's controller did not answer: one line naming the controller, the configuration that names it
    (``SLURM_CONF``) and Slurm's own text (``str(e)``, ``e.line`` and ``e.stderr`` are that line)."""

    def __init__(self, command: Sequence[str], returncode: int, said: str, env: Mapping[str, str]):
        said = " / ".join(ln.strip() for ln in said.splitlines() if ln.strip())
        line = (
            f"Slurm unreachable: {command[0]} got no answer from the controller {controller(env)}: {said}; "
            "start slurmctld there, or point SLURM_CONF at your cluster's slurm.conf (`scontrol ping` checks)"
        )
        super().__init__(command, returncode, line)
        self.args = (line,)

    def __str__(self) -> str:
        return self.stderr

    @property
    def line(self) -> str:
        return self.stderr


def controller(env: Mapping[str, str]) -> str:
    """The controller the Slurm configuration names and where it says so: ``host:port (SlurmctldHost of
    SLURM_CONF=PATH)`` from ``SlurmctldHost`` (or the older ``ControlMachine``) and ``SlurmctldPort`` of that file,
    read here (with the controller down, ``scontrol show config`` cannot say), or why it cannot be told."""
    conf = env.get("SLURM_CONF")
    path = Path(conf or DEFAULT_CONF)
    source = f"SLURM_CONF={conf}" if conf else f"{DEFAULT_CONF}, SLURM_CONF being unset"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(unknown: {path} cannot be read{'' if conf else ' and SLURM_CONF is unset'}: Slurm asks DNS SRV)"
    keys: dict[str, list[str]] = {}
    for m in re.finditer(r"(?im)^\s*(SlurmctldHost|ControlMachine|SlurmctldPort)\s*=\s*(\S+)", text):
        keys.setdefault(m[1].lower(), []).append(m[2])
    hosts = keys.get("slurmctldhost") or keys.get("controlmachine")
    if not hosts:
        return f"(unknown: no SlurmctldHost in {source})"
    port = (keys.get("slurmctldport") or [DEFAULT_PORT])[-1]
    return " or ".join(f"{host}:{port}" for host in hosts) + f" (SlurmctldHost of {source})"


# ------------------------------------------------------------------ secrets
# sbatch's default --export=ALL copies the caller's environment into the job, and slurmctld keeps it in its state
# (StateSaveLocation/hash.*/job.*/environment; in accounting with AccountingStoreFlags=job_env): no Slurm command
# the cookbook runs sees a secret. A job reads each one on the node from the file its library reads by itself.
W_AND_B_HOST = "https://api.wandb.ai"


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` minus :data:`cookbook.spec.SECRET_NAMES`: what every Slurm command is run with."""
    return {k: v for k, v in env.items() if k not in SECRET_NAMES}


def _home(env: Mapping[str, str]) -> Path:
    """The home folder the job gets (``HOME`` is exported with the rest of the environment)."""
    return Path(env.get("HOME") or os.path.expanduser("~"))


def hf_token_file(env: Mapping[str, str]) -> Path:
    """The token file the job runtime's ``read_hf_token`` (and huggingface_hub) reads on the node."""
    home = env.get("HF_HOME") or str(_home(env) / ".cache" / "huggingface")
    return Path(env.get("HF_TOKEN_PATH") or f"{home}/token")


def _has_hf_token_file(env: Mapping[str, str]) -> bool:
    path = hf_token_file(env)
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _has_wandb_netrc(env: Mapping[str, str]) -> bool:
    """Whether ``wandb login``'s ``~/.netrc`` (or ``$NETRC``) has a key for the W&B host the job talks to."""
    path = Path(env["NETRC"]).expanduser() if env.get("NETRC") else _home(env) / ".netrc"
    host = urlsplit(env.get("WANDB_BASE_URL") or W_AND_B_HOST).netloc
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def _has_mlflow_credentials(env: Mapping[str, str]) -> bool:
    """Whether MLflow's own ``~/.mlflow/credentials`` (``[mlflow]`` section) holds a password."""
    parser = configparser.ConfigParser()
    try:
        parser.read(_home(env) / ".mlflow" / "credentials")
    except configparser.Error:
        return False
    return bool(parser.get("mlflow", "mlflow_tracking_password", fallback=""))


#: each secret: whether the node finds it in its library's own file, and how to put it there. MLflow reads no
#: token from a file (3.x: only MLFLOW_TRACKING_TOKEN), so a token server is reached with its username/password.
NODE_SOURCES: dict[str, tuple[Callable[[Mapping[str, str]], bool], str]] = {
    "HF_TOKEN": (_has_hf_token_file, "run `hf auth login` (it writes the token file the job reads)"),
    "HUGGING_FACE_HUB_TOKEN": (_has_hf_token_file, "run `hf auth login` (it writes the token file the job reads)"),
    "WANDB_API_KEY": (_has_wandb_netrc, "run `wandb login` (it writes ~/.netrc, which the job reads)"),
    "MLFLOW_TRACKING_PASSWORD": (
        _has_mlflow_credentials,
        "put mlflow_tracking_username/mlflow_tracking_password under [mlflow] in ~/.mlflow/credentials (chmod 600)",
    ),
    "MLFLOW_TRACKING_TOKEN": (
        lambda env: False,
        "MLflow reads no token from a file: use ~/.mlflow/credentials (mlflow_tracking_username/password, chmod 600)",
    ),
}


def withheld_secrets_warning(env: Mapping[str, str]) -> str | None:
    """One line naming each secret of ``env`` the job will not get (Slurm is not given it) and no file on the
    node gives it, with the fix; never a value. None when there is none."""
    missing = [(name, fix) for name, (has_file, fix) in NODE_SOURCES.items() if env.get(name) and not has_file(env)]
    if not missing:
        return None
    names = ", ".join(name for name, _ in missing)
    fixes = "; ".join(dict.fromkeys(fix for _, fix in missing))
    return (
        f"warning: {names} in your environment: not given to the job (Slurm would keep it in its record of the "
        f"job), and no file on the node holds it; {fixes}"
    )


class JobTimeout(TimeoutError):
    """``wait`` gave up before the job ended."""


@dataclass(frozen=True)
class JobInfo:
    """What Slurm knows about one job."""

    job_id: str
    state: str  # e.g. PENDING, RUNNING, COMPLETED, TIMEOUT (CANCELLED by ... -> CANCELLED)
    exit_code: str = ""  # "0:0" where known
    nodes: str = ""  # node list, or the pending reason
    source: str = "squeue"  # squeue, scontrol, sacct or jobcomp

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


class SlurmClient:
    """Runs Slurm commands with one environment (``SLURM_CONF`` and PATH; never a secret of
    :data:`cookbook.spec.SECRET_NAMES`: :func:`without_secrets`)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 60):
        base = dict(os.environ if env is None else env)
        base["PATH"] = base.get("PATH", "") + ":/usr/sbin:/sbin"
        self.env, self.timeout = base, timeout
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ plumbing
    def run(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; raise :class:`SlurmError` with Slurm's message on failure."""
        exe = shutil.which(args[0], path=self.env["PATH"])
        if exe is None:
            raise SlurmError(
                args,
                127,
                f"{args[0]} not found: is this a Slurm login node? "
                "(locally: `cookbook cluster up` and `eval $(cookbook cluster env)`)",
            )
        conf = self.env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():  # Slurm itself retries a missing file for 60 s, then fails
            raise SlurmError(args, 1, f"SLURM_CONF={conf}: no such file")
        try:
            r = subprocess.run(
                [exe, *args[1:]],
                capture_output=True,
                text=True,
                env=without_secrets(self.env),
                timeout=self.timeout,
                input=input,
            )
        except subprocess.TimeoutExpired as e:
            raise SlurmUnreachable(args, 124, f"no answer within {self.timeout:.0f} s", self.env) from e
        if r.returncode != 0 and self._unreachable(r.stderr or r.stdout):
            raise SlurmUnreachable(args, r.returncode, r.stderr or r.stdout, self.env)
        if check and r.returncode != 0:
            raise SlurmError(args, r.returncode, r.stderr or r.stdout)
        return r

    def _unreachable(self, said: str) -> bool:
        """Whether a failed command's text says the controller did not answer (``AMBIGUOUS`` text: when
        ``scontrol ping`` finds it down too)."""
        if any(text in said for text in UNREACHABLE):
            return True
        if not any(text in said for text in AMBIGUOUS):
            return False
        ping = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, env=without_secrets(self.env), timeout=self.timeout
        )
        return " is DOWN" in ping.stdout and " is UP" not in ping.stdout

    # ------------------------------------------------------------------ verbs
    def submit(
        self, script: str | os.PathLike[str], *sbatch_args: str, cwd: str | os.PathLike[str] | None = None
    ) -> str:
        """``sbatch`` a script (the environment without secrets; a warning line on stderr for a secret the job
        then finds nowhere, once per client); return the job id."""
        args = ["sbatch", "--parsable", *sbatch_args, str(Path(script).resolve())]
        if cwd is not None:
            args.insert(2, f"--chdir={Path(cwd).resolve()}")
        out = self.run(*args).stdout.strip()
        if (warning := withheld_secrets_warning(self.env)) and warning not in self._warned:
            self._warned.add(warning)
            print(warning, file=sys.stderr)
        return out.split(";")[0].splitlines()[-1]

    def test_only(self, script: str | os.PathLike[str], *sbatch_args: str) -> str:
        """``sbatch --test-only``: Slurm checks the request without queueing it; returns its message."""
        r = self.run("sbatch", "--test-only", *sbatch_args, str(script))
        return (r.stderr or r.stdout).strip()

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        self.run("scancel", *([f"--signal={signal}"] if signal else []), job_id)

    def requeue(self, job_id: str) -> None:
        self.run("scontrol", "requeue", job_id)

    def release_requeued(self, job_id: str, timeout: float = 120) -> None:
        """Start a requeued job now rather than after the ~2 minutes Slurm holds it back (its BeginTime).

        Waits until the job pends again, then ``REQUEUE_SETTLE_S``: a start within the second of the requeue
        carries a credential slurmd still counts as revoked ("Job credential revoked"), and the job ends FAILED.
        """
        end = time.monotonic() + timeout
        while self.state(job_id).state not in REQUEUED_STATES:
            if time.monotonic() > end:
                raise JobTimeout(f"job {job_id} was not back in the queue after {timeout:.0f} s")
            time.sleep(0.5)
        time.sleep(REQUEUE_SETTLE_S)
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def state(self, job_id: str, answer_required: bool = False) -> JobInfo:
        """State of a job: squeue while Slurm keeps it, then sacct, then the job-completion log.
        ``answer_required``: a controller that does not answer is a :class:`SlurmError` even when a record
        knows the job (a user must not take a record for Slurm's answer)."""
        r = r_squeue = self.run("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T|%R", check=False)
        if r.returncode == 0 and r.stdout.strip():
            state, where = r.stdout.strip().splitlines()[0].split("|", 1)
            info = JobInfo(job_id, state, "", where, "squeue")
            return self._with_exit_code(info) if info.done else info
        if answer_required and r.returncode and "invalid job id" not in r.stderr.lower():
            raise SlurmError(["squeue", "-j", job_id], r.returncode, r.stderr)
        for source, flags in (("sacct", []), ("jobcomp", ["-c"])):
            r = self.run(
                "sacct", *flags, "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList", check=False
            )
            rows = [ln.split("|") for ln in r.stdout.splitlines() if ln.startswith(job_id)]
            if r.returncode == 0 and rows:
                _, state, code, nodes = rows[-1][:4]
                return JobInfo(job_id, state.split()[0], code, nodes, source)
        if r_squeue.returncode and "invalid job id" not in r_squeue.stderr.lower():  # Slurm itself failed
            raise SlurmError(["squeue", "-j", job_id], r_squeue.returncode, r_squeue.stderr)
        raise SlurmError(
            ["squeue", "-j", job_id], 1, f"job {job_id} is unknown to squeue, sacct and the job-completion log"
        )

    def _with_exit_code(self, info: JobInfo) -> JobInfo:
        fields = self.show_job(info.job_id)
        return JobInfo(
            info.job_id, info.state, fields.get("ExitCode", ""), fields.get("NodeList", info.nodes), info.source
        )

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once Slurm forgot the job)."""
        r = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if r.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        for token in r.stdout.split():
            key, _, value = token.partition("=")
            if value or key not in fields:
                fields[key] = value
        return fields

    def hostnames(self, nodelist: str) -> list[str]:
        """A node list (``n[1-2],gpu07``) expanded to host names in order (``scontrol show hostnames``)."""
        if not nodelist.strip():
            return []
        return self.run("scontrol", "show", "hostnames", nodelist.strip()).stdout.split()

    def output_path(self, job_id: str) -> Path | None:
        """The job's standard output file, as Slurm resolved it."""
        out = self.show_job(job_id).get("StdOut")
        return Path(out) if out else None

    def wait(
        self, job_id: str, timeout: float = 3600, poll: float = 1.0, until: frozenset[str] = TERMINAL_STATES
    ) -> JobInfo:
        """Poll until the job reaches one of ``until`` (a terminal state by default)."""
        end = time.monotonic() + timeout
        while True:
            info = self.state(job_id)
            if info.state in until:
                return info
            if time.monotonic() > end:
                raise JobTimeout(f"job {job_id} still {info.state} after {timeout:.0f} s")
            time.sleep(poll)

    def partitions(self) -> list[dict[str, str]]:
        """Partitions with their nodes, CPUs and GPUs (``sinfo``)."""
        r = self.run("sinfo", "-h", "-o", "%P|%D|%c|%G|%a|%l")
        keys = ("partition", "nodes", "cpus", "gres", "avail", "timelimit")
        return [dict(zip(keys, ln.split("|"))) for ln in r.stdout.splitlines() if ln.strip()]


def read_output(path: str | os.PathLike[str], tail_lines: int | None = None) -> str:
    """Text of a job's output file (the last ``tail_lines`` lines if given); '' if not there yet."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if tail_lines is not None:
        text = "\n".join(text.splitlines()[-tail_lines:])
    return text
