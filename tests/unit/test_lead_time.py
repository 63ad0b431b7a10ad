"""The ``--signal`` lead time: by default each recipe's GPU script is signalled early enough for its model's
stop-save (cookbook/planner/lead_time.py); the user's --signal-seconds wins; a lead time not shorter than --time
is refused in one line; benchmarks/README.md's table is what render writes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook.planner.lead_time import WRITE_BYTES_PER_S, stop_save_bytes
from cookbook.recipes.fsdp import FsdpAnyModel
from cookbook.render import generated_specs, render_job
from cookbook.spec import JobSpec, SpecError, make_spec
from cookbook_runtime.decide import REQUEUE_SECONDS, STEP_SECONDS

ROOT = Path(__file__).resolve().parents[2]


def _signal(script: str) -> int:
    m = re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", script, re.M)
    assert m, "no --signal line"
    return int(m[1])


def test_the_70b_full_script_is_signalled_in_time_for_its_checkpoint():
    """rank 0 writes 423 GB alone: at the assumed 1 GB/s the save alone takes over 7 minutes"""
    size, per_node = stop_save_bytes("llama3_3_70b_full") or (0, True)
    assert 420e9 < size < 430e9 and not per_node
    lead = _signal(render_job(make_spec("llama3_3_70b_full", "nebius", nodes=2)).script)
    assert lead >= STEP_SECONDS + REQUEUE_SECONDS + size / WRITE_BYTES_PER_S and lead == 960
    # the committed copy-paste scripts say the same
    for path in (ROOT / "slurm-recipes" / "torchtune").glob("llama3_3_70b_full.*.sbatch"):
        assert _signal(path.read_text()) == (30 if "local-cpu" in path.name else 960), path.name


def test_the_lead_time_follows_the_model_and_the_nodes():
    lead = {r: _signal(render_job(make_spec(r, "generic")).script) for r in ("llama3_3_70b_lora", "llama3_8b_c4")}
    assert lead == {"llama3_3_70b_lora": 120, "llama3_8b_c4": 180}
    # the job's overrides count: a rank-64 adapter is 4x a rank-16 one
    rank16, rank64 = (
        stop_save_bytes("llama3_3_70b_lora"),
        stop_save_bytes("llama3_3_70b_lora", {"model.lora_rank": "64"}),
    )
    assert rank16 and rank64 and rank64[0] == 4 * rank16[0]
    # DCP: every node writes its shards, so 16 nodes save a 70B state 8x faster than 2
    assert _signal(render_job(make_spec("fsdp_llama3_1_70b", "generic", nodes=16)).script) == 180
    # the any-model FSDP script: its default model's lead (a larger MODEL: the runtime stops it in time itself)
    spec = next(s for s in generated_specs() if s.script_name == "fsdp.generic.sbatch")
    assert _signal(render_job(spec, FsdpAnyModel()).script) == 180
    assert _signal(render_job(make_spec("llama3_3_70b_full", "local-cpu")).script) == 30


def test_the_users_value_wins_and_a_lead_time_longer_than_the_job_is_refused():
    assert _signal(render_job(make_spec("llama3_3_70b_full", "generic", signal_seconds=300)).script) == 300
    assert _signal(render_job(JobSpec("llama3_3_70b_full", signal_seconds=60)).script) == 60
    with pytest.raises(SpecError, match=r"signal_seconds=960 \(the recipe's lead time for its stop-save\) is not"):
        render_job(make_spec("llama3_3_70b_full", "generic", time="00:15:00"))
    with pytest.raises(SpecError, match=r"signal_seconds=900 is not shorter than time=00:15:00"):
        render_job(make_spec("llama3_3_70b_full", "generic", time="00:15:00", signal_seconds=900))
    out = subprocess.run(
        [sys.executable, "-m", "cookbook", "render", "llama3_3_70b_full", "--time", "00:15:00", "-o", "/dev/null"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--signal-seconds" in out.stderr


def test_the_benchmarks_table_is_what_render_writes():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    table = text.split("**The lead time each script gets**", 1)[1].split("\n\n")[1]
    rows = {m[1]: int(m[2]) for m in re.finditer(r"^\| `(\w+)` \(.*\| \**(\d+)\**? \|$", table, re.M)}
    assert rows.keys() >= {"llama3_3_70b_full", "llama3_3_70b_lora", "llama3_8b_c4", "flux_schnell"}, table
    for recipe, documented in rows.items():
        assert _signal(render_job(make_spec(recipe, "generic", nodes=2)).script) == documented, recipe
