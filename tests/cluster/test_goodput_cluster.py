"""The goodput ledger of a real requeued run on the local cluster: its parts add up to the allocation and
its "redone" part holds exactly the steps that ran twice.

One short torchtitan job (tiny Llama 3, 6 steps, a checkpoint every 3), killed without warning once step 4 is
logged and the step-3 checkpoint is complete (SIGKILL to its processes, as a node crash: no stop-save is possible,
unlike `scancel`/`scontrol requeue`, whose TERM the ranks answer with a save), then requeued and resumed from
step 3 (~2 minutes on 2 cores).
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime

import pytest
from cluster_wait import wait_done
from cluster_wait import wait_for as _wait_for

from cookbook.analysis.explain import explain_log
from cookbook.analysis.starts import split_starts
from cookbook.analysis.stragglers import straggler_lines
from cookbook.cli import main as cli_main
from cookbook.walkthrough import job_spec, submit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 6
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step:\s+(\d+)\s+loss")


def _log_steps(log) -> list[set[int]]:
    """Steps logged by each start of the script (the requeued job appends to the same log)."""
    text = _ANSI.sub("", log.read_text(errors="replace")) if log.exists() else ""
    return [{int(s) for s in _STEP.findall(part)} for job, part in split_starts(text) if job]


@pytest.fixture(scope="module")
def requeued(slurm, tiny_assets, tmp_path_factory):
    spec = job_spec(
        "llama3_8b_c4",
        profile="local-cpu",
        nodes=2,
        job_name="goodput",
        overrides={"training.steps": str(STEPS), "checkpoint.interval": "3", "metrics.log_freq": "1"},
        assets_dir=str(tiny_assets.root),
    )
    job = submit(spec, root=tmp_path_factory.mktemp("goodput"), client=slurm)
    checkpoint = job.run_dir / "checkpoint" / "step-3" / ".metadata"
    _wait_for(
        lambda: checkpoint.is_file() and 4 in set().union(*_log_steps(job.log), set()),
        300,
        "step 4 after the step-3 checkpoint",
        poll=0.3,
    )
    # SIGKILL to every training process of the job at once, as a node crash: nothing can save (scancel, even
    # --signal=KILL, sends TERM first, and the ranks answer TERM with a stop-save at the next step boundary)
    subprocess.run(["pkill", "-KILL", "-f", str(job.run_dir)], check=False)
    _wait_for(lambda: slurm.state(job.job_id).state in ("FAILED", "CANCELLED", "COMPLETED"), 120, "the crash", poll=0.3)
    slurm.requeue(job.job_id)  # a finished batch job can be requeued: it runs again under the same id
    slurm.release_requeued(job.job_id)  # Slurm holds requeued jobs back
    info = wait_done(slurm, job.job_id, job.log)
    assert info.state == "COMPLETED", job.explain()
    return job


def _allocation_node_seconds(slurm, job_id: str) -> tuple[int, float]:
    """Starts and node-seconds straight from the job-completion log (sacct -c), not through the ledger."""
    r = slurm.run("sacct", "-c", "-D", "-P", "-n", "-j", job_id, "-o", "JobID,Start,End,NNodes")
    rows = [ln.split("|") for ln in r.stdout.splitlines() if ln.startswith(job_id + "|")]
    rows = [row for row in rows if row[3] != "0"]  # the requeue of a finished job: a record with no nodes, no start
    total = sum((datetime.fromisoformat(e) - datetime.fromisoformat(s)).total_seconds() * int(n) for _, s, e, n in rows)
    return len(rows), total


def test_the_restart_gap_is_no_stall_no_straggler_and_no_slow_step(requeued):
    """#32: the time between the crash and the requeued start (queue wait, start-up) is not a step: explain
    finds no data-loader stall or straggler in it, and watch's straggler report says nothing."""
    assert len(_log_steps(requeued.log)) == 2
    causes = explain_log(requeued.log, hosts=["n1", "n2"], procs_per_node=1).causes
    assert "dataloader_stall" not in causes and "straggler" not in causes, causes
    assert straggler_lines(str(requeued.log)) == []


def test_ledger_parts_add_up_to_the_allocation(requeued, slurm):
    ledger = requeued.goodput()
    starts, node_seconds = _allocation_node_seconds(slurm, requeued.job_id)
    assert starts == len(ledger.attempts) == 2
    parts = sum(ledger.parts_unit_s.values())
    assert abs(parts - node_seconds) <= 0.02 * node_seconds, (parts, node_seconds, ledger.render())
    assert ledger.unit == "node" and ledger.allocated_unit_hours * 3600 == pytest.approx(node_seconds)
    assert 0 < ledger.goodput < 1
    for part in ("preflight", "startup", "restore", "productive", "redone", "checkpoint", "shutdown"):
        assert ledger.parts_s.get(part, 0) > 0, (part, ledger.render())
    # killed right after step 4 was logged: what the first start did after its last step is lost (>= 0 s)
    assert ledger.parts_s.get("lost", 0) >= 0 and ledger.queue_s >= 0


def test_redone_part_is_exactly_the_steps_run_twice(requeued):
    first, second = _log_steps(requeued.log)[:2]
    repeated = sorted(first & second)
    assert repeated and min(second) == 4, (first, second)  # resumed from step-3
    ledger = requeued.goodput()
    assert ledger.redone_steps == repeated and ledger.steps_redone == len(repeated)
    assert ledger.steps_done == STEPS
    # the redone seconds are those steps' own durations: about as long as as many productive steps
    per_step = ledger.parts_s["productive"] / (STEPS + len(repeated) - len(repeated) - 1 + 1)
    assert 0.2 * per_step * len(repeated) < ledger.parts_s["redone"] < 10 * per_step * len(repeated)


def test_cli_prints_the_ledger_with_a_price(requeued, capsys, tmp_path):
    assert (
        cli_main(
            ["goodput", str(requeued.script.parent), "--price-per-gpu-hour", "2.5", "--plot", str(tmp_path / "g.png")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "2 start(s)" in out and "redone" in out and "at 2.5 per node-hour" in out
    assert (tmp_path / "g.png").stat().st_size > 0
