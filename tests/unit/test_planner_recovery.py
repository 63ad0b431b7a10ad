"""Planner, recovery: spare nodes against node faults (Poisson, Meta RSC's MTTF) and periodic-save intervals
(saving <= 5% of the step time) -- the formulas, the rendered configs of each framework and ``cookbook plan``."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from cookbook.cli import main as cli_main
from cookbook.planner.recovery import (
    MTTF_ANCHORS,
    REQUEUE_WAIT_HOURS,
    SaveInterval,
    expected_faults,
    mttf_exponent,
    mttf_hours,
    save_interval_steps,
    sized_save_interval,
    suggest_spares,
    uncovered_faults,
)


def test_the_mttf_power_law_goes_through_both_published_points():
    for gpus, hours in MTTF_ANCHORS:
        assert mttf_hours(gpus) == pytest.approx(hours)
    assert mttf_exponent() == pytest.approx(0.533, abs=1e-3)
    assert mttf_hours(16) == pytest.approx(72.6, abs=0.1)  # 2 nodes x 8: extrapolated below 1,024 GPUs
    assert expected_faults(1024, 7.9) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mttf_hours(0)


def test_uncovered_faults_is_the_poisson_tail_beyond_the_spares():
    for lam in (0.05, 1.0, 3.0, 9.1):
        direct = sum(x * math.exp(-lam) * lam**x / math.factorial(x) for x in range(1, 80))
        assert uncovered_faults(lam, 0) == pytest.approx(lam) == pytest.approx(direct)
        for k in (1, 2, 5):
            tail = sum((x - k) * math.exp(-lam) * lam**x / math.factorial(x) for x in range(k + 1, 80))
            assert uncovered_faults(lam, k) == pytest.approx(tail, abs=1e-12)
    assert uncovered_faults(0.0, 3) == 0.0
    assert uncovered_faults(9.1, 60) == pytest.approx(0.0, abs=1e-12)
    assert uncovered_faults(2000.0, 10) == pytest.approx(1990.0)  # no underflow of exp(-lambda)


@pytest.mark.parametrize(
    "nodes, hours, spares, faults",
    [
        (2, 4, 0, 0.055),  # one spare: 32 GPU-h idle against ~0.4 GPU-h of requeue waits
        (16, 4, 0, 0.167),
        (16, 24, 0, 1.00),  # one spare: 192 GPU-h idle against ~40 GPU-h
        (128, 24, 3, 3.04),  # 1,024 GPUs: the published MTTF, 7.9 h
        (1000, 24, 14, 9.10),
    ],
)
def test_suggested_spares(nodes, hours, spares, faults):
    advice = suggest_spares(nodes, 8, hours)
    assert advice.spares == spares
    assert advice.expected_faults == pytest.approx(faults, abs=0.01)
    assert advice.idle_gpu_hours == spares * 8 * hours
    # the choice is the cheapest: no K in range costs less, and one more spare would cost more than it saves
    per_requeue = REQUEUE_WAIT_HOURS * nodes * 8

    def cost(k: int) -> float:
        return k * 8 * hours + per_requeue * uncovered_faults(advice.expected_faults, k)

    assert all(cost(spares) <= cost(k) + 1e-9 for k in range(max(8, nodes // 8) + 1))
    assert advice.next_saved_gpu_hours < advice.next_idle_gpu_hours
    assert advice.saved_gpu_hours == pytest.approx(per_requeue * (faults - uncovered_faults(faults, spares)), rel=0.01)
    text = advice.describe()
    assert "\n" not in text and "arXiv:2410.21680" in text
    assert (f"--spare-nodes {spares}" in text) == (spares > 0)


def test_the_saved_time_is_the_covered_faults_requeue_waits():
    advice = suggest_spares(128, 8, 24)
    assert advice.saved_hours == pytest.approx(advice.saved_gpu_hours / 1024)
    assert advice.saved_gpu_hours > advice.idle_gpu_hours  # 1,200 GPU-h saved for 576 idle


def test_save_interval_steps_is_the_ceiling_of_save_over_the_budgeted_step():
    assert save_interval_steps(96, 2.3) == math.ceil(96 / (0.05 * 2.3)) == 835
    assert save_interval_steps(10, 1) == 200
    assert save_interval_steps(10, 1, budget=0.10) == 100
    assert save_interval_steps(0.01, 100) == 1  # at least one step
    assert save_interval_steps(0, 1) == 1
    with pytest.raises(ValueError):
        save_interval_steps(10, 0)


def test_the_sized_interval_uses_the_stop_save_and_the_planned_step():
    from cookbook.planner import plan
    from cookbook.planner.lead_time import save_seconds

    interval = sized_save_interval(["llama3_8b_c4"], 2, 8)
    assert interval is not None
    assert interval.save_seconds == save_seconds(["llama3_8b_c4"], 2)
    assert interval.step_seconds == plan("llama3_8b_c4", 2, 8).step_time_s
    assert interval.steps == save_interval_steps(interval.save_seconds, interval.step_seconds)
    # DCP writes per node: 8 times the nodes, an eighth of the save, an eighth of the interval (rounded up)
    assert sized_save_interval(["llama3_8b_c4"], 16, 8).steps == math.ceil(interval.steps / 8)  # type: ignore[union-attr]
    # a script running any of several models: the longest interval, so that none saves more than the budget
    both = sized_save_interval(["fsdp_llama3_1_8b", "fsdp_llama3_1_70b"], 2, 8)
    each = [sized_save_interval([r], 2, 8) for r in ("fsdp_llama3_1_8b", "fsdp_llama3_1_70b")]
    assert both is not None and both.steps == max(i.steps for i in each if i is not None)
    assert sized_save_interval(["tune:llama3_1/8B_lora", "nope"], 2, 8) is None  # no planner model: no interval
    assert "checkpoint.interval=7:" in SaveInterval(7, 12.0, 3.0).describe("checkpoint.interval")


# ---------------------------------------------------------------- the rendered GPU configs of each framework
def _rendered(recipe: str, profile: str = "generic", **overrides: str) -> str:
    from cookbook.render import render_job
    from cookbook.spec import make_spec

    job = render_job(make_spec(recipe, profile=profile, overrides=overrides))
    return job.script + "".join(job.files.values())


@pytest.mark.parametrize(
    "recipe, line",
    [
        ("llama3_3_70b_full", "save_every_n_steps: {}"),
        ("llama3_3_70b_lora", "save_every_n_steps: {}"),
        ("llama3_8b_c4", "--checkpoint.interval {}"),
        ("flux_schnell", "--checkpoint.interval {}"),
        ("fsdp_llama3_2_1b", "--checkpoint_freq={}"),
    ],
)
def test_a_gpu_render_carries_the_sized_interval_and_a_user_value_is_kept(recipe, line):
    from cookbook.recipes import get_recipe

    def has(text: str, steps: int) -> bool:
        return re.search(re.escape(line.format(steps)) + r"(?![0-9])", text) is not None

    key = get_recipe(recipe).save_interval_key  # type: ignore[attr-defined]
    sized = sized_save_interval([recipe], 2, 8)
    assert sized is not None
    assert has(_rendered(recipe), sized.steps)
    user = _rendered(recipe, **{key: "7"})
    assert has(user, 7) and not has(user, sized.steps)
    assert not has(_rendered(recipe, "local-cpu"), sized.steps)  # its tests set their own


def test_a_user_interval_of_zero_is_kept():
    from cookbook.recipes import get_recipe
    from cookbook.spec import Sizing, make_spec

    assert "save_every_n_steps: 0\n" in _rendered("llama3_3_70b_lora", save_every_n_steps="0")
    titan = get_recipe("llama3_8b_c4")
    spec = make_spec("llama3_8b_c4", profile="generic", overrides={"checkpoint.interval": "0"})
    args = titan.command(replace(spec, sizing=Sizing(save_interval=9))).args  # a sized interval: the user's wins
    assert args.count("--checkpoint.interval") == 1 and args[args.index("--checkpoint.interval") + 1] == "0"
    tune = make_spec("llama3_3_70b_lora", profile="generic", overrides={"save_every_n_steps": "0"})
    assert get_recipe(tune.recipe).config(replace(tune, sizing=Sizing(save_interval=9))).save_every_n_steps == 0


def test_resolve_sizes_the_interval_once_and_the_recipe_writes_it():
    """The recipes never ask the planner: resolve puts the planner's interval on the spec, the recipe writes it."""
    from cookbook.recipes import get_recipe
    from cookbook.resolve import resolve
    from cookbook.spec import make_spec

    job = resolve(make_spec("llama3_8b_c4", profile="generic"))
    sized = sized_save_interval(["llama3_8b_c4"], 2, 8)
    assert sized is not None and job.spec.sizing is not None and job.spec.sizing.save_interval == sized.steps
    args = job.recipe.command(replace(job.spec, sizing=replace(job.spec.sizing, save_interval=11))).args
    assert args[args.index("--checkpoint.interval") + 1] == "11"  # what the spec says, not asked again
    assert "--checkpoint.interval" not in get_recipe("llama3_8b_c4").command(make_spec("llama3_8b_c4")).args
    assert resolve(make_spec("llama3_8b_c4", profile="local-cpu")).spec.sizing is None  # its tests set their own


def test_the_any_model_fsdp_script_saves_at_the_longest_interval_of_its_models():
    from cookbook.recipes.fsdp import FsdpAnyModel
    from cookbook.resolve import resolve
    from cookbook.spec import make_spec

    recipe = FsdpAnyModel()
    sized = sized_save_interval(recipe.stop_save_recipes(), 2, 8)
    assert sized is not None
    spec = make_spec("fsdp_llama3_1_8b", profile="generic")
    job = resolve(spec, recipe)
    assert f"--checkpoint_freq={sized.steps}" in recipe.command(job.spec).args
    with pytest.raises(ValueError, match="save sizes are unset"):  # each model's sizes come from resolve
        recipe.command(spec)


# ---------------------------------------------------------------- cookbook plan
def test_cookbook_plan_prints_the_spares_and_the_save_interval(capsys):
    assert cli_main(["plan", "llama3_8b_c4", "--nodes", "128", "--hours", "24"]) == 0
    out = capsys.readouterr().out
    assert "recovery over 24 h (--hours):" in out
    assert "3 spare nodes (--spare-nodes 3)" in out and "idle 576 GPU-h" in out and "requeue waits" in out
    sized = sized_save_interval(["llama3_8b_c4"], 128, 8)
    assert sized is not None
    assert f"periodic save (torchtitan): checkpoint.interval={sized.steps}: a save of ~" in out
    # --hours defaults to a GPU profile's time limit (4 h)
    assert cli_main(["plan", "llama3_3_70b_lora"]) == 0
    out = capsys.readouterr().out
    assert "recovery over 4 h" in out and "no spare node" in out and "one spare would idle 32 GPU-h" in out
    assert "periodic save (torchtune): save_every_n_steps=" in out
    assert cli_main(["plan", "fsdp_llama3_1_8b", "--hours", "-1"]) == 2
