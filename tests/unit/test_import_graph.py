"""The package's import graph: no cycles (counting imports inside functions and under TYPE_CHECKING too), neither
between modules nor between the sub-packages of ``cookbook/``; data flows one way (front ends -> engine; the local
bench -> engine, never engine -> local bench, never local bench -> front end), and importing the engine loads no CPU
shim and no triton stand-in."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Front ends: notebooks' steps, widgets, the CLI, papermill runs, JupyterLab. Nothing below imports them.
FRONT = (
    "cookbook.walkthrough",
    "cookbook.widgets",
    "cookbook.cli",
    "cookbook.notebook_runner",
    "cookbook.lab",
    "cookbook.demo",
    "cookbook.__main__",
)
# The local CPU bench (cluster, shims, tiny assets, demo): it uses the engine; the engine never imports it.
LOCAL = "cookbook.local"
# Framework config modules: loaded by torchtitan (``--module``) in the job or the engine's child parser, never
# imported by the engine; their local-cpu functions may use the bench.
CONFIGS = "cookbook.recipes.configs"


def _engine(module: str) -> bool:
    return not (module in (LOCAL, CONFIGS) or module.startswith((*FRONT, LOCAL + ".", CONFIGS + ".")))


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "cookbook").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the cookbook modules it imports anywhere in its body (``from a import b`` counts ``a.b``
    when ``b`` is a module, else ``a``)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("cookbook") else None
                if found and found != module:
                    graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def subpackage(module: str) -> str:
    """``cookbook.recipes.torchtune`` -> ``cookbook.recipes``: a sub-package, or a top-level module, of ``cookbook``."""
    return ".".join(module.split(".")[:2])


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the sub-packages (and top-level modules) of ``cookbook``."""
    out: dict[str, set[str]] = {subpackage(m): set() for m in graph}
    for module, deps in graph.items():
        out[subpackage(module)] |= {subpackage(d) for d in deps} - {subpackage(module)}
    return out


# Loops between sub-packages that another item of issue #43 removes. This list only shrinks (a test below).
KNOWN_LOOPS: list[list[str]] = []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_import_loop_between_sub_packages():
    """Issue #43 item 4: e.g. recipes <-> data (a type the recipes read now a Protocol of theirs) and
    walkthrough -> local -> notebook_runner -> walkthrough (``make demo`` is a front end, ``cookbook.demo``)."""
    assert subpackage_graph({"cookbook.a.x": {"cookbook.b.y"}, "cookbook.b.y": {"cookbook.a.z"}}) == {
        "cookbook.a": {"cookbook.b"},
        "cookbook.b": {"cookbook.a"},
    }
    loops = cycles(subpackage_graph(import_graph()))
    assert [loop for loop in loops if loop not in KNOWN_LOOPS] == []
    assert [known for known in KNOWN_LOOPS if known not in loops] == [], "gone: take it off KNOWN_LOOPS"


def test_the_local_bench_imports_no_front_end():
    graph = import_graph()
    bad = {m: sorted(d for d in deps if d.startswith(FRONT)) for m, deps in graph.items() if m.startswith(LOCAL)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_engine_imports_neither_a_front_end_nor_the_local_bench():
    graph = import_graph()
    bad = {m: sorted(d for d in deps if not _engine(d)) for m, deps in graph.items() if _engine(m)}
    assert {m: d for m, d in bad.items() if d} == {}
    assert any(
        d.startswith(LOCAL + ".") for m, deps in graph.items() for d in deps if m.startswith(FRONT)
    )  # the rule has teeth


# DESIGN.md "The core and the layers on it": what renders and submits a job and reads its metrics.
CORE = (
    "cookbook.spec", "cookbook.profiles", "cookbook.gpus", "cookbook.versions", "cookbook.paths", "cookbook.noise",
    "cookbook.recipes", "cookbook.resolve", "cookbook.render", "cookbook.templating", "cookbook.slurm",
    "cookbook.executor", "cookbook.metrics", "cookbook.tracking", "cookbook.secure_files",
)  # fmt: skip
# The only places the core reaches a layer, each named in DESIGN.md: the planner's lead time and save sizes
# (resolve, once per submission), the profiler's schedule (the recipes' profiling overrides), and the Job API's
# goodput() and rehearse() (imported when called).
CORE_USES = {
    ("cookbook.resolve", "cookbook.planner.lead_time"),
    ("cookbook.resolve", "cookbook.planner.recipes"),
    ("cookbook.resolve", "cookbook.planner.recovery"),
    ("cookbook.recipes.torchtune", "cookbook.profiling.enable"),
    ("cookbook.recipes.torchtitan", "cookbook.profiling.enable"),
    ("cookbook.recipes.fsdp", "cookbook.profiling.enable"),
    ("cookbook.executor", "cookbook.analysis.goodput"),
    ("cookbook.executor", "cookbook.rehearsal.rehearse"),
}


def _core(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in CORE) and not module.startswith(CONFIGS)


def test_the_core_reaches_a_layer_only_where_design_names_it():
    graph = import_graph()
    uses = {(m, d) for m, deps in graph.items() if _core(m) for d in deps if not _core(d) and _engine(d)}
    assert uses - CORE_USES == set(), "a new core -> layer import: move it to the layer, or name it in DESIGN.md"
    assert CORE_USES - uses == set(), "DESIGN.md names a core -> layer import that is gone: drop it there and here"


def test_the_local_bench_is_only_reached_through_rendered_scripts():
    """A local-cpu job names the shims on its launch line; the engine's code never imports them."""
    from cookbook.recipes import get_recipe
    from cookbook.spec import make_spec

    launch = get_recipe("llama3_3_70b_lora").command(make_spec("llama3_3_70b_lora", profile="local-cpu"))
    assert launch.args[:2] == ("-m", "cookbook.local.compat.cpu")
    assert [p.name for p in (ROOT / "cookbook").rglob("*.py") if "sys.path.insert" in p.read_text()] == []


def test_importing_the_engine_loads_no_shim_and_no_triton_stand_in():
    code = (
        "import sys, cookbook.recipes, cookbook.render, cookbook.planner, cookbook.metrics; "
        "print([m for m in sys.modules if m.startswith(('cookbook.local.compat', 'triton', 'cookbook.local.assets'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
