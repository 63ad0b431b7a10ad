"""torchtitan's own config parser, run in a child process (``python -m cookbook.recipes.titan_parse``).

The process that validates a job (the login node's shell, the notebook's kernel) never imports torchtitan,
which imports triton and a GPU stack; nothing is patched there. The child reads one JSON request per line
on stdin, ``{"args": [...], "path": [folders]}`` (torchtitan's ``--module M --config F --a.b v`` flags; ``path``,
optional: folders searched first for the config module), and writes one JSON
line: ``{"config": <the parsed config as plain data> | null, "fields": [dotted field names], "error": ""}``.

Before torchtitan is imported, each ``module:function`` named in ``COOKBOOK_PRELOAD`` (comma-separated) is
called: a machine without the GPU stack names a stand-in there (the local CPU bench does, in its Makefile
and test set-up). The config module (``--module``) is found on ``PYTHONPATH``, which the parent sets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import sys
from typing import Any

PRELOAD_ENV = "COOKBOOK_PRELOAD"


def preload() -> None:
    """Call each ``module:function`` of ``$COOKBOOK_PRELOAD``."""
    for item in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        module, _, function = item.strip().partition(":")
        getattr(importlib.import_module(module), function)()


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
    from torchtitan.config.manager import ConfigManager

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cfg = ConfigManager().parse_args(args)
    except SystemExit:
        return {"config": None, "fields": [], "error": err.getvalue() or "torchtitan refused the arguments"}
    except ModuleNotFoundError as e:
        reason = f"torchtitan cannot be imported here ({type(e).__name__}: {e})"
        if e.name == "triton":
            reason += (
                f"; on a machine without the GPU stack name a stand-in in {PRELOAD_ENV} (the local bench: "
                "cookbook.local.compat.triton_standin:import_torchtitan_without_triton)"
            )
        return {"config": None, "fields": [], "error": reason}
    except Exception as e:  # noqa: BLE001  (torchtitan's own validation message)
        return {"config": None, "fields": [], "error": f"{type(e).__name__}: {e}"}
    return {"config": plain(cfg), "fields": field_paths(cfg), "error": ""}


def main() -> int:
    preload()
    for line in sys.stdin:
        request = json.loads(line)
        for folder in request.get("path", []):  # a config module of one's own: its folder
            if folder not in sys.path:
                sys.path.insert(0, folder)
                importlib.invalidate_caches()
        print(json.dumps(parse(request["args"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
