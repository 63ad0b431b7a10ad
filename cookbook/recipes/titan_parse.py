"""torchtitan's own config parser, run in a child process (``python -m cookbook.recipes.titan_parse``).

The process that validates a job (the login node's shell, the notebook's kernel) never imports torchtitan,
which imports triton and a GPU stack; nothing is patched there. The child reads one JSON request per line
on stdin, ``{"args": [...], "modules": [files]}`` (torchtitan's ``--module M --config F --a.b v`` flags;
``modules``, optional: config modules of one's own, imported from their files first), and writes one JSON
line: ``{"config": <the parsed config as plain data> | null, "fields": [dotted field names], "error": ""}``.
A request ``{"datasets": true}`` is answered ``{"datasets": {name: path}}``: torchtitan's dataset tables (a path
under ``tests/`` ships with torchtitan; any other is a Hub id every rank fetches when ``dataset_path`` is unset).

Where triton is not installed (a login node's CPU or aarch64 torch), the child imports torchtitan through
:mod:`cookbook_runtime.titan_import` first (the runtime's: the rehearsal's parse on a node uses it too); where
it is, nothing is patched. The config module (``--module``) is found on ``PYTHONPATH``, which the parent sets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import json
import os
import sys
from typing import Any

from cookbook_runtime.titan_import import import_torchtitan_without_triton


def plain(value: Any) -> Any:
    """A config dataclass as JSON-ready data (dicts, lists, numbers, strings; anything else as text)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def field_paths(value: Any, prefix: str = "") -> list[str]:
    """Dotted names of every field of a (nested) config dataclass."""
    out = []
    for f in dataclasses.fields(value):
        out.append(prefix + f.name)
        child = getattr(value, f.name, None)
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            out += field_paths(child, f"{prefix}{f.name}.")
    return out


def parse(args: list[str]) -> dict[str, Any]:
    """torchtitan's ``ConfigManager().parse_args(args)``: the config, its fields, or the parser's error text."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            from torchtitan.config.manager import ConfigManager

            cfg = ConfigManager().parse_args(args)
    except SystemExit:
        return {"config": None, "fields": [], "error": err.getvalue() or "torchtitan refused the arguments"}
    except ModuleNotFoundError as e:
        reason = f"torchtitan cannot be imported here ({type(e).__name__}: {e})"
        if e.name == "triton":  # a torchtitan module that imports triton, unknown to titan_import
            reason += "; add it to cookbook_runtime.titan_import.TORCHTITAN_TRITON_IMPORTERS"
        return {"config": None, "fields": [], "error": reason}
    except Exception as e:  # noqa: BLE001  (torchtitan's own validation message)
        return {"config": None, "fields": [], "error": f"{type(e).__name__}: {e}"}
    return {"config": plain(cfg), "fields": field_paths(cfg), "error": ""}


def dataset_paths() -> dict[str, str]:
    """torchtitan's own dataset tables, ``{dataset name: path}`` (text and FLUX; a table that does not import is
    left out)."""
    out: dict[str, str] = {}
    for module in ("torchtitan.hf_datasets.text_datasets", "torchtitan.models.flux.flux_datasets"):
        with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
            table = importlib.import_module(module).DATASETS
            out.update({str(name): str(cfg.path) for name, cfg in table.items()})
    return out


def load_module(file: str) -> None:
    """A config module of one's own, imported from its file under its stem (``--module STEM`` then finds it)."""
    name = os.path.splitext(os.path.basename(file))[0]
    if getattr(sys.modules.get(name), "__file__", None) == file:
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        return  # torchtitan's import then names the module it cannot find
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001  (torchtitan's own import reports it again, with its message)
        del sys.modules[name]


def main() -> int:
    # before anything imports torchtitan (the config modules below too); where triton is installed, a no-op.
    # A failure (torchtitan not installed) is left for parse() to report with the import's own message.
    with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(Exception):
        import_torchtitan_without_triton()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("datasets"):
            print(json.dumps({"datasets": dataset_paths()}), flush=True)
            continue
        for file in request.get("modules", []):
            load_module(file)
        print(json.dumps(parse(request["args"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
