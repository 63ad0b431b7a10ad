"""Hang forensics in every rank: standard library + torch only (part of the job runtime).

    from cookbook_runtime import hang
    hang.step(step)        # every rank, at every step boundary (the first call starts the watch)

The watch (a daemon thread per rank, on when the job script exports ``COOKBOOK_HANG_DIR``) calls it a hang when no
step ended for ``COOKBOOK_HANG_K`` (default 10) x the median step time, and at least ``COOKBOOK_HANG_MIN_S``
seconds (default 600: a long checkpoint save is no hang; the watch pauses while a rank writes its stop-save,
:func:`pause`); an uncaught collective timeout (gloo's "Timed out waiting") counts too. The first rank that
sees one writes ``HANG`` in that folder. Until then a rank writes nothing there, and the shared folder is asked
about ``HANG`` once a node per poll: local rank 0 looks and mirrors it into a node-local file the node's other
ranks poll. On a hang every rank writes there:

- ``stack_rank_R.txt``: every thread's Python stack (faulthandler; ``py-spy dump``'s native view appended when
  py-spy is installed; ``kill -USR2 PID`` dumps a rank's stack to its stderr by hand),
- ``nccl_trace_rank_R``: PyTorch's flight recorder (the last collectives with their sequence numbers; on NCCL
  torch also writes it itself on a timeout: ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, ``TORCH_FR_DUMP_TEMP_FILE``),
- ``rank_R.json``: host, pid, last step, the recorder's ``pg_status`` (what the verdict reads of every rank).

Then the rank that wrote ``HANG`` ends itself, which ends the job (torchrun and ``srun --kill-on-bad-exit``)
instead of burning its time limit; the batch step asks :func:`culprit` which rank and host never entered the
collective the others wait in, and retries without that node. Values of secret-looking
environment variables (``*TOKEN*``, ``*KEY*``, ``*PASSWORD*``, ``*SECRET*``) are masked in every file written.
``COOKBOOK_HANG_INJECT=RANK:STEP`` makes that rank stall after that step (tests, demos).
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from .decide import dump_wait_seconds
from .files import HANG_DIR_ENV, HANG_TRIGGER, TRACE_PREFIX

TRIGGER = HANG_TRIGGER
__all__ = ["TRACE_PREFIX", "TRIGGER", "culprit", "describe", "install", "load", "mask", "pause", "step"]
HANG_EXIT = 75  # the exit status of the rank that ends a hung job
_SECRET = re.compile(r"TOKEN|KEY|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.I)
# a collective that timed out (gloo: "Timed out waiting 6000ms for recv operation to complete"; NCCL's watchdog),
# not any timeout (a hub download timing out is no hang and no reason to exclude a node)
_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (?:recv|send)|collective operation timeout|Watchdog caught")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of the secret-looking variables in ``environ`` (default: this process's), longest first."""
    env = os.environ if environ is None else environ
    return sorted({v for k, v in env.items() if _SECRET.search(k) and len(v) >= 6}, key=len, reverse=True)


def mask(value: Any, secrets: list[str] | None = None) -> Any:
    """``value`` (a string, or lists/tuples/dicts of them) with every secret value replaced by ``***``."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, "***")
        return value
    if isinstance(value, dict):
        return {mask(k, secrets): mask(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask(v, secrets) for v in value)
    return value


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class HangWatch:
    """One rank's watch: step times, the hang test, the dumps."""

    def __init__(self, folder: str | None = None) -> None:
        folder = folder or os.environ.get(HANG_DIR_ENV)
        self.folder = Path(folder) if folder else None
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.k = _env_float("COOKBOOK_HANG_K", 10.0)
        self.min_seconds = _env_float("COOKBOOK_HANG_MIN_S", 600.0)
        self.poll = _env_float("COOKBOOK_HANG_POLL_S", 2.0)
        inject = os.environ.get("COOKBOOK_HANG_INJECT", "")
        self.inject = tuple(int(x) for x in inject.split(":")[:2]) if re.fullmatch(r"\d+:\d+", inject) else None
        self.last_step, self.last_time = 0, time.monotonic()
        self.durations: deque[float] = deque(maxlen=100)
        self.dumped = False
        self.paused = False  # a checkpoint is being written: no step for a while is no hang
        self._stop = threading.Event()
        if self.folder is None:
            return
        digest = hashlib.sha256(os.path.abspath(self.folder).encode()).hexdigest()[:16]
        self.mark = Path(tempfile.gettempdir()) / f"cookbook-hang-{digest}"  # node-local: HANG seen on this node
        self.started = time.time() - 1  # the mark's mtime may be rounded down to the second
        if threading.current_thread() is threading.main_thread():
            try:
                faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=False)
            except (OSError, ValueError, AttributeError):  # a stderr without a file descriptor: no dump by hand
                pass
        previous = sys.excepthook

        def on_exception(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            if _TIMEOUT.search(str(exc)):
                self.trigger(f"collective timeout on rank {self.rank} ({self.host}): {str(exc)[:200]}")
                self.dump()
                self._await_dumps(dump_wait_seconds(self.world))
            previous(kind, exc, tb)

        sys.excepthook = on_exception
        threading.Thread(target=self._run, name="cookbook-hang-watch", daemon=True).start()

    def step(self, step: int) -> None:
        """A step ended on this rank (every rank calls it at every step boundary)."""
        now = time.monotonic()
        if step > self.last_step and self.last_step:
            self.durations.append((now - self.last_time) / (step - self.last_step))
        self.last_step, self.last_time = step, now
        if self.inject == (self.rank, step):
            print(f"cookbook: injected stall on rank {self.rank} ({self.host}) after step {step}", flush=True)
            while not self._stop.is_set():
                time.sleep(1.0)

    def limit(self) -> float | None:
        """Seconds without a step that make a hang (None until 3 step times are known)."""
        if len(self.durations) < 3:
            return None
        return max(self.k * statistics.median(self.durations), self.min_seconds)

    def trigger(self, reason: str) -> bool:
        """Write ``HANG`` unless a rank did already; True when this rank wrote it."""
        if self.folder is None:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / TRIGGER, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(mask({"rank": self.rank, "host": self.host, "reason": reason, "time": time.time()}), f)
        self._seen()
        print(
            f"cookbook: hang on rank {self.rank} ({self.host}): {mask(reason)}; dumping every rank's stack and "
            f"flight recorder to {self.folder}",
            flush=True,
        )
        return True

    def hung(self) -> bool:
        """A rank declared a hang: the shared ``HANG`` is looked at by local rank 0 only (one look a node per poll),
        which mirrors it into the node-local mark the node's other ranks look at (a mark older than this watch is
        an earlier run's)."""
        with contextlib.suppress(OSError):
            if self.mark.stat().st_mtime >= self.started:
                return True
        if self.local_rank == 0 and self.folder is not None and (self.folder / TRIGGER).exists():
            self._seen()
            return True
        return False

    def _seen(self) -> None:
        with contextlib.suppress(OSError):  # no node-local folder: this rank still dumps
            self.mark.touch()

    def dump(self) -> None:
        """This rank's stack, flight recorder and step into the folder (once)."""
        if self.folder is None or self.dumped:
            return
        self.dumped = True
        secrets = secret_values()
        stack_path = self.folder / f"stack_rank_{self.rank}.txt"  # written on a hang only
        with open(stack_path, "w") as f:
            f.write(f"rank {self.rank} on {self.host}, pid {os.getpid()}, after step {self.last_step}\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        spy = shutil.which("py-spy")
        if spy:
            try:
                out = subprocess.run(
                    [spy, "dump", "--pid", str(os.getpid())], capture_output=True, text=True, timeout=30
                ).stdout
                with open(stack_path, "a") as f:
                    f.write("\npy-spy dump:\n" + out)
            except (OSError, subprocess.SubprocessError):
                pass
        if stack_path.exists():
            _write(stack_path, mask(stack_path.read_text(errors="replace"), secrets).encode())
        trace = _flight_recorder()
        if trace is not None:
            _write(self.folder / f"{TRACE_PREFIX}{self.rank}", pickle.dumps(mask(trace, secrets)))
        meta = {"rank": self.rank, "world_size": self.world, "host": self.host, "pid": os.getpid(),
                "step": self.last_step, "seconds_since_step": round(time.monotonic() - self.last_time, 1),
                "flight_recorder": trace is not None, "time": time.time(),
                "pg_status": (trace or {}).get("pg_status")}  # fmt: skip
        _write(self.folder / f"rank_{self.rank}.json", json.dumps(meta, default=str).encode())

    def _await_dumps(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.folder is not None:
            if len(list(self.folder.glob("rank_*.json"))) >= self.world:
                return
            time.sleep(0.2)

    def _run(self) -> None:
        assert self.folder is not None
        while not self._stop.wait(self.poll):
            if self.dumped:
                return
            if self.paused:
                continue
            if not self.hung():
                limit, idle = self.limit(), time.monotonic() - self.last_time
                if limit is None or idle <= limit:
                    continue
                median = statistics.median(self.durations)
                if not self.trigger(f"no step for {idle:.0f} s after step {self.last_step} "
                                    f"(limit {limit:.0f} s: {self.k:g} x median step {median:.2f} s)"):  # fmt: skip
                    continue
                self.dump()
                self._await_dumps(3 * self.poll + dump_wait_seconds(self.world))
                print(f"cookbook: ending rank {self.rank} so the hung job ends (exit {HANG_EXIT})", flush=True)
                os._exit(HANG_EXIT)
            self.dump()


def _flight_recorder() -> dict[str, Any] | None:
    """PyTorch's flight recorder of this process (NCCL's when CUDA is in use, else the generic one gloo
    records into); None when torch has none or its buffer is off (TORCH_FR_BUFFER_SIZE=0)."""
    try:
        import torch
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    dumpers = []
    if torch.cuda.is_available() and torch.cuda.is_initialized() and hasattr(c10d, "_dump_nccl_trace"):
        dumpers.append(c10d._dump_nccl_trace)
    if hasattr(c10d, "_dump_fr_trace"):
        dumpers.append(c10d._dump_fr_trace)
    for dumper in dumpers:
        try:
            trace = pickle.loads(dumper())
        except Exception:  # noqa: BLE001 (a debug aid must not fail the dump)
            continue
        if trace.get("entries") or trace.get("pg_status"):
            return _name_groups(trace)
    return None


def _name_groups(trace: dict[str, Any]) -> dict[str, Any]:
    """torch 2.13's generic recorder (gloo) keys ``pg_config`` by an empty name while its entries name the group
    ("0", "default_pg"): key it by the entries' names, so torch's own analyzer (``python -m
    torch.distributed.flight_recorder.fr_trace -p nccl_trace_rank_ DIR``) reads our dumps too."""
    config = trace.get("pg_config") or {}
    names = {tuple(e["process_group"]) for e in trace.get("entries", []) if "process_group" in e}
    if "" in config and names:
        blank = config.pop("")
        for name, desc in names:
            config.setdefault(name, {**blank, "name": name, "desc": desc})
    return trace


_WATCH: HangWatch | None = None


def install() -> HangWatch:
    """This rank's watch, started on the first call."""
    global _WATCH
    if _WATCH is None:
        _WATCH = HangWatch()
    return _WATCH


def step(n: int) -> None:
    """Step ``n`` ended on this rank: call at every step boundary on every rank."""
    watch = install()
    watch.paused = False
    watch.step(n)


def pause() -> None:
    """A checkpoint is being written on this rank: the watch waits for the next step (a save is never a hang)."""
    install().paused = True


# ------------------------------------------------------------------------------------------ the analysis


def load(folder: str | os.PathLike[str], ranks: list[int] | None = None) -> dict[str, Any]:
    """What the ranks left in ``folder``: ``trigger`` (dict or None), ``ranks`` ({rank: rank_R.json}) and
    ``stacks`` ({rank: text}) of ``ranks`` only (None: every rank's)."""
    path = Path(folder)
    out: dict[str, Any] = {"trigger": None, "ranks": {}, "stacks": {}}
    if (path / TRIGGER).is_file():
        try:
            out["trigger"] = json.loads((path / TRIGGER).read_text())
        except ValueError:
            out["trigger"] = {}
    for f in path.glob("rank_*.json"):
        try:
            meta = json.loads(f.read_text())
            out["ranks"][int(meta["rank"])] = meta
        except (ValueError, KeyError):
            continue
    for rank in sorted(out["ranks"]) if ranks is None else ranks:
        with contextlib.suppress(OSError):
            out["stacks"][rank] = (path / f"stack_rank_{rank}.txt").read_text(errors="replace")
    return out


def _trace(folder: Path, rank: int) -> dict[str, Any]:
    """One rank's flight recorder dump ({} when it has none, or a truncated one)."""
    try:
        return dict(pickle.loads((folder / f"{TRACE_PREFIX}{rank}").read_bytes()))
    except Exception:  # noqa: BLE001 (a truncated dump: the others still tell)
        return {}


def _statuses(folder: Path, metas: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every dumped rank's ``pg_status``: from its ``rank_R.json``, else (torch's own dump on an NCCL timeout)
    from its recorder dump, the only whole dumps read."""
    out = {r: m["pg_status"] for r, m in metas.items() if m.get("pg_status")}
    for f in folder.glob(f"{TRACE_PREFIX}*"):
        rank = f.name[len(TRACE_PREFIX) :]
        if rank.isdigit() and int(rank) not in out and (status := _trace(folder, int(rank)).get("pg_status")):
            out[int(rank)] = status
    return out


def culprit(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Which rank never entered the collective the others wait in: ``{"ranks": [...], "hosts": [...],
    "seq": N, "op": "gloo:all_reduce", "pg": "0", "waiting": [...], "how": "...", "reason": ...}``.

    From the flight recorders (as torch's fr_trace does): per process group, the first collective sequence number
    that not every member entered; the members whose last entered collective is below it never entered it (a member
    with no dump is named too), the others wait in it. Every rank's ``pg_status`` is read first; the entries only of
    one waiting rank (the collective's name). Without recorder dumps: the ranks behind the others' step."""
    path = Path(folder)
    data = load(path, [])
    status = _statuses(path, data["ranks"])
    hosts = {r: m.get("host", "?") for r, m in data["ranks"].items()}
    world = max([m.get("world_size", 0) for m in data["ranks"].values()] + [len(status)])
    result: dict[str, Any] = {"ranks": [], "hosts": [], "seq": None, "op": None, "pg": None, "waiting": [],
                              "how": "", "reason": (data["trigger"] or {}).get("reason")}  # fmt: skip
    for pg in sorted({pg for s in status.values() for pg in s}):
        entered = {r: s[pg]["last_enqueued_collective"] for r, s in status.items() if pg in s}
        seq = min(entered.values()) + 1  # the first collective of this group that not every member entered
        behind = sorted(r for r in entered if entered[r] < seq)
        waiting = sorted(r for r, n in entered.items() if n >= seq)
        if not waiting and pg == "0":  # every dumped rank entered it: the ranks without a dump are behind
            members = set(range(world)) - set(entered)
            behind, seq = sorted(members), max(entered.values())
            waiting = sorted(entered)
        if not behind or not waiting:
            continue
        op = next(
            (e.get("profiling_name") for e in _trace(path, waiting[0]).get("entries", [])
             if str(e.get("pg_id")) == pg and e.get("collective_seq_id") == seq and not e.get("is_p2p")),
            None,
        )  # fmt: skip
        result.update(ranks=behind, seq=seq, op=op, pg=pg, waiting=waiting, how="flight recorder")
        break
    if not result["ranks"] and data["ranks"]:
        steps = {r: m.get("step", 0) for r, m in data["ranks"].items()}
        missing = sorted(set(range(world)) - set(steps))
        low = min(steps.values())
        behind = sorted(r for r, s in steps.items() if s == low) if len(set(steps.values())) > 1 else []
        if behind or missing:  # the dumps agree on who is behind: a rank without one is not guilty
            result.update(ranks=behind or missing, how="last step behind the others" if behind else "no dump")
    result["hosts"] = sorted({hosts.get(r, "?") for r in result["ranks"]} - {"?"})
    return result


def describe(found: dict[str, Any]) -> str:
    """One line saying which rank and host hung and where."""
    if not found["ranks"]:
        return "hang: the rank at fault could not be told (" + (found["reason"] or "no dumps") + ")"
    who = ", ".join(f"rank {r}" for r in found["ranks"]) + f" on {','.join(found['hosts']) or '?'}"
    if found["seq"] is None:
        return f"hang: {who} ({found['how']})"
    ranks = ",".join(map(str, found["waiting"]))
    return (f"hang: {who} never entered collective #{found['seq']} ({found['op'] or '?'}, process group "
            f"{found['pg']}) that rank(s) {ranks} wait in")  # fmt: skip


def main(argv: list[str]) -> int:
    """``python -m cookbook_runtime.hang culprit DIR``: one line ``NODES<TAB>what hung``."""
    if len(argv) != 2 or argv[0] != "culprit":
        print("usage: python -m cookbook_runtime.hang culprit DIR", file=sys.stderr)
        return 2
    found = culprit(argv[1])
    print(f"{','.join(found['hosts'])}\t{mask(describe(found))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
