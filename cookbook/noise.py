"""Known third-party noise, filtered where the cookbook imports those libraries (``import cookbook`` installs it).

Importing torchtune or torchtitan on a login node (a notebook's kernel, the command line) imports torchao and
torch's triton helpers, which log about GPU kernels the login node never runs: torchao's C++ extensions built for
another torch, triton absent. Each filter drops only its listed messages; every other record of those loggers, and
every other warning, still shows. Nothing redirects stderr.
"""

from __future__ import annotations

import logging
import warnings

# logger name -> the beginnings of the messages that are noise on a login node
LOG_NOISE: dict[str, tuple[str, ...]] = {
    "torchao": ("Skipping import of cpp extensions",),
    "torch._library.triton": ("Triton not available",),
}
# (message regex, category) of warnings the same imports raise
WARNING_NOISE: tuple[tuple[str, type[Warning]], ...] = (
    (r"Importing from torchao\.dtypes is deprecated", DeprecationWarning),
)


class KnownNoise(logging.Filter):
    """Drops a logger's records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().lstrip().startswith(self.starts)


def quiet() -> None:
    """Install the filters (once per logger: calling it again adds nothing)."""
    for name, starts in LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownNoise) for f in logger.filters):
            logger.addFilter(KnownNoise(starts))
    for message, category in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
