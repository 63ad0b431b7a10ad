"""Issue #43 item 2: a job is resolved once on its way to Slurm. Submitted through ``Executor.submit``,
``Executor.submit_spec``, ``Executor.map_array`` (as one array and as separate jobs; a client that only records
the script) and ``cookbook render`` (with and without ``--test-only``, a stand-in ``sbatch`` answering), each job
is resolved once (``resolve``: ``check_spec`` and the recipe's ``validate`` once, its lead time and checkpoint size
once) and rendered once; nothing under ``render.py`` resolves or asks the planner, directly or through another
module (the planner is off the render path), and ``render.py`` is entered from outside at most twice a job (three
times for ``--test-only``: render, Slurm's test of that rendering, the write). The counts come from the
interpreter's own call events (``sys.setprofile``), so an import alias or a call made inside the engine counts."""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

import cookbook.render as render
import cookbook.resolve as resolve
from cookbook.cli import main
from cookbook.executor import Executor
from cookbook.planner import lead_time
from cookbook.recipes import get_recipe
from cookbook.slurm.client import SlurmClient
from cookbook.spec import SpecError, check_spec, make_spec
from cookbook_runtime.decide import stop_lead_seconds

RENDER = Path(render.__file__).resolve()
PLANNER = Path(lead_time.__file__).resolve().parent
RECIPE = "llama3_3_70b_lora"  # a GPU job that requeues: its lead time and checkpoint are sized


class RecordingClient(SlurmClient):
    """sbatch answers a job id and keeps the script's text; nothing is submitted."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []

    def submit(
        self, script: str | os.PathLike[str], *sbatch_args: str, cwd: str | os.PathLike[str] | None = None
    ) -> str:
        self.scripts.append(Path(script).read_text())
        return str(41 + len(self.scripts))


@functools.cache
def where(filename: str) -> str:
    """``render`` for ``render.py``, ``planner`` for a module of the planner, else ''."""
    path = Path(filename).resolve()
    return "render" if path == RENDER else "planner" if path.is_relative_to(PLANNER) else ""


def under_render(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame that called it, however far up, runs code of ``render.py``."""
    while frame is not None:
        if where(frame.f_code.co_filename) == "render":
            return True
        frame = frame.f_back
    return False


def _code(fn: Callable[..., Any]) -> CodeType:
    return fn.__code__


@contextmanager
def counted(watched: dict[str, CodeType]) -> Iterator[Counter[str]]:
    """Counts the calls of each watched function; as ``render.py``, each call into ``render.py`` made from code
    outside it; as ``planner under render.py`` / ``resolve under render.py``, each call of the planner's (a module
    of ``cookbook/planner/`` or the lead time) / of ``resolve`` made while ``render.py`` is anywhere on the stack,
    through any number of other modules."""
    counts: Counter[str] = Counter()
    names = {code: name for name, code in watched.items()}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        name = names.get(frame.f_code)
        if name is not None:
            counts[name] += 1
        callee = where(frame.f_code.co_filename)
        caller = where(frame.f_back.f_code.co_filename) if frame.f_back else ""
        if callee == "render" and caller != "render":
            counts["render.py"] += 1
        for kind, hit in (("planner", callee == "planner" or name == "lead time"), ("resolve", name == "resolve")):
            if hit and under_render(frame.f_back):
                counts[f"{kind} under render.py"] += 1

    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)


def _watched(recipe: str) -> dict[str, CodeType]:
    return {
        "check_spec": _code(check_spec),
        "recipe.validate": _code(type(get_recipe(recipe)).validate),
        "lead time": _code(stop_lead_seconds),
        "checkpoint size": _code(lead_time.largest_save_bytes),
        "resolve": _code(resolve.resolve),
        "render": _code(render.render),
    }


def _executor(tmp_path: Path, client: SlurmClient) -> Executor:
    """An executor of 2-node, 8-GPU jobs on the generic profile, what a submission imports already loaded."""
    executor = Executor(folder=tmp_path / "runs", profile="generic", client=client)
    executor.update_parameters(nodes=2, gpus_per_node=8, time="04:00:00")
    executor.spec(RECIPE)
    return executor


def assert_resolved_once_per_job(counts: Counter[str], jobs: int, entries: int = 2) -> None:
    """Each of ``jobs`` jobs checked, sized, resolved and rendered once; ``render.py`` entered at most ``entries``
    times a job; nothing under ``render.py`` resolved or asked the planner."""
    once = ("check_spec", "recipe.validate", "lead time", "checkpoint size", "resolve", "render")
    assert {k: counts[k] for k in once} == dict.fromkeys(once, jobs), counts
    assert counts["planner under render.py"] == 0 and counts["resolve under render.py"] == 0, counts
    assert 1 <= counts["render.py"] <= entries * jobs, counts


@pytest.mark.parametrize("how", ["submit", "submit_spec"])
def test_a_submission_validates_and_sizes_the_job_once_and_enters_render_at_most_twice(tmp_path, how):
    client = RecordingClient()
    executor = _executor(tmp_path, client)
    spec = executor.spec(RECIPE) if how == "submit_spec" else None
    with counted(_watched(RECIPE)) as counts:
        job = executor.submit(RECIPE) if spec is None else executor.submit_spec(spec)
    assert len(client.scripts) == 1 and job.script.read_text() == client.scripts[0]
    assert "--save-seconds=" in client.scripts[0] and "--checkpoint-gb=" in client.scripts[0]  # sized, written
    assert_resolved_once_per_job(counts, 1)


@pytest.mark.parametrize("array", [True, False], ids=["array", "separate-jobs"])
def test_a_sweep_resolves_each_task_once(tmp_path, array):
    """2 tasks: each resolved and rendered once; the sweep's name is no job of its own, so nothing checks or
    sizes it (the array script's ``#SBATCH`` lines are the first task's resolved ones)."""
    client = RecordingClient()
    executor = _executor(tmp_path, client)
    with counted(_watched(RECIPE)) as counts:
        jobs = executor.map_array(RECIPE, [{"model.lora_rank": 8}, {"model.lora_rank": 16}], 1, array=array)
    assert len(jobs) == 2 and len(client.scripts) == (1 if array else 2)
    for job in jobs:
        assert "--save-seconds=" in job.script.read_text() and "--checkpoint-gb=" in job.script.read_text()
    if array:
        signal = [ln for ln in client.scripts[0].splitlines() if ln.startswith("#SBATCH --signal")]
        assert signal and signal[0] in jobs[0].script.read_text().splitlines()  # the task's own lead time
    assert_resolved_once_per_job(counts, 2)


def fake_sbatch(folder: Path) -> Path:
    """A folder holding an ``sbatch`` that answers ``--test-only`` as Slurm does (on stderr) and queues nothing."""
    folder.mkdir()
    sbatch = folder / "sbatch"
    sbatch.write_text(
        '#!/bin/sh\n[ "$1" = --test-only ] || exit 1\n'
        'echo "sbatch: Job 12 to start at 2026-01-01T00:00:00 using 16 processors on nodes n[1-2]" >&2\n'
    )
    sbatch.chmod(0o755)
    return folder


@pytest.mark.parametrize("test_only", [False, True], ids=["render", "render-test-only"])
def test_cookbook_render_resolves_and_renders_once(tmp_path, monkeypatch, capsys, test_only):
    """``cookbook render [--test-only]``: one resolve, one rendering for the warnings, Slurm's test and the file."""
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    out = tmp_path / "job" / "job.sbatch"
    argv = ["render", RECIPE, "--profile", "generic", "--nodes", "2", "--gpus-per-node", "8", "--time", "04:00:00"]
    argv += ["-o", str(out), *(["--test-only"] if test_only else [])]
    assert main(argv[:-1] if test_only else argv) == 0  # loads what a render imports, before the counting
    with counted(_watched(RECIPE)) as counts:
        assert main(argv) == 0
    assert "--save-seconds=" in out.read_text()
    assert ("sbatch --test-only: sbatch: Job 12 to start" in capsys.readouterr().err) == test_only
    assert_resolved_once_per_job(counts, 1, entries=3 if test_only else 2)
    if not test_only:
        assert counts["render.py"] <= 2, counts


@pytest.mark.parametrize("ending", [os.sep, "existing folder"], ids=["ends-in-separator", "existing-folder"])
def test_write_job_refuses_a_script_path_that_names_a_folder(tmp_path, ending):
    """``write_job(spec, "outdir/")`` would write a file named outdir with ``cookbook_runtime/`` beside it: one
    line with the value, the rule and the fix, nothing written."""
    spec = make_spec(RECIPE, "generic", nodes=2, gpus_per_node=8)
    folder = tmp_path / "outdir"
    if ending == "existing folder":
        folder.mkdir()
    given = str(folder) if ending == "existing folder" else str(folder) + ending
    with pytest.raises(SpecError) as refused:
        render.write_job(spec, given)
    message = str(refused.value)
    assert "\n" not in message and repr(given) in message and "names a folder" in message, message
    assert str(folder / "job.sbatch") in message  # the fix: a file's name
    assert [p.name for p in tmp_path.iterdir()] == (["outdir"] if ending == "existing folder" else [])
    assert not any(folder.iterdir()) if folder.exists() else True


def test_the_counter_sees_a_second_validation_and_the_planner_under_render():
    """The counts can fail: a second ``render.validate`` is seen as a second ``check_spec`` and entry, and a bare
    spec handed to ``render.py`` (its front door resolves it) as resolve and the planner under ``render.py``, two
    modules down."""
    spec = make_spec(RECIPE, "generic", nodes=2, gpus_per_node=8)
    with counted(_watched(spec.recipe)) as counts:
        render.validate(spec)
        render.validate(spec)
    assert counts["check_spec"] == 2 and counts["render.py"] == 2, counts
    assert counts["resolve under render.py"] == 2 and counts["planner under render.py"] >= 2, counts
    with counted(_watched(spec.recipe)) as counts:
        render.render(resolve.resolve(spec))
    assert counts["planner under render.py"] == 0 and counts["resolve under render.py"] == 0, counts
