"""What a recipe is, and the registry that finds recipes by name.

A recipe turns a validated :class:`cookbook.spec.JobSpec` into the pieces the sbatch template
needs. Each recipe module defines one subclass of :class:`Recipe` per recipe and registers an
instance with :func:`register_recipe` at import time (``import cookbook.recipes`` imports them all).

A recipe declares
- ``name``: the name users type (``cookbook render NAME``), e.g. ``llama3_3_70b_full``;
- ``framework``: ``torchtune``, ``torchtitan`` or ``fsdp`` (where its framework knowledge lives);
- ``description``: one line for ``cookbook recipes``;
and implements
- :meth:`Recipe.validate` -- every problem with the spec for this recipe (override keys exist in the
  real config, parallel degrees fit the GPUs, batch sizes sane, paths exist...), each phrased as
  what to change. Return ``[]`` when the job is fine. Never raise for a user error.
- :meth:`Recipe.command` -- the :class:`Launch` for the spec: which launcher (``torchrun`` or
  ``tune run``) and the program arguments after the launcher's own flags. The template adds the
  launcher flags (``--nnodes=$SLURM_JOB_NUM_NODES``, ``--nproc-per-node``, c10d rendezvous on the
  head node, ``--rdzv-id=$SLURM_JOB_ID``), so a recipe never writes node counts or addresses.
  Paths of files from :meth:`files` are written as ``$RECIPE_DIR/NAME`` (the folder the script and
  its configs are written to; the template sets ``RECIPE_DIR``).
- :meth:`Recipe.files` -- extra files written next to the script (configs), ``{name: text}``.
- :meth:`Recipe.resume` -- bash lines that, when the output folder already holds a checkpoint
  (requeue after preemption), append the arguments that resume from the newest one to the bash
  array ``RESUME_ARGS``. Default: nothing (the framework resumes by itself).

The ``local-cpu`` variant: when ``spec.profile == "local-cpu"`` the same recipe runs a tiny model on
CPU on the local cluster (gloo, one process per node). Recipes switch config and program for it
(e.g. ``-m cookbook.compat.cpu torchtune full_finetune_distributed --config tiny.yaml``); the
launcher flags and everything else stay the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from cookbook.spec import JobSpec

LOCAL_CPU = "local-cpu"


def path_problem(label: str, value: str, fix: str) -> str | None:
    """An error when a path given by the user is on this filesystem but missing (``fix`` says what to do).

    Only absolute paths whose top folder exists here are checked: a value with a shell variable
    (``$HOME``, ``${TINY_DIR}``), ``~``, a relative path or a Hub id is left to the job.
    """
    if "$" in value or not value.startswith("/"):
        return None
    top = Path("/", *Path(value).parts[1:2])
    if top.exists() and not Path(value).exists():
        return f"{label}={value} does not exist ({fix})"
    return None


@dataclass(frozen=True)
class Launch:
    """How a recipe is started on every node: ``LAUNCHER <launcher flags> *args "${RESUME_ARGS[@]}"``.

    ``args`` are plain strings, shell-quoted by the template; only ``$RECIPE_DIR``, ``$RUN_DIR`` and
    the names in ``variables`` still expand (nothing else does: no ``$(...)``, no globbing).
    """

    launcher: Literal["torchrun", "tune"]
    args: tuple[str, ...]
    # exported shell variables with defaults (``NAME=${NAME:-value}``); values and args may use
    # ``$RECIPE_DIR``, ``$RUN_DIR`` and earlier variables, e.g. ``{"TINY_DIR": "$RECIPE_DIR/tiny"}``
    variables: dict[str, str] = field(default_factory=dict)


class Recipe(ABC):
    """One training recipe; see the module docstring for the contract."""

    name: ClassVar[str]
    framework: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def validate(self, spec: "JobSpec") -> list[str]:
        """Every problem with ``spec`` for this recipe, each saying what to change ([] = fine)."""

    @abstractmethod
    def command(self, spec: "JobSpec") -> Launch:
        """The launcher and program arguments for ``spec`` (already validated)."""

    def files(self, spec: "JobSpec") -> dict[str, str]:
        """Extra files written next to the script, ``{file name: text}``."""
        return {}

    def warnings(self, spec: "JobSpec") -> list[str]:
        """Things worth telling the user that do not stop the job (e.g. a path not checkable here)."""
        return []

    def resume(self, spec: "JobSpec") -> str:
        """Bash lines appending resume arguments to ``RESUME_ARGS`` when a checkpoint exists."""
        return ""


_REGISTRY: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to the registry (a second recipe with the same name is an error)."""
    if recipe.name in _REGISTRY and type(_REGISTRY[recipe.name]) is not type(recipe):
        raise ValueError(f"two recipes named {recipe.name!r}: {type(_REGISTRY[recipe.name])} and {type(recipe)}")
    _REGISTRY[recipe.name] = recipe
    return recipe


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``KeyError`` naming the known recipes otherwise."""
    import cookbook.recipes  # noqa: F401  (registers every recipe)

    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def list_recipes() -> list[Recipe]:
    """All registered recipes, sorted by name."""
    import cookbook.recipes  # noqa: F401

    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
