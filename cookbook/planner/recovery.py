"""Node faults and checkpoints: how many spare nodes a job should hold, and how often it should save.

Faults are a Poisson process. Meta's Research SuperCluster measured a mean time to failure of 7.9 h for
1,024-GPU jobs and 1.8 h for 16,384-GPU jobs (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine
Learning Research Clusters", arXiv:2410.21680). The MTTF of a G-GPU job is the power law through both points,

    MTTF(G) = 7.9 h x (G / 1024) ** -a,   a = ln(7.9 / 1.8) / ln(16) = 0.53

(extrapolated below 1,024 and above 16,384 GPUs). A job of N nodes x g GPUs running H hours sees
``lambda = H / MTTF(N g)`` node faults on average. With K spare nodes in its allocation the job runtime swaps a
faulty node for a spare and resumes from the newest checkpoint; each fault beyond the K-th is a requeue, which
costs ``REQUEUE_WAIT_HOURS`` of the job's N g GPUs. The spares cost ``K g H`` GPU-hours idle. Both a swap and a
requeue redo the work since the last checkpoint, so that loss does not enter the choice of K:

    K* = argmin_K  K g H + REQUEUE_WAIT_HOURS N g E[max(0, X - K)],   X ~ Poisson(lambda)

Periodic saves: every ``ceil(save / (SAVE_BUDGET x step))`` steps, so that saving costs at most 5% of the
training time; the save is the stop-save :mod:`.lead_time` sizes, the step the planner's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cookbook.planner.core import Plan, plan
from cookbook.planner.lead_time import save_seconds
from cookbook.planner.recipes import RECIPES, ignorable_overrides

if TYPE_CHECKING:
    from cookbook.spec import JobSpec

# The facts, written once (Kokolis et al. 2024, arXiv:2410.21680, Meta RSC-1/RSC-2: MTTF by job size)
MTTF_SOURCE = "Meta RSC, arXiv:2410.21680"
MTTF_ANCHORS: tuple[tuple[int, float], tuple[int, float]] = ((1024, 7.9), (16384, 1.8))  # (GPUs, MTTF hours)
# The assumptions
REQUEUE_WAIT_HOURS = 0.5  # a fault no spare covers: the requeue's wait in the queue and start-up, all GPUs idle
SAVE_BUDGET = 0.05  # periodic saves may cost 5% of the step time


def mttf_exponent() -> float:
    """``a`` of ``MTTF(G) ~ G ** -a``: the slope of the power law through :data:`MTTF_ANCHORS` (0.53)."""
    (g1, t1), (g2, t2) = MTTF_ANCHORS
    return math.log(t1 / t2) / math.log(g2 / g1)


def mttf_hours(gpus: int) -> float:
    """Mean hours between node faults of a job on ``gpus`` GPUs (the power law of the module docstring)."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: need at least one GPU")
    g1, t1 = MTTF_ANCHORS[0]
    return t1 * math.pow(gpus / g1, -mttf_exponent())


def expected_faults(gpus: int, hours: float) -> float:
    """``lambda``: the node faults a ``gpus``-GPU job sees in ``hours`` on average."""
    return max(hours, 0.0) / mttf_hours(gpus)


def uncovered_faults(lam: float, spares: int) -> float:
    """``E[max(0, X - spares)]`` for ``X ~ Poisson(lam)``: the faults that outnumber the spares."""
    if lam <= 0:
        return 0.0
    covered = 0.0  # E[min(X, spares)] = sum_{j < spares} P(X > j)
    below = 0.0  # P(X <= j)
    for j in range(spares):
        below += math.exp(-lam + j * math.log(lam) - math.lgamma(j + 1))
        covered += max(0.0, 1.0 - below)
    return max(0.0, lam - covered)


@dataclass(frozen=True)
class SpareAdvice:
    """The spare nodes a job should hold, and what they cost and save (GPU-hours)."""

    nodes: int
    gpus_per_node: int
    hours: float
    spares: int
    expected_faults: float
    idle_gpu_hours: float  # the spares' GPUs, idle for the whole job
    saved_gpu_hours: float  # the requeue waits of the faults the spares cover, on the job's GPUs
    next_idle_gpu_hours: float  # one more spare: its idle cost ...
    next_saved_gpu_hours: float  # ... and what it would save on top

    @property
    def mttf_hours(self) -> float:
        return mttf_hours(self.nodes * self.gpus_per_node)

    @property
    def saved_hours(self) -> float:
        """Wall-clock hours of requeue waits the spares save on average."""
        return self.saved_gpu_hours / (self.nodes * self.gpus_per_node)

    def describe(self) -> str:
        gpus = self.nodes * self.gpus_per_node
        head = (
            f"{self.expected_faults:.3g} node faults expected in {self.hours:g} h on {gpus:,} GPUs "
            f"(MTTF {self.mttf_hours:.3g} h, {MTTF_SOURCE})"
        )
        if not self.spares:
            return (
                f"no spare node: {head}; one spare would idle {self.next_idle_gpu_hours:,.0f} GPU-h to save "
                f"~{self.next_saved_gpu_hours:,.1f} GPU-h of requeue waits"
            )
        plural = "s" if self.spares > 1 else ""
        return (
            f"{self.spares} spare node{plural} (--spare-nodes {self.spares}): {head}; the spare{plural} idle "
            f"{self.idle_gpu_hours:,.0f} GPU-h and save ~{self.saved_hours:.1f} h of requeue waits "
            f"({self.saved_gpu_hours:,.0f} GPU-h)"
        )


def suggest_spares(nodes: int, gpus_per_node: int, hours: float, max_spares: int | None = None) -> SpareAdvice:
    """The spare count K in ``0 .. max_spares`` (default ``max(8, nodes // 8)``) with the least expected cost:
    ``K g H`` idle GPU-hours plus ``REQUEUE_WAIT_HOURS x N g`` per fault beyond the K-th (module docstring);
    the fewest spares among equal costs."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1")
    gpus = nodes * gpus_per_node
    lam = expected_faults(gpus, hours)
    per_requeue = REQUEUE_WAIT_HOURS * gpus
    idle = gpus_per_node * max(hours, 0.0)
    top = max(8, nodes // 8) if max_spares is None else max_spares

    def cost(k: int) -> float:
        return k * idle + per_requeue * uncovered_faults(lam, k)

    best = min(range(top + 1), key=lambda k: (round(cost(k), 9), k))

    def saved(k: int) -> float:
        return per_requeue * (lam - uncovered_faults(lam, k))

    return SpareAdvice(
        nodes, gpus_per_node, hours, best, lam, best * idle, saved(best), idle, saved(best + 1) - saved(best)
    )


def save_interval_steps(save_seconds: float, step_seconds: float, budget: float = SAVE_BUDGET) -> int:
    """Steps between periodic saves so that a save of ``save_seconds`` costs at most ``budget`` of the training
    time at ``step_seconds`` a step: ``ceil(save / (budget x step))``, at least 1."""
    if step_seconds <= 0 or budget <= 0:
        raise ValueError("step_seconds and budget must be > 0")
    return max(1, math.ceil(save_seconds / (budget * step_seconds)))


@dataclass(frozen=True)
class SaveInterval:
    """A periodic-save interval and the estimates it comes from."""

    steps: int
    save_seconds: float
    step_seconds: float
    budget: float = SAVE_BUDGET

    def describe(self, key: str = "interval") -> str:
        save = f"{self.save_seconds:,.0f}" if self.save_seconds >= 10 else f"{self.save_seconds:.2g}"
        return (
            f"{key}={self.steps}: a save of ~{save} s every {self.steps:,} steps of "
            f"~{self.step_seconds:.2g} s (saving <= {100 * self.budget:.0f}% of the training time)"
        )


def sized_save_interval(
    recipes: Sequence[str],
    nodes: int,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> SaveInterval | None:
    """The periodic-save interval of a job running any of ``recipes`` (a script that runs one of several models
    names them all: the longest interval, so that none saves more than the budget) on ``nodes`` nodes; None when
    the planner has no model to size (a job using a trained model, a script of one's own) or the overrides do not
    plan (the recipe's own checks report them)."""
    found: SaveInterval | None = None
    for name in recipes:
        if name not in RECIPES:
            continue
        save = save_seconds([name], nodes, overrides)
        if not save:
            continue
        try:
            step = plan(name, nodes, gpus_per_node, gpu, **ignorable_overrides(dict(overrides or {}))).step_time_s
        except (ValueError, KeyError):
            continue
        interval = SaveInterval(save_interval_steps(save, step), save, step)
        if found is None or interval.steps > found.steps:
            found = interval
    return found


def sized_save_steps(spec: JobSpec, key: str | None, recipes: Sequence[str]) -> int | None:
    """The periodic-save interval (steps) a GPU job of ``recipes`` gets for its framework's ``key`` when the user
    did not set it (a user value, 0 included, is kept). None without a key, on ``local-cpu`` (its tests set their
    own intervals), without GPUs, or with no model to size. :func:`cookbook.resolve.resolve` calls it once a job."""
    if key is None or key in spec.overrides or spec.local_cpu:
        return None
    if not spec.profile_info.uses_gpus or not spec.gpus_per_node:
        return None
    interval = sized_save_interval(recipes, spec.nodes, spec.gpus_per_node, spec.profile_info.gpu, spec.overrides)
    return None if interval is None else interval.steps


def recovery_text(p: Plan, hours: float, overrides: Mapping[str, str] | None = None) -> str:
    """``cookbook plan``'s recovery lines for plan ``p`` running ``hours``: the spare nodes suggested (their idle
    cost beside the requeue waits they save) and the periodic-save interval of the recipe's framework, with the
    save time and the step time it comes from."""
    from cookbook.recipes import get_recipe

    advice = suggest_spares(p.nodes, p.gpus_per_node, hours)
    lines = [f"recovery over {hours:g} h (--hours):", f"  spares: {advice.describe()}"]
    recipe = get_recipe(p.recipe)
    key = recipe.save_interval_key  # the framework's key, on its recipe class
    save = save_seconds([p.recipe], p.nodes, overrides)
    if key is not None and save and p.step_time_s > 0:
        interval = SaveInterval(save_interval_steps(save, p.step_time_s), save, p.step_time_s)
        lines.append(f"  periodic save ({recipe.framework}): {interval.describe(key)}")
    return "\n".join(lines)
