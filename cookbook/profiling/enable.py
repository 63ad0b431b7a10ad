"""Overrides that turn the PyTorch profiler on, with safe defaults, for each framework.

Safe means: a few active steps after one warm-up step, one cycle only (traces are written once, not
every N steps for the rest of the run), no Python stacks (they make traces several times larger),
shapes recorded (operator tables need them), memory profiling off unless asked for.

Rank subsets: neither torchtune 0.6.1 nor torchtitan 0.3.0 (nor our FSDP script) can restrict the
profiler to some ranks from the config or command line; every rank writes its own trace. Pick ranks afterwards with
:func:`cookbook.profiling.collect.collect` (``cookbook profile collect --ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass

FRAMEWORKS = ("torchtune", "torchtitan", "fsdp")

#: Where each framework writes traces, relative to its output folder (torchtune ``output_dir``,
#: torchtitan ``--dump-folder``, the FSDP script's run folder).
TRACE_SUBDIR = {"torchtune": "profiling_outputs", "torchtitan": "profiling/traces", "fsdp": "profiling/traces"}
MEMORY_SUBDIR = {"torchtune": "profiling_outputs", "torchtitan": "profiling/memory_snapshot"}


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
    wait = max(0, start_step - 1 - warmup)
    return ProfileSchedule(wait=wait, warmup=warmup, active=steps)


def profiling_overrides(
    framework: str,
    *,
    device: str = "cuda",
    steps: int = 3,
    warmup: int = 1,
    start_step: int = 3,
    memory: bool = False,
) -> list[str]:
    """Overrides that enable profiling: ``key=value`` strings for torchtune's ``tune run``,
    ``--section.key=value`` flags for torchtitan's ``torchtitan.train``, ``--flag=value`` for our FSDP
    script (``cookbook/training/fsdp_train.py``).

    ``memory`` adds a CUDA memory snapshot (GPU only; torchtune writes it for rank 0 only).
    """
    sched = schedule(steps=steps, warmup=warmup, start_step=start_step)
    on_gpu = device.startswith("cuda")
    if memory and not on_gpu:
        raise ValueError("memory snapshots need a CUDA device (torch.cuda.memory._record_memory_history)")
    if framework == "torchtune":
        return [
            "profiler._component_=torchtune.training.setup_torch_profiler",
            "profiler.enabled=True",
            "profiler.output_dir=${output_dir}/" + TRACE_SUBDIR["torchtune"],
            "profiler.cpu=True",
            f"profiler.cuda={on_gpu}",
            "profiler.xpu=False",
            # torchtune forces with_stack and record_shapes on when profile_memory is set
            f"profiler.profile_memory={memory}",
            "profiler.with_stack=False",
            "profiler.record_shapes=True",
            "profiler.with_flops=False",
            f"profiler.wait_steps={sched.wait}",
            f"profiler.warmup_steps={sched.warmup}",
            f"profiler.active_steps={sched.active}",
            "profiler.num_cycles=1",
        ]
    if framework == "torchtitan":
        # wait = profile_freq - (warmup + active); one cycle via profiler_repeat=1
        flags = [
            "--profiler.enable_profiling",
            f"--profiler.profile_freq={sched.last_traced_step}",
            f"--profiler.profiler_warmup={sched.warmup}",
            f"--profiler.profiler_active={sched.active}",
            "--profiler.profiler_repeat=1",
            f"--profiler.save_traces_folder={TRACE_SUBDIR['torchtitan']}",
        ]
        if memory:
            flags += [
                "--profiler.enable_memory_snapshot",
                f"--profiler.memory_snapshot_freq={sched.last_traced_step}",
                f"--profiler.save_memory_snapshot_folder={MEMORY_SUBDIR['torchtitan']}",
            ]
        return flags
    if framework == "fsdp":
        if memory:
            raise ValueError("the FSDP script takes no memory snapshots; profile memory with torchtune or torchtitan")
        return [f"--profile_steps={sched.active}", f"--profile_warmup={sched.warmup}",
                f"--profile_start_step={sched.first_traced_step}",
                f"--profile_dir=$RUN_DIR/{TRACE_SUBDIR['fsdp']}"]
    raise ValueError(f"unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")
