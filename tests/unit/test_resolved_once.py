"""Issue #43 item 2: a job is resolved once on its way to Slurm. Submitted through ``Executor.submit`` and
``Executor.submit_spec`` (a client that only records the script), the spec is validated once (``check_spec``,
the recipe's ``validate``), its lead time and checkpoint size are computed once and not by ``render.py`` (the
planner is off the render path), and ``render.py`` is entered from outside at most twice. The counts come from the
interpreter's own call events (``sys.setprofile``), so an import alias or a call made inside the engine counts."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

import cookbook.render as render
from cookbook.executor import Executor
from cookbook.planner import lead_time
from cookbook.recipes import get_recipe
from cookbook.slurm.client import SlurmClient
from cookbook.spec import check_spec
from cookbook_runtime.decide import stop_lead_seconds

RENDER = Path(render.__file__).resolve()
PLANNER = Path(lead_time.__file__).resolve().parent


class RecordingClient(SlurmClient):
    """sbatch answers a job id and keeps the script's text; nothing is submitted."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []

    def submit(self, script: str | Path, cwd: str | Path | None = None, **kwargs: Any) -> str:
        self.scripts.append(Path(script).read_text())
        return str(41 + len(self.scripts))


@functools.cache
def where(filename: str) -> str:
    """``render`` for ``render.py``, ``planner`` for a module of the planner, else ''."""
    path = Path(filename).resolve()
    return "render" if path == RENDER else "planner" if path.is_relative_to(PLANNER) else ""


def _code(fn: Callable[..., Any]) -> CodeType:
    return fn.__code__


@contextmanager
def counted(watched: dict[str, CodeType]) -> Iterator[Counter[str]]:
    """Counts the calls of each watched function; as ``render.py``, each call into ``render.py`` made from code
    outside it; as ``planner from render.py``, each call of the planner's made by ``render.py``."""
    counts: Counter[str] = Counter()
    names = {code: name for name, code in watched.items()}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        if (name := names.get(frame.f_code)) is not None:
            counts[name] += 1
        callee = where(frame.f_code.co_filename)
        caller = where(frame.f_back.f_code.co_filename) if frame.f_back else ""
        if callee == "render" and caller != "render":
            counts["render.py"] += 1
        if caller == "render" and callee == "planner":
            counts["planner from render.py"] += 1

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
    }


@pytest.mark.parametrize("how", ["submit", "submit_spec"])
def test_a_submission_validates_and_sizes_the_job_once_and_enters_render_at_most_twice(tmp_path, how):
    recipe = "llama3_3_70b_lora"  # a GPU job that requeues: its lead time and checkpoint are sized
    client = RecordingClient()
    executor = Executor(folder=tmp_path / "runs", profile="generic", client=client)
    executor.update_parameters(nodes=2, gpus_per_node=8, time="04:00:00")
    spec = executor.spec(recipe)  # also loads what a submission imports, before the counting
    spec = spec if how == "submit_spec" else None
    watched = _watched(recipe)
    with counted(watched) as counts:
        job = executor.submit(recipe) if spec is None else executor.submit_spec(spec)
    assert len(client.scripts) == 1 and job.script.read_text() == client.scripts[0]
    assert "--save-seconds=" in client.scripts[0] and "--checkpoint-gb=" in client.scripts[0]  # sized, written
    assert counts["check_spec"] == 1, counts
    assert counts["recipe.validate"] == 1, counts
    assert counts["lead time"] == 1 and counts["checkpoint size"] == 1, counts
    assert counts["planner from render.py"] == 0, counts
    assert 1 <= counts["render.py"] <= 2, counts


def test_the_counter_sees_a_second_validation():
    """The counts can fail: a second ``render.validate`` is seen as a second ``check_spec`` and entry."""
    from cookbook.spec import make_spec

    spec = make_spec("llama3_3_70b_lora", "generic", nodes=2, gpus_per_node=8)
    with counted(_watched(spec.recipe)) as counts:
        render.validate(spec)
        render.validate(spec)
    assert counts["check_spec"] == 2 and counts["render.py"] == 2, counts
