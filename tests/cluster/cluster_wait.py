"""Polling for the cluster tests: a condition of a job, its log or a node.

A loaded 2-core machine stretches every job, so a deadline counts from the last sign of progress (a log that grew,
a job that changed state) where the caller can name one, under a generous outer limit; the message says what was
awaited and what was last seen."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cookbook.slurm.client import TERMINAL_STATES, JobInfo, SlurmClient

OUTER_LIMIT_S = 3600.0  # however slow the machine, a test that waits this long has hung


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    poll: float = 0.5,
    progress: Callable[[], object] | None = None,
) -> None:
    """Until ``predicate()`` is true; an AssertionError naming ``what`` after ``timeout`` seconds. With
    ``progress`` (a value that changes while the awaited work advances), ``timeout`` counts from its last change,
    up to :data:`OUTER_LIMIT_S` in all."""
    start = last_change = time.monotonic()
    seen = progress() if progress else None
    while not predicate():
        now = time.monotonic()
        if progress and (value := progress()) != seen:
            seen, last_change = value, now
        if now - last_change > timeout or now - start > OUTER_LIMIT_S:
            stalled = f" (no progress for {now - last_change:.0f} s; last seen: {seen})" if progress else ""
            raise AssertionError(f"timed out waiting for {what} after {now - start:.0f} s{stalled}")
        time.sleep(poll)


def log_sizes(paths: Iterable[Path]) -> tuple[int, ...]:
    """The sizes of jobs' logs (0: not there yet): they grow while the jobs start, train and save."""
    sizes = []
    for p in paths:
        try:
            sizes.append(os.stat(p).st_size)
        except OSError:
            sizes.append(0)
    return tuple(sizes)


def wait_done(client: SlurmClient, job_id: str, log: Path, stall: float = 600, poll: float = 2) -> JobInfo:
    """The job's final state, waiting as long as its log grows or its state changes (``stall`` s of neither:
    an AssertionError naming the job, its state and its log's size)."""
    info: list[JobInfo] = []

    def done() -> bool:
        info[:] = [client.state(job_id)]
        return info[0].state in TERMINAL_STATES

    wait_for(
        done, stall, f"job {job_id} to end ({log})", poll, lambda: (info[0].state if info else "", *log_sizes([log]))
    )
    return info[0]
