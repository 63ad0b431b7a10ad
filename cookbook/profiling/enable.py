"""Which steps the PyTorch profiler traces, with safe defaults; each framework's recipe turns that into its
own overrides (:meth:`cookbook.recipes.Recipe.profiling_overrides`, traces under its ``trace_subdir``).

Safe means: a few active steps after one warm-up step, one cycle only (traces are written once, not
every N steps for the rest of the run), no Python stacks (they make traces several times larger),
shapes recorded (operator tables need them), memory profiling off unless asked for.

Rank subsets: neither torchtune 0.6.1 nor torchtitan 0.3.0 (nor our FSDP script) can restrict the
profiler to some ranks from the config or command line; every rank writes its own trace. Pick ranks afterwards with
:func:`cookbook.profiling.collect.collect` (``cookbook profile collect --ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProfileSchedule:
    """Which training steps are traced: ``wait`` skipped, ``warmup`` discarded, ``active`` kept."""

    wait: int
    warmup: int
    active: int

    @property
    def first_traced_step(self) -> int:
        """1-based training step (as the logs count) of the first traced step."""
        return self.wait + self.warmup + 1

    @property
    def last_traced_step(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def trace_iteration(self) -> int:
        """``N`` in the ``iteration_N`` folder the traces land in (both frameworks)."""
        return self.last_traced_step


def schedule(*, steps: int = 3, warmup: int = 1, start_step: int = 3) -> ProfileSchedule:
    """Schedule tracing ``steps`` training steps from ``start_step`` (1-based) after ``warmup``.

    Starting a few steps in keeps start-up (allocator warm-up, lazy init) out of the trace.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (got {steps})")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 (got {warmup})")
    return ProfileSchedule(wait=max(0, start_step - 1 - warmup), warmup=warmup, active=steps)
