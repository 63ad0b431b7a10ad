"""Hang forensics of a run, for ``cookbook diagnose``: what the ranks' watch (:mod:`cookbook_runtime.hang`) left
in ``RUN_DIR/.cookbook/hang/<job id>-<restart>/``.

    for line in hang_report("/shared/runs/llama3-8b"):   # a run folder, a job folder (job.json) or a job's log
        print(line)
    # hang: rank 1 on n2 never entered collective #37 (gloo:all_gather_into_tensor_coalesced, process group 0)
    #   that rank(s) 0 wait in
    # rank 1 (n2) stack: ...

Which rank is at fault is decided once, in :func:`cookbook_runtime.hang.culprit` (the job script asks the same
function which node to exclude); this module finds the folders and prints the culprit's stack.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cookbook_runtime import files
from cookbook_runtime.hang import TRACE_PREFIX, TRIGGER, culprit, describe, load, mask

HANG_FOLDER = Path(files.STATE) / files.HANG  # in the run folder; the job's COOKBOOK_HANG_DIR, one per attempt
_RUN_DIR = re.compile(r"^job \d+: .* run dir (.+)$", re.M)  # the job script's start line


def run_dir_of(target: str | os.PathLike[str]) -> Path | None:
    """The run folder behind ``target``: itself, a job folder's (``job.json``), or the one a job log names."""
    path = Path(target)
    if path.is_dir() and (path / HANG_FOLDER).is_dir():
        return path
    if path.is_dir() and (path / "job.json").is_file():
        from cookbook.slurm.record import JobRecord

        return Path(JobRecord.load(path).run_dir)
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(1 << 20).decode("utf-8", errors="replace")
        found = _RUN_DIR.findall(head)
        return Path(found[-1].strip()) if found else None
    return None


def hang_folders(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The attempts of ``run_dir`` that recorded a hang or a timeout dump, oldest first."""
    root = Path(run_dir) / HANG_FOLDER
    found = [p for p in root.glob("*") if (p / TRIGGER).exists() or any(p.glob(f"{TRACE_PREFIX}*"))]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _main_stack(text: str) -> str:
    """A faulthandler dump without the watch thread's own (the one that was dumping)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip())
    kept = [b for b in blocks if not b.startswith("Current thread") and "cookbook-hang-watch" not in b]
    return "\n".join(kept).strip()


def hang_report(target: str | os.PathLike[str]) -> list[str]:
    """Lines naming, for the newest attempt of the run behind ``target`` that recorded a hang, the rank and host
    that never entered the collective the others wait in, its sequence number and the rank's stack; [] if none."""
    run_dir = run_dir_of(target)
    folders = hang_folders(run_dir) if run_dir else []
    if not folders:
        return []
    folder = folders[-1]
    found = culprit(folder)
    data = load(folder, found["ranks"])  # the stacks of the ranks at fault only
    lines = [describe(found)]
    if found["reason"]:
        lines.append(f"  detected: {found['reason']}")
    for rank in found["ranks"]:
        stack = _main_stack(data["stacks"].get(rank, ""))
        host = data["ranks"].get(rank, {}).get("host", "?")
        body = "\n".join(f"    {ln}" for ln in stack.splitlines()) if stack else "    (no stack: the rank left no dump)"
        lines.append(f"  rank {rank} ({host}) stack, most recent call first:\n{body}")
    lines.append(
        f"  dumps: {folder} (torch's analyzer: python -m torch.distributed.flight_recorder.fr_trace "
        f"-p {TRACE_PREFIX} {folder})"
    )
    return [mask(line) for line in lines]
