"""Save on preemption: the rank side of the job runtime's stop protocol (standard library + torch only).

Every training loop the cookbook runs (our FSDP script, the torchtitan trainer wrapper, the torchtune recipe
subclass) uses it the same way::

    stop = StopRequest()                      # before the loop: installs the SIGUSR1/SIGTERM handlers
    for step in ...:
        train_step()
        if stop.should_stop():                # EVERY rank, at EVERY step boundary (a collective)
            path = save_full_checkpoint(step)  # model, optimizer, LR scheduler, data position, step
            stop.saved(step, path)            # rank 0: one log line + "$COOKBOOK_STOP_FILE.saved"
            break                             # and exit 0
        hang_step(step)                       # a step boundary for the hang watch (cookbook_runtime.hang)

How a stop is asked for (either is enough; the ranks agree before anyone saves):

- the batch step (:mod:`cookbook_runtime.run`) touches ``$COOKBOOK_STOP_FILE`` when Slurm sends USR1
  (``--signal=B:USR1@N`` before the time limit, ``scancel --signal=USR1 --batch``) or TERM (preemption
  without ``PreemptParameters=send_user_signal``). Rank 0 runs on the batch step's node, so the flag is
  seen there at once even where a shared filesystem caches attributes on the other nodes;
- a signal that reaches the rank itself (``scancel --signal=USR1 JOB`` signals the job's steps; the
  script makes the launcher ignore USR1, so only the ranks act on it).

:meth:`StopRequest.should_stop` combines the local flag and the flag file with an all-reduce (MAX) over
the default process group, so every rank returns the same answer at the same step and no rank saves
alone. Once a stop is agreed the hang watch pauses (a save is never a hang). After the ranks exit, the batch
step requeues the job when ``$COOKBOOK_STOP_FILE.saved`` exists
(or when a stop was asked for and the launcher failed); ranks that end training normally write no
``.saved`` and the job completes. On restart each framework's resume block finds the newest complete
checkpoint, the one written here.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

from . import hang
from .decide import stop_check_every
from .files import LEAD_ENV, SAVE_ENV, SAVED_SUFFIX, STOP_FILE_ENV, saved_line

SIGNALS = ("SIGUSR1", "SIGTERM")
__all__ = ["SAVED_SUFFIX", "STOP_FILE_ENV", "SIGNALS", "StopRequest", "hang_step", "saved_line"]


class StopRequest:
    """A stop asked for by Slurm (signal or flag file), agreed across ranks at step boundaries."""

    def __init__(self, flag_file: str | None = None) -> None:
        self.flag_file = flag_file if flag_file is not None else os.environ.get(STOP_FILE_ENV) or None
        self.signal_name: str | None = None  # the signal that reached this rank, if any
        self._announced = False
        self._every = 1  # steps between two agreements (with ``step``: from the slowest rank's step time)
        self._last: tuple[int, float] | None = None  # (step, time) of the last agreement
        for name in SIGNALS:
            try:
                signal.signal(getattr(signal, name), self._on_signal)
            except ValueError:  # not the main thread: the flag file still works
                pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # a signal handler only sets the flag: the training loop acts on it at the next step boundary
        self.signal_name = signal.Signals(signum).name

    def requested_here(self) -> bool:
        """This rank's own view (no collective): a signal arrived or the flag file exists."""
        return self.signal_name is not None or bool(self.flag_file and os.path.exists(self.flag_file))

    def should_stop(self, step: int | None = None) -> bool:
        """COLLECTIVE: call on every rank at every step boundary. True on every rank when any rank saw a
        stop request (all-reduce MAX over the default process group, when one is initialized).

        With ``step`` (the step just done) the ranks agree only every N steps and answer False between, with
        no collective: N from the slowest rank's step time (agreed in the same all-reduce), the lead time
        ``$COOKBOOK_STOP_LEAD_S`` and the save time ``$COOKBOOK_SAVE_S`` (:func:`decide.stop_check_every`: the
        stop is still seen and saved before the time limit). A framework that syncs the host only to log
        (torchtitan) then pays for the flag rarely."""
        if step is not None and self._every > 1 and step % self._every:
            return False
        now = time.monotonic()
        step_s = 0.0
        if step is not None and self._last is not None and step > self._last[0]:
            step_s = (now - self._last[1]) / (step - self._last[0])
        local = self.requested_here()
        answer, slowest = local, step_s
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import torch

            backend = str(dist.get_backend())
            on_gpu = "gloo" not in backend and torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
            flag = torch.tensor([1.0 if local else 0.0, step_s], dtype=torch.float32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            agreed = flag.tolist()  # the one host sync
            answer, slowest = agreed[0] > 0, agreed[1]
        if step is not None:
            self._last = (step, now)
            if slowest > 0:
                self._every = stop_check_every(slowest, _env_seconds(LEAD_ENV), _env_seconds(SAVE_ENV))
        if answer and not self._announced and _rank() == 0:
            if self.signal_name:
                how = f"{self.signal_name} on rank 0"
            else:
                how = f"flag file {self.flag_file}" if local else "a signal on another rank"
            _say(f"cookbook: stop requested ({how}): every rank saves at this step boundary")
        self._announced = self._announced or answer
        if answer:
            hang.pause()  # the stop-save follows: no step for a while is no hang
        return answer

    def saved(self, step: int, path: str) -> None:
        """After the stop-save: rank 0 logs :func:`saved_line` and writes it to ``$COOKBOOK_STOP_FILE.saved``
        (the batch step requeues the job when that file exists). ``COOKBOOK_TEST_SLOW_SAVE_S`` (tests) makes
        the save that much slower: it is complete only once this line is written."""
        if _rank() != 0:
            return
        time.sleep(float(os.environ.get("COOKBOOK_TEST_SLOW_SAVE_S") or 0))
        line = saved_line(step, path)
        _say(line)
        if self.flag_file:
            target = self.flag_file + SAVED_SUFFIX
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(line + "\n")
            os.replace(tmp, target)


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:  # pragma: no cover - torch is always there in a training job
        pass
    return int(os.environ.get("RANK", "0"))


def _env_seconds(name: str) -> float:
    try:
        return float(os.environ.get(name) or 0)
    except ValueError:
        return 0.0


def _say(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def hang_step(step: int) -> None:
    """A step boundary for the hang watch (no step for K x the median step time: every rank's stack)."""
    hang.step(step)
