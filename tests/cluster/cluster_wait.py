"""Polling for the cluster tests: a condition of a job, its log or a node, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.5) -> None:
    """Until ``predicate()`` is true; an AssertionError naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)
