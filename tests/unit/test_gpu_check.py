"""The GPU check (issue 31, ``benchmarks/gpu_check.py``): its CPU mode end to end, and its arithmetic.

The CPU mode runs the same code paths as a device run -- every recipe's training program (tiny shapes, 3 steps,
through the local bench's CPU entry point), the stop-save and resume of torchtitan and torchtune, each A/B toggle,
the results file and its tables -- so a lent GPU's minutes are not spent finding a bug of the script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cookbook.planner import get_model, recipe_defaults
from cookbook.planner.estimate import Settings

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402
import gpu_check_figures as figures  # noqa: E402
import gpu_check_programs as progs  # noqa: E402
from gpu_check_parts import Context  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tiny_assets: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One CPU-mode check (tiny shapes, 3 steps, two parts at a time): its results file and output."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    out = tmp / "results.json"
    cmd = [sys.executable, str(BENCH / "gpu_check.py"), "--cpu", "--out", str(out), "--work", str(tmp / "work")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
    return {
        "result": json.loads(out.read_text()),
        "out": out,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "rc": r.returncode,
    }


def test_every_program_ran_on_cpu_with_a_rate_and_a_planner_estimate(cpu_run: dict[str, Any]) -> None:
    rows = {(r["program"], r["variant"]): r for r in cpu_run["result"]["programs"]}
    for name in progs.PROGRAMS:
        row = rows[(name, "base")]
        assert row["status"] == "ok", f"{name}: {row['error']}"
        assert row["rate"] > 0 and row["steps"] >= 2 and row["peak_gib"] > 0
        assert row["planner"]["rate"] > 0 and row["compare"]["rate_ratio"] is not None
        assert row["mfu"] is not None  # the nominal CPU peak: the arithmetic ran
    assert rows[("titan_llama3", "base")]["anchor"]["rate"] == 5762
    assert cpu_run["rc"] == 0, cpu_run["stderr"][-3000:]


def test_the_stop_saves_land_at_the_held_step_and_resume_with_nothing_redone(cpu_run: dict[str, Any]) -> None:
    saves = {s["program"]: s for s in cpu_run["result"]["stop_saves"]}
    assert set(saves) == set(progs.STOP_SAVE_PROGRAMS)
    for name, s in saves.items():
        assert s["status"] == "ok", f"{name}: {s.get('error')}"
        assert s["saved_step"] == s["stop_at"] == progs.STEPS["cpu"].stop_at
        assert s["resumed_at"] == s["saved_step"] + 1 and s["steps_redone"] == 0
        assert s["bytes"] > 0 and s["save_s"] >= 0 and s["signal_s"] is not None


def test_each_ab_toggle_ran_against_its_base(cpu_run: dict[str, Any]) -> None:
    result = cpu_run["result"]
    ab = {(a["program"], a["variant"]): a for a in result["ab"]}
    assert set(ab) == set(progs.DEFAULT_VARIANTS["cpu"])
    for key, a in ab.items():
        assert a["status"] == "ok" and a["ratio"] > 0 and a["log_ratio"] > 0, key
    assert ab[("tune_full", "compile")]["base_setting"] == "compile True"  # the recipe compiles; the variant not


def test_the_results_file_has_the_schema_and_says_cpu(cpu_run: dict[str, Any]) -> None:
    result = cpu_run["result"]
    assert figures.validate(result) == []
    assert result["telemetry"]["nvml"].startswith("NVML did not start")  # no driver here; a lent GPU: "ok", rows
    assert result["mode"] == "cpu" and result["device"]["name"] == "cpu"
    assert result["versions"]["torch"] and result["imports"]["torchtune"] == "ok"
    assert len(result["matmul"]["tflops"]) == 5 and result["matmul"]["spread"] is not None
    assert all(p["status"] == "ran" for p in result["budget"]), result["budget"]


def test_the_table_renders_from_the_file(cpu_run: dict[str, Any], tmp_path: Path) -> None:
    table = cpu_run["out"].with_suffix(".md").read_text()
    for name in progs.PROGRAMS:
        assert f"| {name} | base |" in table
    for heading in ("| pre-flight matmul |", "| stop-save |", "| A/B |", "Mode **cpu**"):
        assert heading in table
    r = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--table", str(cpu_run["out"])],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == table.strip()
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{gpu_check.TABLE_BEGIN}\nnone yet\n{gpu_check.TABLE_END}\n")
    with pytest.raises(SystemExit, match="only a GPU run"):
        gpu_check.write_readme(cpu_run["result"], readme)
    gpu_check.write_readme(cpu_run["result"] | {"mode": "gpu"}, readme)
    assert "| titan_llama3 | base |" in readme.read_text() and "none yet" not in readme.read_text()


# ----------------------------------------------------------------------------------------- the pure parts


def test_mfu_of_the_published_anchor_is_the_planners_33_7_percent() -> None:
    """torchtitan's 5,762 tokens/s/GPU on H100 (989 TFLOP/s) is 33.7% MFU (cookbook/planner/hardware.py)."""
    model = get_model("llama3_1_8b")
    s = Settings(seq_len=8192, micro_batch=2, checkpointing="selective")
    assert figures.mfu(5762, figures.flops_per_unit(model, s), 989.0) == pytest.approx(0.337, abs=0.001)
    assert figures.mfu(None, 1.0, 989.0) is None and figures.mfu(100.0, 1.0, None) is None


def test_planner_over_measured_and_the_25_percent_flag() -> None:
    assert figures.rate_tolerance() == 0.25
    assert figures.ratio(125.0, 100.0) == 1.25 and not figures.off(1.25, 0.25)
    assert figures.off(figures.ratio(126.0, 100.0), 0.25) and figures.off(0.74, 0.25) and not figures.off(0.75, 0.25)
    assert figures.ratio(1.0, 0.0) is None and figures.ratio(None, 1.0) is None and not figures.off(None, 0.25)
    planned = {"rate": 130.0, "peak_gib": 10.0}
    assert figures.compare(100.0, 10.0, planned) == {"rate_ratio": 1.3, "rate_off": True, "memory_ratio": 1.0,
                                                     "memory_off": False}  # fmt: skip


def test_rates_and_spread() -> None:
    assert figures.steady_rate({1: 10.0, 2: 100.0, 3: 110.0, 4: 90.0}, warmup=1) == 100.0
    assert figures.steady_rate({1: 10.0}, warmup=3) == 10.0 and figures.steady_rate({}, 1) is None
    assert figures.spread([90.0, 100.0, 110.0]) == pytest.approx(0.2) and figures.spread([]) is None
    # wall clock: steps 2..4 (after one warm-up step) arrived over 4 s, 1,000 tokens a step -> 500 tokens/s
    assert figures.wall_rate({1: 0.0, 2: 10.0, 3: 12.0, 4: 14.0}, warmup=1, units_per_step=1000) == 500.0
    assert figures.wall_rate({1: 0.0, 2: 10.0}, warmup=1, units_per_step=1000) is None


def test_the_deadline_planner_skips_what_does_not_fit() -> None:
    fits = figures.slot(100, remaining_s=300)
    assert fits.run and fits.timeout_s == 200
    assert figures.slot(100, remaining_s=150).timeout_s == 140  # never past the deadline (less the reserve)
    late = figures.slot(100, remaining_s=105)
    assert not late.run and "does not fit" in late.reason
    plan = figures.plan_budget([("a", 100), ("b", 300), ("c", 50)], deadline_s=200, reserve_s=0)
    assert [(n, fit) for n, _, _, fit in plan] == [("a", True), ("b", False), ("c", True)]
    two = figures.plan_budget([("a", 100), ("b", 100), ("c", 100)], deadline_s=200, reserve_s=0, jobs=2)
    assert [end for _, _, end, _ in two] == [100, 100, 200]


def test_execute_skips_parts_after_a_failure_and_past_the_deadline(tmp_path: Path) -> None:
    import time

    paths = progs.Paths(tmp_path, tmp_path, tmp_path)
    ctx = Context("cpu", 1, paths, tmp_path, deadline=time.monotonic() + 100)
    ran: list[str] = []

    def ok(name: str) -> Any:
        return lambda slot: ran.append(name)

    def boom(slot: figures.Slot) -> None:
        raise RuntimeError("it broke")

    tasks = [gpu_check.Task("a", 1, ok("a")), gpu_check.Task("b", 1, boom), gpu_check.Task("c", 1, ok("c"), ("b",)),
             gpu_check.Task("d", 500, ok("d")), gpu_check.Task("e", 1, ok("e"), ("a",))]  # fmt: skip
    records = {r["part"]: r for r in gpu_check.execute(ctx, tasks, 1, {})}
    assert ran == ["a", "e"]
    assert records["b"]["status"] == "failed" and "it broke" in records["b"]["reason"]
    assert records["c"]["status"] == "skipped" and "needs b" in records["c"]["reason"]
    assert records["d"]["status"] == "skipped" and "does not fit the deadline" in records["d"]["reason"]
    assert [t.name for t in gpu_check.only(tasks, {"e"})] == ["a", "e"]


def test_anchors_come_from_planner_vs_published() -> None:
    bench = figures.published()
    rates = {a.what.strip(): a.published_rate for a in bench.ANCHORS if a.source == bench.TORCHTITAN_PERF}
    base, compiled = figures.anchor("titan_llama3", "base"), figures.anchor("titan_llama3", "compile")
    lora = figures.anchor("tune_lora", "base")
    assert base is not None and compiled is not None and lora is not None
    assert (base["rate"], compiled["rate"]) == (5762, 6667) == (rates[base["what"]], rates[compiled["what"]])
    assert lora["rate"] == 984.85 and lora["world"] == 16
    assert figures.anchor("fsdp", "base") is None


def test_programs_run_the_recipes_settings_and_the_toggles_flip_them() -> None:
    for p in progs.PROGRAMS.values():
        recipe = recipe_defaults(p.recipe).settings
        s = progs.settings(p, "gpu")
        assert (s.seq_len, s.micro_batch, s.checkpointing, s.compile, s.lora_rank) == (
            recipe.seq_len, recipe.micro_batch, recipe.checkpointing, recipe.compile, recipe.lora_rank)  # fmt: skip
        assert progs.settings(p, "gpu", progs.VARIANTS["compile"]).compile != s.compile
        assert progs.settings(p, "gpu", progs.VARIANTS["ac"]).checkpointing != s.checkpointing
    shape = progs.planner_shape(progs.PROGRAMS["titan_llama3"], "gpu")
    assert shape.layers == 4 and shape.hidden == get_model("llama3_1_8b").hidden  # real width, fewer blocks
    with pytest.raises(ValueError, match="no compile switch"):
        progs.check_variant(progs.PROGRAMS["fsdp"], progs.VARIANTS["compile"])
    for program, variant in progs.DEFAULT_VARIANTS["gpu"] + progs.DEFAULT_VARIANTS["cpu"]:
        progs.check_variant(progs.PROGRAMS[program], progs.VARIANTS[variant])


def test_validate_names_what_is_wrong() -> None:
    assert "mode 'tpu'" in figures.validate({"schema": figures.SCHEMA, "mode": "tpu"})
    row = dict.fromkeys(figures.PROGRAM_KEYS) | {"program": "x", "variant": "base", "status": "failed"}
    problems = figures.validate({"programs": [row]})
    assert any("failed without an error" in p for p in problems) and any("budget: missing" in p for p in problems)
