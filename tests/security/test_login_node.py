"""Safe on a shared login node, tried for real: no secret in any process's argv or in any file a whole
run writes, and a second user of the machine kept out of every server the cookbook starts.

One module fixture runs, with known values of HF_TOKEN, WANDB_API_KEY and the Jupyter tokens:
a short profiled FSDP job on the local cluster, a notebook (papermill), ``make lab`` (its Unix
socket mode, as a user starts it, with a kernel started through the API), ``start_lab`` in its TCP
fallback and ``cookbook profile view``; a thread samples every process's /proc/PID/cmdline the whole
time. Then, in order:

1. a throw-away unprivileged user (useradd, removed again) reads every command line and finds no
   token, cannot open the servers' Unix sockets or read the servers' environments, and gets 403 from
   the TCP JupyterLab without its token;
2. no sampled command line held a secret;
3. after every server stopped, no file written since the fixture started under ``out/``, ``.cluster/``,
   the run folders, the temporary folder or the home folder holds a secret (Slurm's own copy of the job's
   environment in the controller's state folder, 0600 in 0700 and owned by SlurmUser, is the one kind of
   file allowed to, and the test checks exactly that).

Files are selected by change time (st_ctime, which no copy can preserve): the tokens are random per
run, so no older file can hold them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cookbook.paths import output_dir, project_root

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PY = sys.executable
COOKBOOK = str(Path(sys.executable).parent / "cookbook")


# ------------------------------------------------------------------------------------------ helpers
class ArgvSampler(threading.Thread):
    """Reads every process's command line every ``interval`` s until stopped; records any secret seen."""

    def __init__(self, secrets_: list[str], interval: float = 0.05):
        super().__init__(daemon=True)
        self.needles = [s.encode() for s in secrets_]
        self.interval = interval
        self.hits: list[str] = []
        self.samples = 0
        self.commands: set[str] = set()
        self._halt = threading.Event()

    def add(self, secret: str) -> None:
        self.needles.append(secret.encode())

    def run(self) -> None:
        while not self._halt.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        argv = fh.read()
                except OSError:
                    continue
                self.commands.add(argv.replace(b"\0", b" ")[:600].decode(errors="replace"))
                for n in self.needles:
                    if n in argv:
                        self.hits.append(f"pid {pid}: {argv[:300]!r}")
            self.samples += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def _changed_files(roots: list[Path], since: float) -> list[Path]:
    """Regular files under ``roots`` whose content or inode changed at or after ``since``."""
    out, seen = [], set()
    for root in roots:
        if not root.exists():
            continue
        for dirpath, _dirnames, filenames in os.walk(root, onerror=lambda e: None):
            if dirpath.startswith("/proc"):
                continue
            for name in filenames:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if stat.S_ISREG(st.st_mode) and max(st.st_ctime, st.st_mtime) >= since and key not in seen:
                    seen.add(key)
                    out.append(Path(p))
    return out


def _holding(files: list[Path], needles: list[str]) -> list[Path]:
    data = [n.encode() for n in needles]
    hits = []
    for p in files:
        try:
            if p.stat().st_size > 2**30:
                raise AssertionError(f"{p}: a file over 1 GiB written during a tiny run")
            with open(p, "rb") as fh:
                blob = fh.read()
        except OSError:
            continue
        if any(n in blob for n in data):
            hits.append(p)
    return hits


def _wait_line(proc: subprocess.Popen, pattern: str, out: list[str], timeout: float = 120) -> re.Match:
    """Read ``proc``'s stdout until a line matches ``pattern``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        out.append(line)
        if m := re.search(pattern, line):
            return m
    raise AssertionError(f"no line matching {pattern!r}; output:\n{''.join(out)[-3000:]}")


def _run_in_lab_kernel(sock: Path, token: str, kernel_id: str, code: str, log: Path) -> str:
    """Run ``code`` in a kernel of the socket-mode lab over its ipc sockets (as its owner, through the
    connection file in the lab's private runtime folder); its stdout once the server reports it idle."""
    from jupyter_client import BlockingKernelClient

    from cookbook import sockethttp

    kc = BlockingKernelClient(connection_file=str(sock.parent / "runtime" / f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    assert kc.transport == "ipc", kc.transport
    out: list[str] = []
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=180)
        reply = kc.execute_interactive(
            code,
            timeout=120,
            output_hook=lambda m: out.append(m["content"].get("text", "") if m["msg_type"] == "stream" else ""),
        )
    finally:
        kc.stop_channels()
    assert reply["content"]["status"] == "ok", f"{reply['content']}\n{log.read_text()[-3000:]}"
    deadline, state = time.monotonic() + 60, None  # the server's own view of it (its iopub watcher)
    while state != "idle":
        assert time.monotonic() < deadline, f"the server still sees the kernel as {state}"
        status, body = sockethttp.get(f"/api/kernels/{kernel_id}?token={token}", sock=sock, timeout=10)
        state = json.loads(body).get("execution_state") if status == 200 else f"HTTP {status}"
        if state != "idle":
            time.sleep(0.2)
    return "".join(out)


@contextlib.contextmanager
def _environment(**values: str):
    """``values`` in os.environ (so every process started inherits them), the old ones back afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(2)  # Ctrl-C, as the user stops them
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Session:
    started: float
    hf_token: str
    wandb_key: str
    jupyter_tokens: list[str]
    sampler: ArgvSampler
    job_dir: Path
    notebook_dir: Path
    lab_cli: subprocess.Popen
    lab_sock: Path
    lab_tcp: object
    view_cli: subprocess.Popen
    tb_sock: Path
    root: Path
    job_program: str
    outputs: list[str] = field(default_factory=list)

    @property
    def secrets(self) -> list[str]:
        return [self.hf_token, self.wandb_key, *self.jupyter_tokens]

    def server_pids(self) -> list[int]:
        pids = [self.lab_cli.pid, self.lab_tcp.process.pid, self.view_cli.pid]
        for pid in list(pids):
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                kids = []
            pids += [int(k) for k in kids]
        return pids

    def stop_servers(self) -> None:
        _stop(self.lab_cli)
        _stop(self.view_cli)
        self.lab_tcp.stop()


# ------------------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def session(slurm, tiny_assets, tmp_path_factory):
    with contextlib.ExitStack() as cleanup:  # whatever started is stopped again, also when setup fails
        yield from _sweep(cleanup, slurm, tiny_assets, tmp_path_factory)


def _sweep(cleanup: contextlib.ExitStack, slurm, tiny_assets, tmp_path_factory):
    """The whole run behind :func:`session`; each thing it starts registers its stop with ``cleanup``."""
    from cookbook.lab import start_lab
    from cookbook.notebook_runner import local_parameters, run_notebook
    from cookbook.recipes import get_recipe
    from cookbook.walkthrough import job_spec, profiling_overrides, submit

    started = time.time() - 1
    hf = f"hf_SWEEP{secrets.token_hex(12)}"
    wandb = f"wandbSWEEP{secrets.token_hex(16)}"
    jupyter_tcp = f"jupSWEEP{secrets.token_hex(16)}"
    cleanup.enter_context(_environment(HF_TOKEN=hf, WANDB_API_KEY=wandb))
    sampler = ArgvSampler([hf, wandb, jupyter_tcp])
    sampler.start()
    cleanup.callback(sampler.stop)
    root = tmp_path_factory.mktemp("sweep")
    job_dir, nb_dir = root / "runs", root / "notebook"

    # a short profiled FSDP job on the cluster (runs while the notebook and the servers start)
    spec = job_spec(
        "fsdp_llama3_1_8b",
        profile="local-cpu",
        nodes=1,
        job_name="sweep-fsdp",
        assets_dir=str(tiny_assets.root),
        overrides={
            "max_steps": "6",
            **profiling_overrides("fsdp_llama3_1_8b", "local-cpu", steps=1, warmup=1, start_step=2),
        },
    )
    job = submit(spec, root=job_dir, client=slurm)
    cleanup.callback(lambda: job.done() or job.cancel())
    # the program the job really runs on its node, as its recipe launches it: its path below the folder variable
    # ($RUNTIME_DIR: the runtime shipped with the job), as it appears in the process's argv
    job_program = re.sub(r'^"?\$\{?\w+\}?"?/', "", get_recipe(spec.recipe).command(spec).args[0])
    print(f"job submitted: {time.time() - started:.0f} s")

    # make lab, as a user runs it (Unix socket mode); its token comes from its own output; its log in
    # a folder of this test (out/lab/jupyterlab.log is every other `make lab`'s too)
    env = dict(os.environ, PYTHONUNBUFFERED="1", COOKBOOK_OUT=str(root / "out"))
    lab_out: list[str] = []
    lab_cli = subprocess.Popen(
        [PY, "-m", "cookbook.lab", "--root", str(root), "--login-node", "login1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    cleanup.callback(_stop, lab_cli)
    m = _wait_line(lab_cli, r"ssh -N -L 8888:(\S+\.sock) \S+@login1", lab_out)
    lab_sock = Path(m.group(1))
    token = _wait_line(lab_cli, r"token=([0-9a-f]+)", lab_out).group(1)
    sampler.add(token)
    lab_tcp = start_lab(root, token=jupyter_tcp, log=root / "lab-tcp.log")
    cleanup.callback(lab_tcp.stop)
    print(f"labs up: {time.time() - started:.0f} s")

    # a kernel in the socket-mode lab: kernels are processes too (their argv, their connection files)
    from cookbook import sockethttp

    status, body = sockethttp.request(
        "POST",
        "/api/kernels",
        sock=lab_sock,
        body=b"{}",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        timeout=60,
    )
    lab_log = root / "out" / "lab" / "jupyterlab.log"
    assert status == 201, f"{body!r}\n{lab_log.read_text()[-3000:]}"
    kernel_id = json.loads(body)["id"]

    # one small notebook, executed by papermill (the kernel inherits both secrets)
    run_notebook(
        "01_plug_in_your_dataset",
        nb_dir,
        local_parameters("01_plug_in_your_dataset", tiny_assets),
        cwd=nb_dir / "work",
        name="01.sweep",
    )
    print(f"notebook done: {time.time() - started:.0f} s")
    # the lab's kernel answers over its ipc sockets and sees the secrets (without printing them)
    seen = _run_in_lab_kernel(
        lab_sock,
        token,
        kernel_id,
        "import os; print(sorted(k for k in ('HF_TOKEN', 'WANDB_API_KEY') if os.environ.get(k)))",
        lab_log,
    )
    assert seen.strip() == "['HF_TOKEN', 'WANDB_API_KEY']", seen

    info = job.wait(timeout=300, echo=lambda s: None)
    assert info.state == "COMPLETED", job.log.read_text()[-3000:]
    print(f"job done: {time.time() - started:.0f} s")

    # cookbook profile view on the job's traces (private Unix socket)
    view_out: list[str] = []
    view_cli = subprocess.Popen(
        [COOKBOOK, "profile", "view", str(job.script.parent), "--login-node", "login1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    cleanup.callback(_stop, view_cli)
    tb_sock = Path(_wait_line(view_cli, r"ssh -N -L 6006:(\S+\.sock) login1", view_out).group(1))
    print(f"view up: {time.time() - started:.0f} s")

    yield Session(
        started,
        hf,
        wandb,
        [token, jupyter_tcp],
        sampler,
        job_dir,
        nb_dir,
        lab_cli,
        lab_sock,
        lab_tcp,
        view_cli,
        tb_sock,
        root,
        job_program,
        lab_out + view_out,
    )


# ------------------------------------------------------------------------------------------ 1. second user
SECOND_USER_SCRIPT = r"""
import json, os, socket, sys, http.client
cfg = json.load(sys.stdin)
needles = [t.encode() for t in cfg["secrets"]]
out = {"processes": 0, "argv_hits": [], "environ_readable": [], "sockets": {}, "tcp": {}, "files": {}}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        out["processes"] += 1
        if any(n in argv for n in needles):
            out["argv_hits"].append(pid)
for pid in cfg["server_pids"]:
    try:
        open(f"/proc/{pid}/environ", "rb").read()
        out["environ_readable"].append(pid)
    except OSError:
        pass
for path in cfg["sockets"]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        out["sockets"][path] = "connected"
    except OSError as e:
        out["sockets"][path] = type(e).__name__
    finally:
        s.close()
for port in cfg["tcp_ports"]:
    res = []
    for path in ("/api/contents", "/api/kernels", "/api/status?token=wrong"):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", path)
        res.append(c.getresponse().status)
        c.close()
    out["tcp"][str(port)] = res
for path in cfg["files"]:
    try:
        open(path, "rb").read(1)
        out["files"][path] = "read"
    except OSError as e:
        out["files"][path] = type(e).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def second_user():
    """A throw-away unprivileged user (removed at the end)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creating a second user needs root and useradd")
    name = f"cbsec{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name], check=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def test_second_user_finds_no_token_and_is_refused_by_every_server(session, second_user):
    from cookbook.local.cluster import LocalCluster

    # Slurm's controller keeps each live job's environment: the cookbook gives it no secret (SlurmClient drops
    # SECRET_NAMES; test_python_api checks the record), and another user must not read it either way
    state_envs = [str(p) for p in (LocalCluster().cfg.root / "state").rglob("environment")]
    cfg = {
        "secrets": session.secrets,
        "server_pids": session.server_pids(),
        "sockets": [str(session.lab_sock), str(session.tb_sock)],
        "tcp_ports": [session.lab_tcp.port],
        "files": [str(session.lab_sock.parent), *state_envs[:5]],
    }
    # the secrets go in on stdin (never argv) and the environment is a bare one, not ours
    r = subprocess.run(
        ["/usr/bin/python3", "-c", SECOND_USER_SCRIPT],
        input=json.dumps(cfg),
        text=True,
        capture_output=True,
        user=second_user.pw_uid,
        group=second_user.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        cwd="/",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    print(json.dumps(seen, indent=1))
    assert seen["processes"] > 20, "the second user saw almost no processes: is /proc mounted with hidepid?"
    assert seen["argv_hits"] == []
    assert seen["environ_readable"] == []
    assert seen["sockets"] == {str(session.lab_sock): "PermissionError", str(session.tb_sock): "PermissionError"}
    assert seen["tcp"] == {str(session.lab_tcp.port): [403, 403, 403]}
    assert set(seen["files"].values()) <= {"PermissionError"}
    # and we, the owner, get in with the token (the refusals above are not a dead server)
    assert session.lab_tcp.get(f"/api/contents?token={session.jupyter_tokens[1]}")[0] == 200
    from cookbook import sockethttp

    assert sockethttp.get(f"/api/status?token={session.jupyter_tokens[0]}", sock=session.lab_sock)[0] == 200
    assert sockethttp.get("/data/runs", sock=session.tb_sock)[0] == 200


# ------------------------------------------------------------------------------------------ 2. argv
def test_no_secret_in_any_process_argv(session):
    sampler = session.sampler
    assert sampler.samples > 50, sampler.samples
    everything = "\n".join(sampler.commands)
    for what in ("jupyterlab", "ipykernel", "cookbook.profiling.view", "slurmstepd", session.job_program):
        assert what in everything, f"the sampler never saw a {what} process"
    assert sampler.hits == [], sampler.hits[:5]
    assert not any(
        s in "".join(session.outputs).replace(session.jupyter_tokens[0], "")
        for s in (session.hf_token, session.wandb_key)
    )


# ------------------------------------------------------------------------------------------ 3. files
def test_no_secret_in_any_file_the_run_wrote(session):
    session.stop_servers()
    time.sleep(1)
    assert not session.lab_sock.parent.exists() and not session.tb_sock.parent.exists(), (
        "a server left its private folder (token, socket) behind"
    )
    roots = [
        output_dir(),
        (project_root() / ".cluster").resolve(),
        project_root() / ".cache",
        session.root,
        Path(tempfile.gettempdir()),
        Path.home(),
        Path("/var/tmp"),
        Path("/dev/shm"),  # shared memory (torch, NCCL, data-loader workers): world-listable on every node
    ]
    files = _changed_files(roots, session.started)
    assert len(files) > 20, f"only {len(files)} files written: the sweep looks in the wrong places"
    assert any(str(p).startswith(str(session.job_dir)) for p in files)
    hits = _holding(files, session.secrets)
    # Slurm's controller keeps the job's environment (sbatch --export=ALL) until it purges the job:
    # allowed only there, and only private to SlurmUser
    slurm_state = [p for p in hits if p.name == "environment" and "/state/hash." in str(p)]
    for p in slurm_state:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and stat.S_IMODE(p.parent.stat().st_mode) == 0o700, p
    leaks = [p for p in hits if p not in slurm_state]
    assert leaks == [], f"{len(leaks)} of {len(files)} files hold a secret: {leaks[:10]}"
    print(f"{len(files)} files scanned, none holds a secret ({len(slurm_state)} Slurm controller env files, 0600)")
