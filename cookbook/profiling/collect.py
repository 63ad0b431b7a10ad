"""Find every profiler trace of a run (all ranks, all iterations) and copy a subset to a view folder.

torchtune 0.6.1 names every rank's trace ``r0-<date>.<ns>.pt.trace.json.gz`` (the ``r0`` is fixed),
so the rank is read from the trace itself: Kineto writes ``"distributedInfo": {"backend": ...,
"rank": R, ...}`` in the first few hundred bytes. torchtitan names them ``rank{R}_trace.json.gz``.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cookbook.profiling.trace import open_binary

_ITER_RE = re.compile(r"iteration_(\d+)$")
_DIST_RANK_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}\[\]]*?"rank"\s*:\s*(\d+)')
_WORLD_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}\[\]]*?"world_size"\s*:\s*(\d+)')
_NAME_RANK_RE = re.compile(r"rank(\d+)[_.]")
_NAME_ITER_RE = re.compile(r"_iter(\d+)\.")  # our own view-folder names
_HEAD_BYTES = 64 * 1024
# written into every view folder `collect` fills: a search from a folder above it skips these copies, so that
# collecting twice (the default view folder is inside the run folder) and summarizing the run count each trace once
VIEW_MARKER = ".cookbook-profile-view"


@dataclass(frozen=True)
class TraceFile:
    """One trace file of a run."""

    path: Path
    iteration: int | None
    rank: int | None
    world_size: int | None
    size_bytes: int
    has_steps: bool  # False for the empty trace torchtitan writes when a run ends mid-schedule

    def view_name(self) -> str:
        rank = "rankNA" if self.rank is None else f"rank{self.rank}"
        it = "iterNA" if self.iteration is None else f"iter{self.iteration}"
        return f"{rank}_{it}.pt.trace.json.gz"


def trace_rank(path: Path) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` from the trace's own ``distributedInfo`` (None if not distributed)."""
    with open_binary(path) as f:
        head = f.read(_HEAD_BYTES)
    rank, world = _DIST_RANK_RE.search(head), _WORLD_RE.search(head)
    if rank is None:  # unusual layout: parse it all
        with open_binary(path) as f:
            info = json.load(f).get("distributedInfo") or {}
        return info.get("rank"), info.get("world_size")
    return int(rank.group(1)), int(world.group(1)) if world else None


def _has_steps(path: Path) -> bool:
    needle, tail = b'"ProfilerStep#', b""
    with open_binary(path) as f:
        while chunk := f.read(1 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def is_trace_file(path: Path) -> bool:
    return path.is_file() and (
        path.name.endswith(".pt.trace.json.gz")
        or path.name.endswith(".pt.trace.json")
        or re.fullmatch(r"rank\d+_trace\.json(\.gz)?", path.name) is not None
    )


def find_traces(run_dir: str | Path) -> list[TraceFile]:
    """Every trace under ``run_dir`` (a torchtune ``output_dir`` or torchtitan ``--dump-folder``,
    or any folder above them), sorted by iteration then rank; the copies in a view folder of :func:`collect`
    below ``run_dir`` are skipped (``run_dir`` itself may be one)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"no such folder: {run_dir}")
    found = []
    below = sorted(run_dir.rglob("*"))
    views = {p.parent for p in below if p.name == VIEW_MARKER} - {run_dir}
    for path in below:
        if not is_trace_file(path) or any(v in path.parents for v in views):
            continue
        it = next((int(m.group(1)) for p in path.parents if (m := _ITER_RE.search(p.name))), None)
        if it is None and (m := _NAME_ITER_RE.search(path.name)):
            it = int(m.group(1))
        rank, world = trace_rank(path)
        if rank is None and (m := _NAME_RANK_RE.match(path.name)):
            rank = int(m.group(1))
        found.append(TraceFile(path, it, rank, world, path.stat().st_size, _has_steps(path)))
    return sorted(
        found, key=lambda t: (t.iteration is None, t.iteration or 0, t.rank is None, t.rank or 0, str(t.path))
    )


def find_memory_snapshots(run_dir: str | Path) -> list[Path]:
    """CUDA memory snapshots (torchtune ``rank0_memory_snapshot.pickle``, torchtitan
    ``profiling/memory_snapshot/step_*/{rank:06d}_step_N.pickle``); a view folder's copies below ``run_dir`` are
    skipped, as in :func:`find_traces`."""
    views = [m.parent for m in Path(run_dir).rglob(VIEW_MARKER) if m.parent != Path(run_dir)]
    return sorted(
        p
        for p in Path(run_dir).rglob("*.pickle")
        if ("memory" in str(p) or "snapshot" in str(p)) and not any(v in p.parents for v in views)
    )


def traces_table(traces: list[TraceFile]) -> pd.DataFrame:
    """One row per trace: iteration, rank, world size, MB, whether it holds any step, path."""
    return pd.DataFrame(
        [
            {
                "iteration": t.iteration,
                "rank": t.rank,
                "world_size": t.world_size,
                "size_mb": round(t.size_bytes / 1e6, 3),
                "has_steps": t.has_steps,
                "path": str(t.path),
            }
            for t in traces
        ],
        columns=["iteration", "rank", "world_size", "size_mb", "has_steps", "path"],
    )


def collect(
    run_dir: str | Path, out_dir: str | Path, *, ranks: list[int] | None = None, iterations: list[int] | None = None
) -> pd.DataFrame:
    """Copy traces of ``ranks`` (default all) at ``iterations`` (default: the latest with steps)
    into ``out_dir`` as ``rank{R}_iter{N}.pt.trace.json.gz``; returns what was copied, with sizes."""
    traces = [t for t in find_traces(run_dir) if t.has_steps]
    if not traces:
        raise FileNotFoundError(
            f"no profiler traces with steps under {run_dir} (was profiling enabled, and did the run reach the "
            "last active step?)"
        )
    if iterations is None:
        its = [t.iteration for t in traces if t.iteration is not None]
        iterations = [max(its)] if its else None
    chosen = [
        t for t in traces if (iterations is None or t.iteration in iterations) and (ranks is None or t.rank in ranks)
    ]
    if not chosen:
        avail = sorted({(t.iteration, t.rank) for t in traces}, key=str)
        raise FileNotFoundError(
            f"no trace matches ranks={ranks} iterations={iterations}; available (iteration, rank): {avail}"
        )
    names = [t.view_name() for t in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"two traces would get the same name in {out_dir}: {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / VIEW_MARKER).write_text(f"copies of the profiler traces of {Path(run_dir).resolve()}\n")
    rows = []
    for t, name in zip(chosen, names):
        dest = out / name
        if t.path.suffix != ".gz":  # keep the view folder uniformly gzipped
            with open(t.path, "rb") as src, gzip.open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(t.path, dest)
        rows.append(
            {
                "iteration": t.iteration,
                "rank": t.rank,
                "source": str(t.path),
                "dest": str(dest),
                "size_mb": round(dest.stat().st_size / 1e6, 3),
            }
        )
    for snap in find_memory_snapshots(run_dir):  # GPU runs with memory=True only
        rank, step = _snapshot_rank_step(snap)
        if (ranks is None or rank in ranks) and (iterations is None or step in iterations):
            dest = out / f"rank{rank}_iter{step}.memory_snapshot.pickle"
            shutil.copyfile(snap, dest)
            rows.append(
                {
                    "iteration": step,
                    "rank": rank,
                    "source": str(snap),
                    "dest": str(dest),
                    "size_mb": round(dest.stat().st_size / 1e6, 3),
                }
            )
    return pd.DataFrame(rows, columns=["iteration", "rank", "source", "dest", "size_mb"])


def _snapshot_rank_step(path: Path) -> tuple[int | None, int | None]:
    """torchtune: iteration_N/rank{R}_memory_snapshot.pickle; torchtitan: step_N/{R:06d}_step_N.pickle."""
    if m := re.fullmatch(r"(\d+)_step_(\d+)\.pickle", path.name):
        return int(m.group(1)), int(m.group(2))
    rank = int(m.group(1)) if (m := re.match(r"rank(\d+)", path.name)) else None
    step = next((int(m.group(1)) for p in path.parents if (m := _ITER_RE.search(p.name))), None)
    return rank, step
