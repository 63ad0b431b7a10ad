"""Where a run resumes: the newest complete checkpoint in its run folder, per framework (standard library).

Each function looks at the run folder and returns ``(arguments to add to the launch, lines to log)``; the
torchtune one may also move aside an epoch folder written after the recipe state it would resume from.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

FRAMEWORKS = ("torchtune", "torchtitan", "fsdp", "none")


def _version_key(path: Path) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def torchtune(
    run_dir: Path, adapter: bool = False, filename_format: str = "", job: str = "0"
) -> tuple[list[str], list[str]]:
    """torchtune 0.6.1: a step checkpoint of ``cookbook_tune`` (``step_N/{epoch_E/, recipe_state/}``, renamed
    into place once complete) when its recipe state is newer than torchtune's own epoch-end one; else the
    newest ``epoch_N`` that is not newer than the recipe state (a newer one was written after it and trains
    again: moved aside)."""
    state = run_dir / "recipe_state" / "recipe_state.pt"
    args: list[str] = []
    said: list[str] = []
    steps = sorted((p for p in run_dir.glob("step_*") if p.is_dir()), key=_version_key)
    step_dir = None
    for step in steps:
        if (step / "recipe_state" / "recipe_state.pt").is_file() and any(step.glob("epoch_*")):
            step_dir = step
    step_state = step_dir / "recipe_state" / "recipe_state.pt" if step_dir else None
    if step_dir and step_state and (not state.is_file() or step_state.stat().st_mtime > state.stat().st_mtime):
        epoch = sorted(step_dir.glob("epoch_*"), key=_version_key)[0].name
        rel = step_dir.name
        said.append(f"resuming from {step_dir} (mid-epoch)")
        args += ["resume_from_checkpoint=True", f"checkpointer.recipe_checkpoint={rel}/recipe_state/recipe_state.pt"]
        if filename_format:
            args.append(f"checkpointer.checkpoint_files.filename_format={rel}/{epoch}/{filename_format}")
        if adapter:
            args.append(f"checkpointer.adapter_checkpoint={rel}/{epoch}/adapter_model.pt")
        return args, said
    if not state.is_file():
        return args, said
    latest = None
    for epoch_dir in sorted(run_dir.glob("epoch_*"), key=_version_key):
        if epoch_dir.stat().st_mtime > state.stat().st_mtime:
            aside = run_dir / f"superseded.{epoch_dir.name}.{job}.{int(time.time())}"
            epoch_dir.rename(aside)
            said.append(f"moved {epoch_dir} aside: written after the recipe state, it trains again")
        else:
            latest = epoch_dir
    if latest is not None:
        said.append(f"resuming from {latest}")
        args.append("resume_from_checkpoint=True")
        if filename_format:
            args.append(f"checkpointer.checkpoint_files.filename_format={latest.name}/{filename_format}")
    return args, said


def torchtitan(run_dir: Path, checkpoint_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """torchtitan loads the newest complete ``step-N`` (one with DCP's ``.metadata``) by itself: say which."""
    folder = checkpoint_dir or run_dir / "checkpoint"
    done = sorted((p.parent for p in folder.glob("step-*/.metadata")), key=_version_key)
    return [], [f"resuming from {done[-1]}"] if done else []


def fsdp(run_dir: Path, checkpoint_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """Our FSDP ``train.py`` resumes by itself from the newest ``step-N`` holding ``COMPLETE``: say which."""
    folder = checkpoint_dir or run_dir / "checkpoints"
    done = sorted((p.parent for p in folder.glob("step-*/COMPLETE")), key=_version_key)
    return [], [f"resuming from {done[-1]}"] if done else []


def resume(
    framework: str, run_dir: Path, *, checkpoint_dir: Path | None = None, adapter: bool = False,
    filename_format: str = "", job: str = "0",
) -> tuple[list[str], list[str]]:  # fmt: skip
    """The launch arguments and log lines of ``framework``'s resume (``none``: nothing)."""
    if framework == "torchtune":
        return torchtune(run_dir, adapter, filename_format, job)
    if framework == "torchtitan":
        return torchtitan(run_dir, checkpoint_dir)
    if framework == "fsdp":
        return fsdp(run_dir, checkpoint_dir)
    return [], []


def newest_checkpoint(framework: str, run_dir: Path, checkpoint_dir: Path | None = None) -> Path | None:
    """The newest complete checkpoint folder already in the run folder (None: none), found without touching it."""
    if framework == "torchtune":
        done = [p for p in run_dir.glob("step_*") if (p / "recipe_state" / "recipe_state.pt").is_file()]
        done += [p for p in run_dir.glob("epoch_*") if p.is_dir()]
    elif framework == "torchtitan":
        done = [p.parent for p in (checkpoint_dir or run_dir / "checkpoint").glob("step-*/.metadata")]
    elif framework == "fsdp":
        done = [p.parent for p in (checkpoint_dir or run_dir / "checkpoints").glob("step-*/COMPLETE")]
    else:
        return None
    return max(done, key=lambda p: p.stat().st_mtime) if done else None


def newest_checkpoint_bytes(framework: str, run_dir: Path, checkpoint_dir: Path | None = None) -> int:
    """The size of the newest complete checkpoint already in the run folder (0: none): what the next save of
    this run will write again, measured rather than estimated."""
    newest = newest_checkpoint(framework, run_dir, checkpoint_dir)
    if newest is None:
        return 0
    try:
        return sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
    except OSError:
        return 0
