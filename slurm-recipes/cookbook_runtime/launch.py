"""``python3 -m cookbook_runtime.launch torchrun|tune run ARGS``: one node's launcher, shielded from the stop
signals so that only the ranks act on them.

Slurm sends USR1 (``scancel --signal=USR1``) and TERM (the time limit, ``scancel``, a preemption) to every
process of the job. torchrun's agent answers TERM by tearing its workers down (SIGTERM, then SIGKILL after
30 s), which would cut a large stop-save short. Here the launcher ignores both signals, and keeps ignoring
them when torchrun installs its own handlers; the workers it starts install the runtime's handlers
(:class:`cookbook_runtime.rank.StopRequest`), save at the next step boundary and exit 0, and the launcher
ends with them. SIGKILL (``KillWait`` after TERM) still ends everything.

torchrun's per-rank output files (``--tee``) go to node-local storage (``$TMPDIR``); when torchrun ends, they are
copied into one file a node on the run folder (:func:`keep_rank_logs`): files on the shared filesystem per start
are per node, not per rank. A node killed outright keeps its ranks' files in its ``$TMPDIR/cookbook-ranks-*``.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import files, telemetry

SHIELDED = (signal.SIGUSR1, signal.SIGTERM)
_ENTRY = {"torchrun": "torch.distributed.run", "tune": "torchtune._cli.tune"}


def shield() -> None:
    """Ignore the stop signals in this process and refuse later handlers for them (torchrun's agent
    installs one for TERM); the ignored disposition passes to the workers, whose own handlers replace it."""
    for sig in SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    original: Callable[..., Any] = signal.signal

    def keep_ignored(sig: int, handler: Any) -> Any:
        if sig in SHIELDED:
            return signal.SIG_IGN
        return original(sig, handler)

    signal.signal = keep_ignored  # type: ignore[assignment]


def signal_names(error: BaseException) -> list[str]:
    """The signals that ended this node's ranks, from torchrun's ``ChildFailedError`` (its ``failures``: rank ->
    ``ProcessFailure`` with a negative ``exitcode`` for a signal); [] for anything else."""
    out = []
    for failure in (getattr(error, "failures", None) or {}).values():
        code = getattr(failure, "exitcode", 0)
        if isinstance(code, int) and code < 0:
            try:
                out.append(signal.Signals(-code).name)
            except ValueError:
                out.append(f"signal {-code}")
    return out


def record_exits(error: BaseException) -> None:
    """How this node's ranks ended, for the batch step's culprit (``COOKBOOK_EXITS_DIR/<node>.json``); best
    effort: a launcher never fails for its record."""
    folder = os.environ.get(files.EXITS_DIR_ENV)
    if not folder or not getattr(error, "failures", None):
        return
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    record = {"node": node, "signals": signal_names(error), "at": time.time(), "error": type(error).__name__}
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{node}.json"), "w") as f:
            json.dump(record, f)
    except OSError:
        pass


def keep_rank_logs(local: Path) -> None:
    """This node's ranks' output files (torchrun's ``<id>/attempt_N/<local rank>/std{out,err}.log`` under ``local``)
    appended to ``$COOKBOOK_RANK_LOGS_DIR/<node>.log``, each after a ``==> PATH <==`` line; best effort."""
    folder = os.environ.get(files.RANK_LOGS_ENV)
    logs = sorted(
        local.glob("*/attempt_*/*/std*.log"), key=lambda p: (p.parent.parent.name, int(p.parent.name), p.name)
    )
    try:
        if folder and logs:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{telemetry.node_name()}.log"), "ab") as out:
                for path in logs:
                    out.write(f"==> {path.relative_to(local)} <==\n".encode())
                    with open(path, "rb") as f:
                        shutil.copyfileobj(f, out)
        if folder:  # kept: the node-local copy goes
            shutil.rmtree(local, ignore_errors=True)
    except OSError as e:
        print(f"cookbook: could not keep the ranks' output of {local} in {folder}: {e}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _ENTRY:
        sys.exit(f"usage: python3 -m cookbook_runtime.launch {{{'|'.join(_ENTRY)}}} ARGS (got {' '.join(argv[:2])})")
    shield()
    words = 2 if argv[0] == "tune" else 1  # torchrun's flags follow ``torchrun`` / ``tune run``
    local = Path(tempfile.mkdtemp(prefix="cookbook-ranks-"))  # node-local: one file a node reaches the run folder
    sys.argv = [*argv[:words], f"--log-dir={local}", *argv[words:]]
    sampler = telemetry.start_from_env()  # this node's GPUs and NICs beside the launcher, until it ends
    try:
        runpy.run_module(_ENTRY[argv[0]], run_name="__main__", alter_sys=True)
    except BaseException as e:
        record_exits(e)
        raise
    finally:
        if sampler:
            sampler.set()
        keep_rank_logs(local)


if __name__ == "__main__":
    main()
