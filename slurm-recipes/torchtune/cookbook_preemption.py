"""Stop at the next step boundary, on every rank together (issue #16's stop protocol, rank side).

MINIMAL STAND-IN written on branch w16b so the torchtune recipe subclass can be built and tested; the
owner of this module is branch w16a (the lead keeps w16a's version: same API).

Standard library + torch only, no ``cookbook`` import: generate-recipes ships it as
``cookbook_preemption.py`` beside every generated script (``$RECIPE_DIR`` is on ``PYTHONPATH``).

The batch shell touches ``$COOKBOOK_STOP_FILE`` when Slurm sends USR1/TERM; a rank may also get the
signal itself. :meth:`StopRequest.should_stop` is a collective: every rank calls it at every step
boundary and all get the same answer, so no rank saves alone.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
STOP_FILE_ENV = "COOKBOOK_STOP_FILE"


class StopRequest:
    """A stop asked by a signal to this rank or by the flag file; agreed across ranks."""

    def __init__(self, flag_file: str | None = None) -> None:
        self.flag_file = flag_file if flag_file is not None else os.environ.get(STOP_FILE_ENV) or None
        self._signalled = False
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True  # only a flag: the step boundary does the work

    def _local(self) -> bool:
        return self._signalled or bool(self.flag_file and os.path.exists(self.flag_file))

    def should_stop(self) -> bool:
        """COLLECTIVE: True on every rank when any rank saw a signal or the flag file."""
        local = self._local()
        if not (dist.is_available() and dist.is_initialized()):
            return local
        backend = str(dist.get_backend())
        on_gpu = "nccl" in backend and "cpu:" not in backend and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def saved(self, step: int, path: str) -> None:
        """Rank 0: the line metrics/goodput parse, also written to ``$COOKBOOK_STOP_FILE.saved``."""
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        line = f"cookbook: saved at step {step} for preemption: {path}"
        print(line, flush=True)
        if self.flag_file:
            os.makedirs(os.path.dirname(self.flag_file) or ".", exist_ok=True)
            with open(self.flag_file + ".saved", "w") as f:
                f.write(line + "\n")
