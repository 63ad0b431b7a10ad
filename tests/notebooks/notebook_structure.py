"""What a walkthrough notebook must look like, checked on the .ipynb a user edits and saves in JupyterLab.

:func:`problems` lists every broken rule, one line each, naming the cell (numbered from 0) and what to do.
The rules:

- **valid and clean**: nbformat-valid; no outputs, no execution counts, no saved widget state, no
  execution timings (clear them: *Edit > Clear Outputs of All Cells*, or
  ``jupyter nbconvert --clear-output --inplace notebooks/NAME.ipynb``).
- **prose first, prose last**: the first cell is markdown with a ``# `` title; there is a "What to look
  at" section; the last cell is markdown (or shows the job's outputs).
- **parameters**: exactly one code cell tagged ``parameters``; it only assigns literals, and its names and
  values are :func:`cookbook.notebook_runner.default_parameters` of the notebook (the one place they live).
- **thin steps**: every other code cell is valid Python with at most 6 lines of code (blank and comment
  lines not counted), defines nothing and has no control flow (no ``def``, ``class``, ``lambda``,
  ``for``, ``while``, ``if``, ``try``, ``with`` statement; comprehensions and ``x if c else y`` are
  expressions and allowed), and makes at least one call or import: the logic lives in the package.
- **shared cells come from the package**: a job notebook (one taking
  :func:`cookbook.notebook_runner.cluster_parameters`) has every cell of ``SHARED_CELLS`` in that order,
  as written there (comments and formatting aside); a notebook that imports ``cookbook.walkthrough``
  does it with the shared ``setup`` cell.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat

from cookbook.notebook_runner import SHARED_CELLS, cluster_parameters, default_parameters

MAX_CODE_LINES = 6
_STATEMENTS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.If,
    ast.Try,
    ast.With,
    ast.AsyncWith,
)


def _is_parameters(cell: Any) -> bool:
    return "parameters" in cell.get("metadata", {}).get("tags", [])


def _code_lines(source: str) -> int:
    return sum(1 for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#"))


def _same_code(a: str, b: str) -> bool:
    try:
        return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except SyntaxError:
        return False


def _clean(nb: Any) -> list[str]:
    out = []
    if "widgets" in nb.metadata:
        out.append(
            "widget state is saved in the notebook's metadata (Settings > Save Widget State "
            "Automatically: off, then clear it)"
        )
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            out.append(f"cell {i} has outputs: clear them before committing (Edit > Clear Outputs of All Cells)")
        if cell.get("execution_count") is not None:
            out.append(f"cell {i} has an execution count: clear outputs before committing")
        if "execution" in cell.metadata:
            out.append(f"cell {i} has execution timings in its metadata: remove `execution`")
    return out


def _parameters(nb: Any, name: str) -> list[str]:
    tagged = [i for i, c in enumerate(nb.cells) if _is_parameters(c)]
    if len(tagged) != 1:
        return [f"{len(tagged)} cells are tagged `parameters`; papermill needs exactly one"]
    i = tagged[0]
    if nb.cells[i].cell_type != "code":
        return [f"cell {i} is tagged `parameters` but is not a code cell"]
    try:
        tree = ast.parse(nb.cells[i].source)
    except SyntaxError as e:
        return [f"cell {i} (parameters) is not valid Python: {e.msg} (line {e.lineno})"]
    found: dict[str, Any] = {}
    for stmt in tree.body:
        try:
            assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            assert isinstance(stmt.targets[0], ast.Name)
            found[stmt.targets[0].id] = ast.literal_eval(stmt.value)
        except (AssertionError, ValueError):
            return [f"cell {i} (parameters), line {stmt.lineno}: only `name = literal` lines belong there"]
    expected = default_parameters(name)
    out = []
    for key in expected.keys() - found.keys():
        out.append(f"cell {i} (parameters) lacks `{key}` (default_parameters: {expected[key]!r})")
    for key in found.keys() - expected.keys():
        out.append(
            f"cell {i} (parameters) has `{key}`, which cookbook.notebook_runner.default_parameters "
            "does not know: add it there"
        )
    for key in found.keys() & expected.keys():
        if found[key] != expected[key]:
            out.append(
                f"cell {i} (parameters): {key} = {found[key]!r}, but cookbook.notebook_runner."
                f"default_parameters says {expected[key]!r}: change one place, then the other"
            )
    return out


def _steps(nb: Any) -> list[str]:
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _is_parameters(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError as e:
            out.append(f"cell {i} is not valid Python: {e.msg} (line {e.lineno})")
            continue
        if _code_lines(cell.source) > MAX_CODE_LINES:
            out.append(
                f"cell {i} has {_code_lines(cell.source)} lines of code (at most {MAX_CODE_LINES}): "
                "split the step, or move the logic into the package"
            )
        logic = sorted({type(n).__name__ for n in ast.walk(tree) if isinstance(n, _STATEMENTS)})
        if logic:
            out.append(
                f"cell {i} has {', '.join(logic)}: logic a reader would copy belongs in the package (the cell calls it)"
            )
        if not any(isinstance(n, (ast.Call, ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
            out.append(f"cell {i} calls nothing: a step calls the package")
    return out


def _shared(nb: Any, name: str) -> list[str]:
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code" and not _is_parameters(c)]
    out = []
    if set(cluster_parameters()) <= set(default_parameters(name)):
        at = 0
        for key, want in SHARED_CELLS.items():
            hit = next((k for k in range(at, len(code)) if _same_code(code[k][1], want)), None)
            if hit is None:
                out.append(
                    f"the shared `{key}` cell (cookbook.notebook_runner.SHARED_CELLS) is missing or "
                    f"out of order; it reads:\n{want}"
                )
            else:
                at = hit + 1
    imports_wt = [i for i, src in code if "import walkthrough" in src]
    if imports_wt and not any(_same_code(src, SHARED_CELLS["setup"]) for _, src in code):
        out.append(
            f"cell {imports_wt[0]} imports cookbook.walkthrough, but not as the shared `setup` cell:\n"
            f"{SHARED_CELLS['setup']}"
        )
    return out


def problems(path: str | Path) -> list[str]:
    """Every rule ``path`` breaks, one line each (empty when the notebook is fine)."""
    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        return [f"{path.name}: not a valid notebook: {e.message}"]
    out = _clean(nb)
    first, last = nb.cells[0] if nb.cells else None, nb.cells[-1] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        out.append("prose first: cell 0 must be markdown starting with a `# ` title")
    if last is not None and last.cell_type != "markdown" and "outputs" not in last.source:
        out.append("prose last: end with a markdown cell (what the reader has now, what is next)")
    if not any("What to look at" in c.source for c in nb.cells if c.cell_type == "markdown"):
        out.append("no markdown cell says `What to look at`")
    out += _parameters(nb, path.stem) + _steps(nb) + _shared(nb, path.stem)
    return [f"{path.name}: {p}" for p in out]
