"""The embedded default: a real Slurm cluster (Debian slurmctld/slurmd/munge) on this one machine.

Each compute node ``n1..nN`` is a ``slurmd`` in its own network namespace (own address on a
bridge, own hostname, own ``/etc/hosts``), so a multi-node job sees distinct hostnames and real
TCP between nodes, exactly what torchrun's rendezvous needs. Where network namespaces are not
allowed, the nodes fall back to several ``slurmd`` on 127.0.0.1 with their own hostnames.

Everything (config, state, logs, munge key, pid files) lives under one git-ignored folder.
``up`` is idempotent and repairs a cluster whose daemons died without ``down``; ``down`` stops
only what ``up`` started, by PID, and kills job processes left in the nodes' namespaces.

GPU-shaped nodes (``cookbook cluster up --gpus-per-node 8``, the preset ``gpu`` in ``PRESETS``) let the
GPU profiles' scripts be accepted and run as written (``--gpus-per-node=8 --exclusive --signal=B:USR1@N
--requeue --cpus-per-task=16..128 --mem=...``). Each node claims 192 CPUs and 1.8 TiB
(``SlurmdParameters=config_overrides`` lets slurmd claim more than the machine has) and 8 fake GPUs: Slurm
22.05 drops count-only GPUs (the node drains "gres/gpu count reported lower than configured") and sets no
``CUDA_VISIBLE_DEVICES`` for regular files, so each GPU is a character device ``<root>/dev/nvidiaI``
(``mknod c 195 I``, made before the nodes' namespaces; nothing opens them), declared in ``gres.conf`` with
``AutoDetect=off`` and ``GresTypes=gpu``. A step then sees ``CUDA_VISIBLE_DEVICES=0,...,7``,
``SLURM_GPUS_ON_NODE=8``, ``SLURM_STEP_GPUS`` and ``SLURM_JOB_GPUS``.

The preset ``gpu`` runs beside the shared CPU cluster ``cookbook`` (both up at once):

    ============  ==========  =========  ==========  ===========  ==========================
    name          subnet      ctld_port  slurmd_port multi_port0  state / SLURM_CONF
    ============  ==========  =========  ==========  ===========  ==========================
    cookbook      10.77.0     6817       6818        17000        .cluster/cookbook/etc/...
    gpu           10.79.0     7017       7018        17300        .cluster/gpu/etc/slurm.conf
    ============  ==========  =========  ==========  ===========  ==========================

(tests' private clusters use 10.78.0 / 6917 / 17100 and 6927 / 17200; ``cookbook cluster env --name gpu``
prints the ``export SLURM_CONF=`` line for the GPU cluster.)

CPU binding: nodes run ``TaskPlugin=task/none`` by default, so a task is not pinned and the CPUs Slurm
gave a step's task are read from Slurm itself (``STEP_CPUS_SNIPPET``). ``cpu_bind=True`` switches to
``task/affinity`` with ``TaskPluginParam=Cores``, which pins each task to its ``--cpus-per-task`` cores for
real; it needs nodes claiming no more CPUs than the machine has (with more, every mask folds onto the
real cores, and a step asking more cores than exist fails "Unable to layout tasks on given cpus").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cookbook.paths import project_root

Mode = Literal["auto", "netns", "multi"]
DEBIAN_PACKAGES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "munged": "munge",
    "ip": "iproute2",
    "nsenter": "util-linux",
}
_SBIN = ("/usr/sbin", "/sbin")


#: Named clusters that can run side by side with the shared CPU cluster ``cookbook`` (own subnet, ports).
PRESETS: dict[str, dict] = {
    # 8 nodes: four 2-node GPU jobs run at once (the rehearsal test submits dozens)
    "gpu": {
        "nodes": 8,
        "gpus_per_node": 8,
        "cpus_per_node": 192,
        "mem_mb_per_node": 1_843_200,
        "subnet": "10.79.0",
        "ctld_port": 7017,
        "slurmd_port": 7018,
        "multi_port0": 17300,
    },
    # 3 CPU nodes: a 2-node job that excludes one node and still runs (the pre-flight gate, NODE_FAIL retry);
    # KillWait 60 s, as a site that gives a TERM's stop-save its time (the shared cluster's 5 s does not);
    # host names ip-10-83-0-N that differ from the NodeNames, which do not resolve (the head address's test)
    "nodes3": {
        "aws_host_names": True,
        "nodes": 3,
        "subnet": "10.83.0",
        "ctld_port": 7317,
        "slurmd_port": 7318,
        "multi_port0": 17900,
        "kill_wait": 60,
    },
}
GPU_DEVICE_MAJOR = 195  # the NVIDIA driver's character-device major; nothing opens these files


class ClusterError(RuntimeError):
    """The local cluster could not be started, with what to do about it."""


@dataclass(frozen=True)
class ClusterConfig:
    """What a local cluster looks like. Instances with different names can run side by side."""

    name: str = "cookbook"
    nodes: int = 2
    cpus_per_node: int = field(default_factory=lambda: max(8, os.cpu_count() or 2))  # virtual CPUs: jobs share cores
    mode: Mode = "auto"
    subnet: str = "10.77.0"  # netns mode: node i gets .i, the host bridge .254
    ctld_port: int = 6817
    slurmd_port: int = 6818  # netns mode: the same port inside every node namespace
    multi_port0: int = 17000  # multi mode: node i listens on multi_port0 + i
    base_dir: Path | None = None  # default: <project>/.cluster/<name>
    gpus_per_node: int = 0  # fake GPUs (character devices under <root>/dev) advertised as gres/gpu
    mem_mb_per_node: int | None = None  # claimed RealMemory; default: 80 % of this machine's memory / nodes
    cpu_bind: bool = False  # TaskPlugin=task/affinity (tasks pinned to real cores) instead of task/none
    kill_wait: int = 5  # seconds between TERM and KILL (scancel, the time limit): a short one keeps tests quick
    # netns mode: node i's host name is ip-<its address with dashes>, as on AWS, and its NodeName (n<i>) resolves
    # nowhere inside jobs (ParallelCluster without managed DNS; NodeAddr= sites): nothing may look NodeNames up
    aws_host_names: bool = False

    @classmethod
    def named(cls, name: str, **overrides) -> ClusterConfig:
        """The preset called ``name`` (see ``PRESETS``; any other name: the defaults) with ``overrides``."""
        return cls(**{"name": name, **PRESETS.get(name, {}), **{k: v for k, v in overrides.items() if v is not None}})

    @property
    def root(self) -> Path:
        return Path(self.base_dir) if self.base_dir else project_root() / ".cluster" / self.name

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def host_name(self, i: int) -> str:
        """Node ``n<i>``'s host name (netns mode)."""
        return f"ip-{self.subnet.replace('.', '-')}-{i}" if self.aws_host_names else f"n{i}"

    @property
    def netns_prefix(self) -> str:
        return f"{self.name[:6]}-"  # interface names are limited to 15 characters


@dataclass
class ClusterStatus:
    """What is running now."""

    conf: Path
    mode: str
    daemons: dict[str, int | None]
    nodes: list[tuple[str, str]]  # (node, state) from sinfo
    up: bool

    def render(self) -> str:
        lines = [f"SLURM_CONF={self.conf}", f"mode={self.mode}", "daemons:"]
        lines += [f"  {n:<14} {'pid ' + str(p) if p else 'not running'}" for n, p in self.daemons.items()]
        lines += ["nodes:"] + [f"  {n:<6} {s}" for n, s in self.nodes]
        return "\n".join(lines)


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def _which(cmd: str) -> str | None:
    return shutil.which(cmd, path=os.environ.get("PATH", "") + ":" + ":".join(_SBIN))


def _run(args: list[str], check: bool = True, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    exe = _which(args[0]) or args[0]
    return subprocess.run([exe, *args[1:]], check=check, capture_output=True, text=True, env=env, **kw)


def _pid_alive(pid_file: Path, expect: str) -> int | None:
    """PID from ``pid_file`` if that process runs and its command line names ``expect``."""
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError, IndexError):
        return None
    return pid if expect in cmdline else None


def _wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _port_free(port: int) -> bool:
    """No socket listens on ``port`` on any address (a bind test would pass beside SO_REUSEADDR listeners)."""
    r = _run(["ss", "-Hltn", f"sport = :{port}"], check=False)
    return r.returncode == 0 and not r.stdout.strip()


class LocalCluster:
    """Start, inspect and stop one local Slurm cluster."""

    def __init__(self, config: ClusterConfig | None = None):
        self.cfg = config or ClusterConfig()
        r = self.cfg.root
        self.etc, self.run_dir, self.log_dir = r / "etc", r / "run", r / "log"
        self.munge_dir = r / "munge"
        self.munge_socket = self.munge_dir / "munge.socket.2"
        self.settings_file = self.run_dir / "settings.json"

    # ------------------------------------------------------------------ public
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients of this cluster."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.cfg.conf),
            "PATH": os.environ.get("PATH", "") + ":" + ":".join(_SBIN),
        }

    def env_line(self) -> str:
        return f"export SLURM_CONF={self.cfg.conf}"

    def up(self) -> ClusterStatus:
        """Bring the cluster up; a no-op for the parts already running."""
        self._check_prerequisites()
        for d in (
            self.etc,
            self.run_dir,
            self.log_dir,
            self.cfg.root / "state",
            self.cfg.root / "spool",
            self.munge_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.munge_dir, 0o700)
        self._make_gpu_devices()  # before any node namespace exists
        self._start_munge()
        settings = self._settings_of_running() or self._configure()
        asked = {"nodes": self.cfg.nodes, "gpus_per_node": self.cfg.gpus_per_node}
        kept = {k: settings.get(k, 0) for k in asked}
        if kept != asked:
            _log(f"already running with {kept}, kept; `cookbook cluster down --name {self.cfg.name}` first to change")
        if settings["mode"] == "netns":
            self._plumb_netns(settings)
        self._start_slurmctld()
        for node in self.cfg.node_names[: settings["nodes"]]:
            self._start_slurmd(node, settings)
        self._wait_nodes_usable(settings["nodes"])
        return self.status()

    def down(self, purge: bool = False) -> None:
        """Stop every daemon ``up`` started (by PID), job processes, namespaces and bridge."""
        if self._pid("slurmctld"):
            self._cancel_all_jobs()
        self._stop_pid("slurmctld", self.run_dir / "slurmctld.pid", "slurmctld")
        for pid_file in sorted(self.run_dir.glob("slurmd-*.pid")):
            node = pid_file.stem.removeprefix("slurmd-")
            self._stop_pid(f"slurmd {node}", pid_file, "slurmd")
            self._kill_namespace_leftovers(node)
            pid_file.unlink(missing_ok=True)
        self._stop_pid("munged", self.munge_dir / "munged.pid", "munged")
        self._remove_netns()
        if purge and self.cfg.root.exists():
            shutil.rmtree(self.cfg.root)
            _log(f"removed {self.cfg.root}")

    def status(self) -> ClusterStatus:
        settings = self._read_settings() or {}
        daemons = {"munged": self._pid("munged"), "slurmctld": self._pid("slurmctld")}
        for node in self.cfg.node_names[: settings.get("nodes", self.cfg.nodes)]:
            daemons[f"slurmd {node}"] = self._pid(f"slurmd {node}")
        nodes: list[tuple[str, str]] = []
        if daemons["slurmctld"]:
            r = _run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, env=self.env(), timeout=30)
            nodes = [tuple(line.split(None, 1)) for line in r.stdout.splitlines() if line.strip()]  # type: ignore[misc]
        up = all(daemons.values()) and bool(nodes) and all(_usable(s) for _, s in nodes)
        return ClusterStatus(self.cfg.conf, settings.get("mode", "-"), daemons, nodes, up)

    # ------------------------------------------------------------------ checks
    def _check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError(
                "The embedded local cluster needs root (it starts munged, slurmctld and one slurmd per "
                "node in their own network namespaces) and the Debian packages "
                f"{', '.join(sorted(set(DEBIAN_PACKAGES.values())))}. Run `sudo make cluster-up` (it installs "
                "them and starts the cluster) or use a machine where you are root. On a real Slurm cluster you "
                "need none of this: skip "
                "`cookbook cluster up` and use the cluster's own SLURM_CONF."
            )
        missing = sorted({pkg for cmd, pkg in DEBIAN_PACKAGES.items() if not _which(cmd)})
        if not missing:
            return
        if not _which("apt-get"):
            raise ClusterError(
                f"Missing Slurm programs (Debian packages {' '.join(missing)}) and no apt-get "
                "to install them. Install Slurm 22.05+ and munge, or use a real cluster."
            )
        _log(f"installing Debian packages: {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        r = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise ClusterError(f"apt-get install {' '.join(missing)} failed:\n{r.stderr[-2000:]}")

    # ------------------------------------------------------------------ munge
    def _start_munge(self) -> None:
        key = self.munge_dir / "munge.key"
        if not key.exists() or key.stat().st_size == 0:
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        if not self._pid("munged"):
            for stale in (self.munge_socket, Path(f"{self.munge_socket}.lock"), self.munge_dir / "munged.pid"):
                stale.unlink(missing_ok=True)
            _run(
                [
                    "munged",
                    f"--key-file={key}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={self.munge_dir / 'munged.pid'}",
                    f"--log-file={self.munge_dir / 'munged.log'}",
                    f"--seed-file={self.munge_dir / 'munged.seed'}",
                    "--force",
                ]
            )
            _log(f"munged started (pid {self._pid('munged')})")

        def munge_ok() -> bool:
            cred = _run(["munge", "-n", "-S", str(self.munge_socket)], check=False)
            return (
                cred.returncode == 0
                and _run(["unmunge", "-S", str(self.munge_socket)], check=False, input=cred.stdout).returncode == 0
            )

        if not _wait_for(munge_ok, 20):
            raise ClusterError(f"munged does not answer on {self.munge_socket}; see {self.munge_dir}/munged.log")

    # ------------------------------------------------------------------ configuration
    def _read_settings(self) -> dict | None:
        try:
            import json

            return json.loads(self.settings_file.read_text())
        except (OSError, ValueError):
            return None

    def _settings_of_running(self) -> dict | None:
        """Settings of the daemons already running, which a new ``up`` must not change."""
        running = self._pid("slurmctld") or any(self._pid(f"slurmd {n}") for n in self.cfg.node_names)
        return self._read_settings() if running else None

    def _choose_mode(self) -> str:
        if self.cfg.mode != "auto":
            return self.cfg.mode
        probe = f"{self.cfg.netns_prefix}probe"
        ok = _run(["ip", "netns", "add", probe], check=False).returncode == 0
        if ok:
            _run(["ip", "netns", "del", probe], check=False)
            ok = _run(["unshare", "--mount", "--uts", "true"], check=False).returncode == 0
        return "netns" if ok else "multi"

    def _configure(self) -> dict:
        """Write slurm.conf, gres.conf, the nodes' hosts file, the settings and env.sh; return the settings."""
        import json

        mode = self._choose_mode()
        cfg = self.cfg
        if not _port_free(cfg.ctld_port):
            raise ClusterError(
                f"port {cfg.ctld_port} (slurmctld) is in use by another program; "
                "pass another ClusterConfig(ctld_port=...)"
            )
        cpu = self._node_resources()
        self._write_gres_conf()
        ctld_addr, nodes, hosts = self._node_lines(mode, cpu)
        (self.etc / "hosts.nodes").write_text("\n".join(hosts) + "\n")
        cfg.conf.write_text(self._slurm_conf(mode, ctld_addr, nodes))
        settings = {
            "mode": mode,
            "nodes": cfg.nodes,
            "subnet": cfg.subnet,
            "ctld_addr": ctld_addr,
            "gpus_per_node": cfg.gpus_per_node,
            "cpus_per_node": cfg.cpus_per_node,
        }
        self.settings_file.write_text(json.dumps(settings))
        (cfg.root / "env.sh").write_text(self.env_line() + "\n")
        _log(f"wrote {cfg.conf} (mode={mode}, nodes={cfg.nodes}, cpus/node={cfg.cpus_per_node})")
        return settings

    def _node_resources(self) -> str:
        """What each node claims: CPUs (one socket's cores), memory (default: 80 % of RAM / nodes), fake GPUs."""
        cfg = self.cfg
        mem_mb = cfg.mem_mb_per_node or int(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8 / cfg.nodes
        )
        gres = f" Gres=gpu:{cfg.gpus_per_node}" if cfg.gpus_per_node else ""
        return (
            f"CPUs={cfg.cpus_per_node} Boards=1 SocketsPerBoard=1 CoresPerSocket={cfg.cpus_per_node} "
            f"ThreadsPerCore=1 RealMemory={mem_mb}{gres} State=UNKNOWN"
        )

    def _node_lines(self, mode: str, cpu: str) -> tuple[str, str, list[str]]:
        """slurmctld's address, the ``NodeName=`` lines and the nodes' hosts file for ``mode``."""
        cfg = self.cfg
        if mode == "netns":
            ctld_addr = f"{cfg.subnet}.254"
            nodes = "\n".join(f"NodeName=n{i} NodeAddr={cfg.subnet}.{i} {cpu}" for i in range(1, cfg.nodes + 1))
            hosts = ["127.0.0.1 localhost", f"{ctld_addr} {socket.gethostname()} slurmctld-host"]
            hosts += [f"{cfg.subnet}.{i} {cfg.host_name(i)}" for i in range(1, cfg.nodes + 1)]
        else:
            ctld_addr = "127.0.0.1"
            nodes = (
                f"NodeName=n[1-{cfg.nodes}] NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
                f"Port=[{cfg.multi_port0 + 1}-{cfg.multi_port0 + cfg.nodes}] {cpu}"
            )
            base_hosts = [ln for ln in Path("/etc/hosts").read_text().splitlines() if ln.strip()]
            hosts = base_hosts + ["127.0.0.1 " + " ".join(cfg.node_names)]
        return ctld_addr, nodes, hosts

    def _slurm_conf(self, mode: str, ctld_addr: str, nodes: str) -> str:
        """slurm.conf's text: this cluster's ports, folders, plugins and the ``nodes`` lines."""
        cfg, r = self.cfg, self.cfg.root
        gpus = f", gpus/node={cfg.gpus_per_node}" if cfg.gpus_per_node else ""
        task = "TaskPlugin=task/none"
        if cfg.cpu_bind:  # pin each task to its --cpus-per-task cores (needs CPUs <= real cores, see above)
            task = "TaskPlugin=task/affinity\nTaskPluginParam=Cores"
        if cfg.gpus_per_node:
            task += "\nGresTypes=gpu"
        return f"""\
# Written by `cookbook cluster up` (mode={mode}, nodes={cfg.nodes}, cpus/node={cfg.cpus_per_node}{gpus}).
ClusterName={cfg.name}
SlurmctldHost=localhost({ctld_addr})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={cfg.ctld_port}
SlurmdPort={cfg.slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/slurmd-%n
SlurmctldPidFile={self.run_dir}/slurmctld.pid
SlurmdPidFile={self.run_dir}/slurmd-%n.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
SlurmdLogFile={self.log_dir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track job processes through /proc.
ProctrackType=proctrack/linuxproc
{task}
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
# Reject jobs that can never run instead of leaving them pending forever.
EnforcePartLimits=ALL
ReturnToService=2
KillWait={cfg.kill_wait}
MinJobAge=600
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
JobRequeue=1
JobCompType=jobcomp/filetxt
JobCompLoc={self.log_dir}/jobcomp.txt
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def gpu_devices(self) -> list[Path]:
        """The fake GPUs' device files, one per GPU index (the same files serve every node)."""
        return [self.cfg.root / "dev" / f"nvidia{i}" for i in range(self.cfg.gpus_per_node)]

    def _make_gpu_devices(self) -> None:
        """Character devices for gres/gpu: slurmd drops count-only GPUs (the node then drains with "gres/gpu
        count reported lower than configured") and sets no CUDA_VISIBLE_DEVICES for regular files."""
        for i, dev in enumerate(self.gpu_devices()):
            dev.parent.mkdir(parents=True, exist_ok=True)
            if dev.exists() and not dev.is_char_device():
                dev.unlink()
            if not dev.exists():
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(GPU_DEVICE_MAJOR, i))
                dev.chmod(0o666)  # mknod's mode passes through the umask

    def _write_gres_conf(self) -> None:
        gres_conf = self.etc / "gres.conf"
        if not self.cfg.gpus_per_node:
            gres_conf.unlink(missing_ok=True)
            return
        last = self.cfg.gpus_per_node - 1
        files = self.cfg.root / "dev" / (f"nvidia[0-{last}]" if last else "nvidia0")
        nodes = f"n[1-{self.cfg.nodes}]" if self.cfg.nodes > 1 else "n1"
        gres_conf.write_text(
            f"# Written by `cookbook cluster up`: fake GPUs, character devices (major "
            f"{GPU_DEVICE_MAJOR}) nothing opens.\nAutoDetect=off\n"
            f"NodeName={nodes} Name=gpu File={files}\n"
        )

    # ------------------------------------------------------------------ network namespaces
    def processes_on(
        self, node: str, needle: str, unless: tuple[str, ...] = ("cookbook_runtime.run", "cookbook_runtime.launch")
    ) -> list[int]:
        """PIDs in ``node``'s network namespace whose command line holds ``needle`` and none of ``unless`` (a job's
        ranks on one node, not its batch step or launcher, whose modules the ranks' programs sit beside): what a
        test kills to crash that node's share of a job."""
        pids = _run(["ip", "netns", "pids", self._ns(node)], check=False).stdout.split()
        out = []
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in argv and not any(u in argv for u in unless):
                out.append(int(pid))
        return out

    def _ns(self, node: str) -> str:
        return f"{self.cfg.netns_prefix}{node}"

    def _bridge(self) -> str:
        return f"{self.cfg.netns_prefix}br"

    def _plumb_netns(self, settings: dict) -> None:
        br, subnet = self._bridge(), settings["subnet"]
        if _run(["ip", "link", "show", br], check=False).returncode != 0:
            _run(["ip", "link", "add", br, "type", "bridge"])
        if f"{subnet}.254/" not in _run(["ip", "-o", "addr", "show", "dev", br], check=False).stdout:
            _run(["ip", "addr", "add", f"{subnet}.254/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        for i, node in enumerate(self.cfg.node_names[: settings["nodes"]], start=1):
            ns, veth = self._ns(node), f"{self.cfg.netns_prefix}v{i}"
            if not Path(f"/run/netns/{ns}").exists():
                _run(["ip", "netns", "add", ns])
            if _run(["ip", "-n", ns, "link", "show", "eth0"], check=False).returncode != 0:
                _run(["ip", "link", "del", veth], check=False)
                _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
                _run(["ip", "link", "set", veth, "master", br, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{subnet}.{i}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _remove_netns(self) -> None:
        for ns_file in sorted(Path("/run/netns").glob(f"{self.cfg.netns_prefix}n*")):
            ns = ns_file.name
            for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                _kill(int(pid), signal.SIGKILL)
            _run(["ip", "netns", "del", ns], check=False)
            _log(f"deleted network namespace {ns}")
        if _run(["ip", "link", "show", self._bridge()], check=False).returncode == 0:
            _run(["ip", "link", "del", self._bridge()], check=False)
            _log(f"deleted bridge {self._bridge()}")
        # The kernel removes a deleted namespace's veth peers asynchronously: wait for them to go.
        if not _wait_for(lambda: not self._own_links(), 10, 0.1):
            for link in self._own_links():
                _run(["ip", "link", "del", link], check=False)

    def _own_links(self) -> list[str]:
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
        names = [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
        return [n for n in names if n.startswith(self.cfg.netns_prefix)]

    # ------------------------------------------------------------------ daemons
    def _pid(self, daemon: str) -> int | None:
        if daemon == "munged":
            return _pid_alive(self.munge_dir / "munged.pid", "munged")
        if daemon == "slurmctld":
            return _pid_alive(self.run_dir / "slurmctld.pid", "slurmctld")
        node = daemon.split()[-1]
        return _pid_alive(self.run_dir / f"slurmd-{node}.pid", "slurmd")

    def _start_slurmctld(self) -> None:
        if not self._pid("slurmctld"):
            (self.run_dir / "slurmctld.pid").unlink(missing_ok=True)
            _run(["slurmctld", "-i"], env=self.env())
            _log("slurmctld started")
        ping = lambda: _run(["scontrol", "ping"], check=False, env=self.env(), timeout=30).returncode == 0  # noqa: E731
        if not _wait_for(ping, 60):
            raise ClusterError(f"slurmctld does not answer; see {self.log_dir}/slurmctld.log")

    def _start_slurmd(self, node: str, settings: dict) -> None:
        pid_file = self.run_dir / f"slurmd-{node}.pid"
        if self._pid(f"slurmd {node}"):
            return
        pid_file.unlink(missing_ok=True)
        (self.cfg.root / "spool" / f"slurmd-{node}").mkdir(parents=True, exist_ok=True)
        # Own mount + UTS namespace: its host name, and /etc/hosts replaced by a bind mount so node
        # names resolve inside jobs. The host's /etc/hosts is never modified.
        slurmd = _which("slurmd")
        host = self.cfg.host_name(int(node[1:])) if settings["mode"] == "netns" else node
        inner = f"hostname {host} && mount --bind {self.etc / 'hosts.nodes'} /etc/hosts && exec {slurmd} -N {node}"
        unshare = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", inner]
        if settings["mode"] == "netns":
            # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails.
            cmd = ["nsenter", f"--net=/run/netns/{self._ns(node)}", *unshare]
        else:
            cmd = unshare
        _run(cmd, env=self.env())
        if not _wait_for(lambda: self._pid(f"slurmd {node}") is not None, 20):
            raise ClusterError(f"slurmd {node} did not start; see {self.log_dir}/slurmd-{node}.log")
        pid = self._pid(f"slurmd {node}")
        (self.run_dir / f"slurmd-{node}.mntns").write_text(os.readlink(f"/proc/{pid}/ns/mnt"))
        _log(f"slurmd {node} started (pid {pid})")

    def _wait_nodes_usable(self, n: int) -> None:
        def ok() -> bool:
            r = _run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, env=self.env(), timeout=30)
            states = [line.split()[-1] for line in r.stdout.splitlines() if line.strip()]
            if any(s.rstrip("*").startswith(("down", "drain")) for s in states):
                # A node marked down by a previous crash comes back with an explicit resume.
                _run(["scontrol", "update", f"NodeName=n[1-{n}]", "State=RESUME"], check=False, env=self.env())
            return len(states) >= n and all(_usable(s) for s in states)

        if not _wait_for(ok, 60, interval=0.5):
            info = _run(["sinfo", "-N", "-l"], check=False, env=self.env()).stdout
            raise ClusterError(f"nodes not usable after 60 s:\n{info}\nlogs: {self.log_dir}")

    def _cancel_all_jobs(self) -> None:
        r = _run(["squeue", "-h", "-o", "%i"], check=False, env=self.env(), timeout=30)
        ids = r.stdout.split()
        if not ids:
            return
        _log(f"cancelling jobs {' '.join(ids)}")
        _run(["scancel", *ids], check=False, env=self.env())
        _wait_for(lambda: not _run(["squeue", "-h", "-o", "%i"], check=False, env=self.env()).stdout.strip(), 20)

    def _stop_pid(self, name: str, pid_file: Path, expect: str) -> None:
        pid = _pid_alive(pid_file, expect)
        if pid:
            _kill(pid, signal.SIGTERM)
            if not _wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 15, 0.1):
                _kill(pid, signal.SIGKILL)
            _log(f"stopped {name} (pid {pid})")
        pid_file.unlink(missing_ok=True)

    def _kill_namespace_leftovers(self, node: str) -> None:
        """Kill job processes (slurmstepd, tasks) still living in a node's private mount namespace."""
        mnt_file = self.run_dir / f"slurmd-{node}.mntns"
        mnt = mnt_file.read_text().strip() if mnt_file.exists() else ""
        if mnt and mnt not in _host_mount_namespaces():
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    try:
                        if os.readlink(proc / "ns" / "mnt") == mnt:
                            _kill(int(proc.name), signal.SIGKILL)
                    except OSError:
                        continue
        mnt_file.unlink(missing_ok=True)


def _host_mount_namespaces() -> set[str]:
    """Mount namespaces that are not a node's own (never kill processes in those)."""
    found = set()
    for pid in ("1", "self"):
        try:
            found.add(os.readlink(f"/proc/{pid}/ns/mnt"))
        except OSError:
            continue
    return found


def _usable(state: str) -> bool:
    return state.rstrip("*~#") in {"idle", "mixed", "allocated", "completing"}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


#: Bash, run inside an ``srun`` step (one line per task): the CPUs this task was given. It prints
#: ``step_cpus host=H slurm_cpus_per_task=N affinity=M job_cpus_per_task=J`` where N is what Slurm allocated
#: to each task of this step (``TresPerTask=cpu:N`` of ``scontrol show step``, 1 when absent: what
#: task/affinity pins the task to), M the CPUs the kernel lets the task run on (``Cpus_allowed_list``) and J
#: the job's ``--cpus-per-task``. Since Slurm 22.05 (until 23.11) a plain ``srun`` does not inherit the
#: job's ``--cpus-per-task``: N=1 where J=16; ``srun --cpus-per-task=$SLURM_CPUS_PER_TASK`` gives N=J.
#: Safe under ``set -euo pipefail``; needs only scontrol, sed, awk.
STEP_CPUS_SNIPPET = r"""n=$(scontrol show step -o "${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}" 2>/dev/null \
  | sed -n 's/.*TresPerTask=[^ ]*cpu[:=]\([0-9][0-9]*\).*/\1/p' || true)
aff=$(awk '/^Cpus_allowed_list:/ { n = 0; k = split($2, r, ","); for (i = 1; i <= k; i++) {
  m = split(r[i], b, "-"); n += (m == 2 ? b[2] - b[1] + 1 : 1) } print n }' /proc/self/status)
echo "step_cpus host=$(hostname) slurm_cpus_per_task=${n:-1} affinity=${aff:-0}" \
  "job_cpus_per_task=${SLURM_CPUS_PER_TASK:-1}"
"""


@dataclass(frozen=True)
class StepCpus:
    """One task's line from ``STEP_CPUS_SNIPPET``."""

    host: str
    slurm_cpus_per_task: int  # CPUs Slurm gave this task (what CPU binding pins it to)
    affinity: int  # CPUs the kernel lets it run on now
    job_cpus_per_task: int  # the job's --cpus-per-task

    @property
    def short(self) -> bool:
        """The task got fewer CPUs than the job asked for (srun did not pass --cpus-per-task)."""
        return self.slurm_cpus_per_task < self.job_cpus_per_task


def parse_step_cpus(text: str) -> list[StepCpus]:
    """Every ``step_cpus`` line in ``text`` (a job's output), in order."""
    found = []
    for line in text.splitlines():
        if line.startswith("step_cpus "):
            kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            found.append(
                StepCpus(kv["host"], int(kv["slurm_cpus_per_task"]), int(kv["affinity"]), int(kv["job_cpus_per_task"]))
            )
    return found
