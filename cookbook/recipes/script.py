"""Your own training script as a recipe: ``cookbook render script train.py --nodes 2 -- ARGS``.

The program (one Python file) is copied next to the sbatch script and started by torchrun on every node
with the same launcher, rendezvous, stop-save and requeue, profile environment and checks as the framework
recipes; its arguments are the ones after ``--`` (``JobSpec.program_args``), shell-quoted, where
``$RUN_DIR`` and ``$RECIPE_DIR`` still expand. The program finds, in its environment: torchrun's
``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (``init_process_group()`` needs no
arguments), ``RUN_DIR`` (the run folder: checkpoint there and resume from the newest one after a requeue;
a requeued job starts the program again with the same arguments) and, with ``--tracker``, the tracker run's
names (:mod:`cookbook.tracking`: ``COOKBOOK_TRACKER``, ``COOKBOOK_RUN_NAME``, ``COOKBOOK_TB_DIR``, ``WANDB_*``,
``MLFLOW_*``), which it logs to itself.
"""

from __future__ import annotations

import functools
from pathlib import Path

from cookbook.recipes.base import Launch, Recipe, register_factory
from cookbook.recipes.shims import assets_variables
from cookbook.spec import JobSpec


class ScriptRecipe(Recipe):
    """``script:PROGRAM.py``: one's own torchrun program; see the module docstring."""

    framework = "script"

    def __init__(self, path: Path):
        self.path = path
        self.name = f"script:{path}"  # the registry sets the name as typed
        self.description = f"your torchrun program {path.name}"

    def validate(self, spec: JobSpec) -> list[str]:
        problems = []
        if spec.overrides:
            problems.append(
                f"the script recipe has no config to --set ({', '.join(spec.overrides)}): pass the program's own "
                f"arguments after --, e.g. cookbook render script {self.path.name} -- --lr 0.1"
            )
        if not self.path.is_file():
            return problems + [f"{self.path}: no such program"]
        try:
            compile(self.path.read_text(), str(self.path), "exec")
        except SyntaxError as e:
            problems.append(f"{self.path.name} line {e.lineno}: {e.msg} (Python cannot compile it)")
        except UnicodeDecodeError:
            problems.append(f"{self.path.name}: not a Python text file")
        return problems

    def files(self, spec: JobSpec) -> dict[str, str]:
        return {self.path.name: self.path.read_text()}

    def command(self, spec: JobSpec) -> Launch:
        # the small models' assets, for a program that wants them (as the framework recipes have)
        return Launch("torchrun", (f"$RECIPE_DIR/{self.path.name}", *spec.program_args), assets_variables(spec))

    def warnings(self, spec: JobSpec) -> list[str]:
        if (
            spec.requeue
            and "RUN_DIR" not in self.path.read_text()
            and not any("$RUN_DIR" in a for a in spec.program_args)
        ):
            return [
                f"{self.path.name} does not mention RUN_DIR: after a requeue it starts again from the beginning unless "
                "it checkpoints into the run folder ($RUN_DIR) and resumes from there"
            ]
        return []


@functools.cache
def own_script(rest: str) -> ScriptRecipe:
    """``script:PROGRAM.py``; KeyError with one line naming what to change."""
    path = Path(rest).expanduser().resolve()
    if not rest.endswith(".py"):
        raise KeyError(f"script:{rest}: give a Python program (a .py file torchrun starts on every node)")
    if not path.is_file():
        raise KeyError(f"script:{rest}: no such program {rest}")
    return ScriptRecipe(path)


register_factory("script", own_script, "script PROGRAM.py [-- ARGS]")
