"""Issue #43 item 3: what differs on ``local-cpu`` lives in the local profile (``profiles/builtin.yaml``) and the
CPU shims (``cookbook/local/compat/``), not in branches across the engine. The engine is what
``test_import_graph`` calls it: ``cookbook/`` less the front ends (CLI, walkthrough, widgets, notebook runner,
lab, demo), the local bench and the framework config modules. Its lines naming the local bench are counted."""

from __future__ import annotations

import re

import pytest
from test_import_graph import ROOT, _engine, _modules

NAMES = re.compile(r"local_cpu|local-cpu|tiny|cookbook\.local")
TARGET = 20  # the target: under 20 engine lines
TODAY = 82  # after the profile's shims and the resolved job (96 before); only ever lowered


def engine_lines() -> list[str]:
    """``path:line: text`` of every engine line naming ``local_cpu``, ``local-cpu``, ``tiny`` or ``cookbook.local``."""
    out = []
    for module, path in sorted(_modules().items()):
        if not _engine(module):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if NAMES.search(line):
                out.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def test_the_count_sees_a_branch():
    assert NAMES.search("if spec.local_cpu:") and not NAMES.search("if spec.profile_info.shims:")


def test_the_engine_names_the_local_bench_no_more_than_today():
    lines = engine_lines()
    assert len(lines) <= TODAY, "\n".join(lines)


@pytest.mark.xfail(strict=True, reason=f"issue #43 item 3: {TODAY} engine lines name the local bench, target {TARGET}")
def test_the_engine_names_the_local_bench_on_fewer_than_20_lines():
    lines = engine_lines()
    assert len(lines) < TARGET, "\n".join(lines)


def test_the_shims_are_named_once_in_the_engine():
    """The launch lines take the shims' module from the profile (``shims:`` of ``local-cpu``): no engine file
    names it as a string; the launch line still runs it."""
    from cookbook.recipes import get_recipe
    from cookbook.spec import make_spec

    named = [line for line in engine_lines() if re.search(r"[\"']cookbook\.local\.compat\.cpu[\"']", line)]
    assert named == []
    for recipe in ("llama3_3_70b_lora", "llama3_8b_c4", "flux_schnell_use"):
        launch = get_recipe(recipe).command(make_spec(recipe, profile="local-cpu", assets_dir="/a"))
        assert launch.args[:2] == ("-m", "cookbook.local.compat.cpu") and launch.variables["TINY_DIR"] == "/a"
