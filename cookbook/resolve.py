"""JobSpec + recipe -> :class:`ResolvedJob`: the job validated once, its lead time and stop-save sizes computed once.

Everything downstream (the script, its configs, the Hub and path warnings, the runtime's switches) reads the
resolved job; :mod:`cookbook.render` asks neither the checks nor the planner again, and the recipes never ask the
planner: what they write from it (the periodic-save interval, a run-time model's sizes) is the spec's ``sizing``.
The checks are the one validation layer: :func:`cookbook.spec.type_problems` and :func:`cookbook.spec.check_spec`
(the Slurm/profile side), then the recipe's value rules and its own checks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from cookbook.planner.lead_time import MIN_SIGNAL_SECONDS, largest_save_bytes, save_seconds
from cookbook.planner.recipes import lora_rank_problem
from cookbook.planner.recovery import sized_save_steps
from cookbook.recipes import get_recipe
from cookbook.recipes.base import Recipe
from cookbook.spec import (
    LOCAL_CPU_DEFAULTS,
    JobSpec,
    ProfileError,
    Sizing,
    SpecError,
    check_spec,
    profiles,
    type_problems,
)
from cookbook.tracking import tracker_problems
from cookbook_runtime.decide import stop_lead_seconds


@dataclass(frozen=True)
class ResolvedJob:
    """A job ready to render: ``spec`` with its ``signal_seconds`` and ``sizing`` set, the ``recipe`` that renders
    it, and what its stop-save writes, each None where the profile has nothing to size (no GPUs: small models that
    save at once): ``save_seconds`` (the largest stop-save's, safety included), ``checkpoint_bytes`` (the largest
    save a run writes), ``run_time_sizes`` (the script's variables holding them when it picks its model at run
    time, :meth:`Recipe.run_time_sizes`; None: written as numbers)."""

    spec: JobSpec
    recipe: Recipe
    save_seconds: float | None = None
    checkpoint_bytes: int | None = None
    run_time_sizes: tuple[str, str] | None = None

    @property
    def lead_from_signal(self) -> bool:
        """Whether the ranks agree on a stop every N steps within ``#SBATCH --signal``'s lead (else every step)."""
        return self.save_seconds is not None and bool(self.spec.signal_seconds)


def resolve(spec: JobSpec, recipe: Recipe | None = None) -> ResolvedJob:
    """``spec`` validated (:class:`SpecError` with every problem) and resolved. ``recipe``: render with this one
    instead of the spec's (e.g. the FSDP script for any model, whose lead time is its largest model's); the spec
    is still checked against its own recipe when the two differ."""
    if recipe is not None and recipe.name == spec.recipe:
        return _sized(spec, recipe)
    if typed := type_problems(spec):
        raise SpecError(typed)
    try:
        own: Recipe | None = get_recipe(spec.recipe)
        missing = ""
    except KeyError as e:
        own, missing = None, str(e.args[0])
    job = _sized(spec, own) if own is not None and recipe is None else None
    own = _check(spec, job.spec if job else with_signal(spec, recipe or own), own, missing)
    return job or _sized(spec, recipe or own)


def placed(spec: JobSpec, script_path: str | Path) -> JobSpec:
    """``spec`` as written to ``script_path``: the script's name, and its folder as the recipe folder unless
    ``spec.recipe_dir`` says otherwise (the start-up paths are resolved and checked against it): resolve the
    placed spec."""
    script_path = Path(script_path)
    return replace(spec, script_name=script_path.name, recipe_dir=spec.recipe_dir or str(script_path.parent.resolve()))


def _sized(spec: JobSpec, recipe: Recipe) -> ResolvedJob:
    """The lead time and save sizes of ``recipe``'s stop-save and the figures it writes (:func:`sizing`), computed
    once (none on a profile without GPUs)."""
    if spec.local_cpu:
        return ResolvedJob(with_signal(spec, recipe), recipe)
    seconds = save_seconds(recipe.stop_save_recipes(), spec.nodes, spec.overrides)
    biggest = largest_save_bytes(recipe.stop_save_recipes(), spec.overrides) if recipe.trains else 0
    at_run_time = recipe.run_time_sizes()
    if spec.signal_seconds is None and not at_run_time:
        spec = replace(spec, signal_seconds=stop_lead_seconds(seconds))
    if spec.sizing is None:
        spec = replace(spec, sizing=sizing(spec, recipe))
    return ResolvedJob(with_signal(spec, recipe), recipe, seconds, biggest, at_run_time)


def sizing(spec: JobSpec, recipe: Recipe) -> Sizing:
    """What ``recipe`` writes from the planner into ``spec``'s job: the periodic-save interval of its framework's
    key (:func:`cookbook.planner.recovery.sized_save_steps`) and, for a script that picks its model at run time,
    each model's largest save and stop-save seconds."""
    models = recipe.stop_save_recipes()
    try:
        interval = sized_save_steps(spec, recipe.save_interval_key, models)
    except ProfileError:  # an unknown profile or a profile file with a mistake: check_spec reports it
        interval = None
    if not recipe.run_time_sizes():
        return Sizing(interval)
    nodes, overrides = spec.nodes, spec.overrides
    saves = {m: (largest_save_bytes((m,), overrides), save_seconds((m,), nodes, overrides)) for m in models}
    return Sizing(interval, saves)


def with_signal(spec: JobSpec, recipe: Recipe | None) -> JobSpec:
    """``spec`` with ``signal_seconds`` set: the user's, else on a GPU profile the lead time ``recipe``'s stop-save
    needs (:func:`cookbook_runtime.decide.stop_lead_seconds` of its size on ``spec.nodes``; a script that picks
    its model at run time: the spec's own recipe's; no recipe: two minutes), on ``local-cpu`` 30 s."""
    if spec.signal_seconds is not None:
        return spec
    if spec.local_cpu:
        return replace(spec, signal_seconds=LOCAL_CPU_DEFAULTS.signal_seconds)
    if recipe is None:
        return replace(spec, signal_seconds=MIN_SIGNAL_SECONDS)
    sized = (spec.recipe,) if recipe.run_time_sizes() else recipe.stop_save_recipes()
    return replace(spec, signal_seconds=stop_lead_seconds(save_seconds(sized, spec.nodes, spec.overrides)))


def _check(spec: JobSpec, lead: JobSpec, recipe: Recipe | None, missing: str) -> Recipe:
    """``recipe``, or :class:`SpecError` with every problem of ``spec`` (``lead``: it with its lead time;
    ``recipe``: its own, None when ``missing`` says why): the Slurm/profile side (:func:`check_spec`, the lead
    time held against ``--time``), the recipe's value rules (:meth:`Recipe.value_problems`: a LoRA rank, a
    learning rate > 0; a LoRA rank within the model's hidden size) and its own checks, the tracker's. A wrong
    value is said alone: the lead time computed from it is not held against ``--time``."""
    values = [] if recipe is None else recipe.value_problems(spec)
    if recipe is not None and not values and (rank := lora_rank_problem(spec.recipe, spec.overrides)):
        values.append(rank)
    source = "" if spec.signal_seconds is not None else " (the recipe's lead time for its stop-save)"
    problems = check_spec(spec if values else lead, signal_source=source)
    if recipe is None:
        raise SpecError(problems + [missing])
    try:
        known = spec.profile in profiles()
    except ProfileError:  # a profile file with a mistake: check_spec reported it
        known = False
    problems += values
    if known and not problems:  # recipe checks assume a known profile and a job the checks above accept
        problems += recipe.validate(spec)
    problems += tracker_problems(spec)
    if spec.program_args and recipe.framework != "script":
        problems.append(
            f"program arguments ({' '.join(spec.program_args)}) are for the script recipe; {spec.recipe} takes --set "
            "KEY=VALUE"
        )
    if problems:
        raise SpecError(problems)
    return recipe
