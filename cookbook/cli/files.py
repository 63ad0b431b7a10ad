"""The files a command reads and writes, checked before it does any work, with one rule for every verb.

A file written on its own (a CSV, a plot, a JSON report) needs its folder to exist: the command says so
rather than guess at a typo. A folder the command fills (a script with its configs, a view folder, a
dataset layout) is created with its parents. Either way a folder where a file is meant, a file where a
folder is meant, a place the user cannot write to and a plot format matplotlib cannot write are refused
in one line (exit 2) before anything is written, so a refused command leaves nothing behind.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path

from cookbook.cli import UserError

# a line only a training job's log has: torchrun/torch/NCCL, Slurm, the frameworks, the cookbook, a rank prefix
_JOB_LOG_LINE = re.compile(
    rb"torchrun|torch[./]|\bNCCL\b|\bc10d\b|slurm|\bsrun\b|cookbook|\[titan\]|torchtune|\btune run\b|"
    rb"Traceback \(most recent call last\)|\[rank\d+\]",
    re.IGNORECASE,
)
_SNIFF_BYTES = 1 << 20


def _ancestor(path: Path) -> Path:
    """``path`` or its nearest folder above that exists (``.`` at the latest)."""
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def _writable(folder: Path, where: str) -> None:
    """Refuse ``where`` unless a file can be made in ``folder`` (tried for real: root, ACLs, read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"{where}: cannot write in {folder} ({e.strerror}); choose a folder you can write to") from None


def _fillable_folder(folder: Path, where: str) -> None:
    """Refuse ``where`` unless ``folder`` is, or can be made as, a writable folder."""
    found = _ancestor(folder)
    if not found.is_dir():
        raise UserError(f"{where}: {found} is a file, not a folder; name a path under a folder")
    _writable(found, where)


def given_path(path: str | Path, option: str, what: str) -> Path:
    """``path`` as a Path once its text names a ``what`` (file, folder): not empty or blank, which ``Path("")``
    would read as the current folder."""
    text = os.fspath(path)
    if not text.strip():
        raise UserError(f"{option} {text!r}: an empty path names no {what}; give one")
    return Path(text)


def _file_named(path: str | Path, option: str, example: str) -> Path:
    """``path`` as a file's Path: not empty, and not ending in a slash (``Path("new/")`` drops it, and the
    command would write a file named ``new``)."""
    text = os.fspath(path)
    if text.endswith(("/", os.sep)):
        raise UserError(f"{option} {text}: names a folder (it ends in /); name a file in it, e.g. {text}{example}")
    return given_path(text, option, "file")


def plot_formats() -> list[str]:
    """The file suffixes matplotlib can save a figure as (``png``, ``svg``, ``pdf`` ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def output_file(
    path: str | Path, option: str, *, plot: bool = False, make_folder: bool = False, example: str = "NAME"
) -> Path:
    """``path`` as the file ``option`` names, once it is known that it can be written: not a folder, its folder
    existing (or, with ``make_folder``, one the command may create), writable; for ``plot`` a suffix matplotlib
    writes. Raises :class:`UserError` with the value, the rule and the fix (``example``: a file name to suggest);
    creates nothing."""
    example = "plot.png" if plot else example
    p, where = _file_named(path, option, example), f"{option} {path}"
    if p.is_dir():
        raise UserError(f"{where}: is a folder, not a file; name a file in it, e.g. {option} {p / example}")
    if plot:
        formats = plot_formats()
        if p.suffix.lower().lstrip(".") not in formats:
            got = f"'{p.suffix}'" if p.suffix else "no suffix"
            raise UserError(
                f"{where}: matplotlib cannot tell a plot format from {got}; end the name in one of "
                + ", ".join(f".{f}" for f in formats)
                + f", e.g. {p.with_suffix('.png').name}"
            )
    folder = p.parent
    if make_folder:
        _fillable_folder(folder, where)
    elif not folder.is_dir():
        found = _ancestor(folder)
        if not found.is_dir():
            raise UserError(f"{where}: {found} is a file, not a folder")
        raise UserError(f"{where}: folder {folder} does not exist; create it (mkdir -p {folder}) or name another path")
    else:
        _writable(folder, where)
    return p


def output_folder(path: str | Path, option: str) -> Path:
    """``path`` as the folder ``option`` names, which the command creates (with its parents) and fills: not a
    file, not empty, under a folder the user can write to. Raises :class:`UserError`; creates nothing."""
    p, where = given_path(path, option, "folder"), f"{option} {path}"
    if p.exists() and not p.is_dir():
        raise UserError(f"{where}: is a file, not a folder; name a folder (it is created if missing)")
    _fillable_folder(p, where)
    return p


def training_log(path: str | Path) -> None:
    """Refuse a file that is not a training job's log (binary, or text with no step, no known failure and no line
    of torchrun, torch, NCCL, Slurm, the frameworks or the cookbook) with one line; an empty log passes (a job
    that has not written yet)."""
    from cookbook.metrics import diagnose_text, parse_text

    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(_SNIFF_BYTES)
        f.seek(max(f.tell(), p.stat().st_size - _SNIFF_BYTES))
        tail = f.read()
    fix = "give the job's log (`cookbook logs JOBID` names it) or its run folder"
    text = head[:65536]
    bad = sum(
        1 for c in text.decode("utf-8", "replace") if c == "\ufffd" or (ord(c) < 32 and c not in "\t\n\r\f\b\x1b")
    )
    if bad > len(text) // 20:
        raise UserError(f"{path}: a binary file, not a training log; {fix}")
    if _JOB_LOG_LINE.search(head) or _JOB_LOG_LINE.search(tail) or not head.strip():
        return
    sample = (head + b"\n" + tail).decode("utf-8", "replace")
    if len(parse_text(sample)) or diagnose_text(sample):
        return
    raise UserError(
        f"{path}: not a training log (no training step, no known failure, no line of torchrun, torch, Slurm or "
        f"the cookbook); {fix}"
    )


def known_gpu(name: str | None, option: str = "--gpu") -> str | None:
    """``name`` if ``cookbook.gpus`` knows the GPU kind (a key, alias or device name); else one line listing them."""
    if name is None:
        return None
    from cookbook.gpus import GPU_KINDS, UnknownGpu, gpu_kind

    try:
        gpu_kind(name)
    except UnknownGpu:
        raise UserError(f"{option} {name}: unknown GPU kind; use one of {', '.join(GPU_KINDS)}") from None
    return name


def at_least(value: float | None, minimum: float, option: str, meaning: str) -> None:
    """Refuse a number below ``minimum`` (``--sample -3``) or not finite (``--hours nan``, ``--seq-len inf``:
    ``float()`` reads both) in one line that says what the option means."""
    if value is None:
        return
    if not math.isfinite(value):
        raise UserError(f"{option} {value}: not a finite number; give a number >= {minimum:g} ({meaning})")
    if value < minimum:
        raise UserError(f"{option} {value:g}: must be >= {minimum:g} ({meaning})")
