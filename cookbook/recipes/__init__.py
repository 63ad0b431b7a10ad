"""Training recipes; importing this package registers every recipe (see :mod:`cookbook.recipes.base`)."""

from __future__ import annotations

import importlib
from pathlib import Path

from cookbook.recipes.base import Launch, Recipe, StartPath, register_recipe
from cookbook.recipes.base import all_registered as list_recipes
from cookbook.recipes.base import registered as get_recipe
from cookbook.spec import LOCAL_CPU

for _name in ("torchtune", "torchtitan", "fsdp", "script", "use"):
    if (Path(__file__).parent / f"{_name}.py").exists():
        importlib.import_module(f"{__name__}.{_name}")


__all__ = ["LOCAL_CPU", "Launch", "Recipe", "StartPath", "get_recipe", "list_recipes", "register_recipe"]
