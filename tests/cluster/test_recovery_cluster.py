"""Recovery inside the allocation (issue #40) on the private 3-node cluster `nodes3`: a 2-node job with 1 spare.

- torchtitan llama3 and torchtune LoRA (tiny models): every training process of the non-head node is SIGKILLed
  mid-run (a crash). The runtime names the node, swaps the spare in and relaunches in the SAME job from the newest
  checkpoint; the redone step's loss is the first run's, and the job completes;
- torchtitan and torchtune LoRA: the non-head node's network is cut (its veth down: a node lost). The batch
  host's watch finds it, the spare takes its place.

The seconds from the fault to the first new step are printed beside the issue's goals (a crash <= 60 s, a lost
node <= 3 min), not asserted: speed goals live in benchmarks/ (the project's rule; a test on a loaded machine waits
on progress, never on a clock). benchmarks/recovery.py holds them against the goals on an idle machine and
benchmarks/README.md has each recovery's breakdown: 15 s after a crash there, 22-37 s beside other tests (load
~4); of a lost node's 55-58 s, ~38 are the batch host's watch finding it. Measured as this test sees it: from the
fault to the poll (every 0.3 s) that finds the new step in the log, so never less than the truth.

No sbatch anywhere: one job id from start to end. (The gate's blame with no spare on a 2-node cluster, and a
requeue of the same job with ExcNodeList: tests/cluster/test_preflight_cluster.py.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_wait import wait_done
from cluster_wait import wait_for as _wait_for

from cookbook.analysis.starts import split_starts
from cookbook.slurm.client import SlurmClient
from cookbook.walkthrough import job_spec, submit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([\d.]+)")
TUNE_STEP = re.compile(r"Step (\d+) \| loss:([\d.]+)")
RECOVERED = re.compile(r"cookbook: recovery: (\S+) \((.*?)\) replaced by spare (\S+) in job (\d+)")
GOALS = {"crash": 60.0, "lost": 180.0}  # seconds from the fault to the first new step (issue #40; the benchmark's)
TITAN_STEPS, LORA_STEPS = 9, 8  # a few steps past the recovery: enough to see the loss go on
TITAN = {"training.steps": str(TITAN_STEPS), "checkpoint.interval": "3", "metrics.log_freq": "1"}
LORA = {"epochs": "1", "max_steps_per_epoch": str(LORA_STEPS), "save_every_n_steps": "2", "throttle_seconds": "0.3"}
# the lost node: cut just after step 3 (or 5), past the checkpoint of the step before; 1 s at each step boundary
# keeps the next step from ending before the cut, so that step is redone after the recovery, and the rest follows
LORA_LOST_STEPS = 6
LORA_LOST = {**LORA, "max_steps_per_epoch": str(LORA_LOST_STEPS), "throttle_seconds": "1"}


def _text(path: Path) -> str:
    return _ANSI.sub("", path.read_text(errors="replace")) if path.exists() else ""


def _submit(cluster, tiny, recipe: str, name: str, overrides: dict[str, str], root: Path, gate: bool = False):
    """The job, 2 nodes + 1 spare; the gate (which checks the spare too) only where asked: it is not what the
    recovery tests test, and it costs a torch import per node."""
    spec = job_spec(recipe, profile="local-cpu", nodes=2, spare_nodes=1, job_name=name, overrides=overrides,
                    assets_dir=str(tiny.root))  # fmt: skip
    client = SlurmClient({**cluster.env(), **({} if gate else {"COOKBOOK_PREFLIGHT": "0"})})
    job = submit(spec, root=root, client=client)
    return job, client


def _training_nodes(job, client: SlurmClient) -> list[str]:
    m = re.search(r"^job \d+: 2 node\(s\) \[(\S+)\], rendezvous", _text(job.log), re.M)
    assert m, _text(job.log)[-3000:]
    return client.hostnames(m.group(1))


def _ranks_on(cluster, node: str, run_dir: Path) -> list[int]:
    """The training processes (not the launcher) of ``run_dir``'s job on ``node`` (its network namespace)."""
    return cluster.processes_on(node, str(run_dir))


def _back_in_service(cluster, client: SlurmClient, node: str) -> None:
    """``node``'s slurmd restarted, so it registers at once and Slurm drops its "not responding" mark (which
    otherwise lingers until the next ping, and the next test's job would see a node marked lost)."""
    pid_file = cluster.run_dir / f"slurmd-{node}.pid"
    try:
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    _wait_for(lambda: not cluster.status().daemons.get(f"slurmd {node}"), 60, f"{node}'s slurmd to stop")
    cluster.up()

    def responding() -> bool:
        state = client.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
        if state.startswith("down"):
            client.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        return bool(state) and not state.endswith("*") and not state.startswith(("down", "drain"))

    _wait_for(responding, 300, f"{node} back in service, responding")


def _tune_runs(job) -> list[dict[int, float]]:
    """Step -> loss of each launch of the torchtune ranks (one DiskLogger file each, oldest first)."""
    logs = sorted(job.run_dir.glob("logs/log_*.txt"), key=lambda p: p.stat().st_mtime)
    return [{int(s): float(v) for s, v in TUNE_STEP.findall(p.read_text(errors="replace"))} for p in logs]


def _titan_relaunched(job) -> bool:
    """The runtime recovered and the relaunched torchtitan ranks logged a step."""
    text = _text(job.log)
    return bool(RECOVERED.search(text)) and bool(TITAN_STEP.search(text.split("cookbook: relaunching on", 1)[-1]))


def _tune_relaunched(job) -> bool:
    """The runtime recovered and the relaunched torchtune ranks logged a step."""
    runs = _tune_runs(job)
    return bool(RECOVERED.search(_text(job.log))) and len(runs) == 2 and bool(runs[1])


def _seconds_until(relaunched: Callable[[object], bool], job, started: float, timeout: float = 600) -> float:
    """Seconds from ``started`` until ``relaunched(job)`` (the log polled every 0.3 s)."""
    _wait_for(lambda: relaunched(job), timeout, "the first step after the recovery", poll=0.3)
    return time.monotonic() - started


def _lose(cluster, client: SlurmClient, job, node: str, relaunched: Callable[[object], bool]) -> float:
    """Cut ``node``'s network (its veth down) until the run is relaunched without it: the seconds that took. Then
    the link is up again, what is left of the lost step there killed, and the node back in service."""
    veth = f"{cluster.cfg.netns_prefix}v{node[1:]}"
    cut = time.monotonic()
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        return _seconds_until(relaunched, job, cut)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=False)
        for pid in _ranks_on(cluster, node, job.run_dir):
            subprocess.run(["kill", "-KILL", str(pid)], check=False)
        _back_in_service(cluster, client, node)


def _against_goal(took: float, fault: str) -> None:
    """Say ``took``, the seconds from the ``fault`` ("crash", "lost") to the first new step, beside its goal."""
    print(f"{fault}: first new step {took:.1f} s after the fault (goal {GOALS[fault]:.0f} s, benchmarks/recovery.py)")


def _check_lost(job, node: str, head: str) -> None:
    """The batch host's watch named ``node`` lost and the spare took its place in the same job (no sbatch)."""
    text = _text(job.log)
    assert f"cookbook: lost {node}: its slurmd does not answer the batch host" in text, text[-3000:]
    lost, why, spare, same = RECOVERED.search(text).groups()  # type: ignore[union-attr]
    assert (lost, same) == (node, job.job_id) and spare not in (head, node) and why.startswith("lost"), text
    assert "sbatch" not in text.split("cookbook: recovery:", 1)[1] and "Submitted batch job" not in text


def _wait_running(client: SlurmClient, job, ready, what: str) -> None:
    """The job has started (it may queue behind another test's job on this cluster) and reached ``ready``."""
    _wait_for(lambda: client.state(job.job_id).state not in ("PENDING", "CONFIGURING"), 900, "the job to start")

    def running() -> bool:
        state = client.state(job.job_id)
        assert not state.done, f"{state}\n{_text(job.log)[-3000:]}"
        return state.state == "RUNNING" and ready()

    _wait_for(running, 600, what, poll=0.3)


def _check_completed(client: SlurmClient, job, steps: re.Pattern[str], last: int) -> list[dict[int, float]]:
    info = wait_done(client, job.job_id, job.log)
    text = _text(job.log)
    assert info.state == "COMPLETED", f"{info}\n{text[-4000:]}"
    assert "sbatch" not in text.split("cookbook: recovery:", 1)[1] and "Submitted batch job" not in text
    runs = [{int(s): float(v) for s, v in steps.findall(part)} for _, part in split_starts(text)]
    runs = [r for r in runs if r]
    assert len(runs) == 2 and max(runs[1]) == last, runs
    return runs


def test_torchtitan_a_crashed_node_is_replaced_by_the_spare_in_the_same_job(nodes3_cluster, tiny_assets, tmp_path):
    job, client = _submit(nodes3_cluster, tiny_assets, "llama3_8b_c4", "spare-titan", TITAN, tmp_path, gate=True)

    def ready() -> bool:
        done = {int(s) for s, _ in TITAN_STEP.findall(_text(job.log))}
        return any((job.run_dir / "checkpoint").glob("step-*/.metadata")) and bool(done) and max(done) >= 4

    _wait_running(client, job, ready, "step 4 after a checkpoint")
    head, other = _training_nodes(job, client)
    victims = _ranks_on(nodes3_cluster, other, job.run_dir)
    assert victims, f"no training process of {job.run_dir} on {other}"
    killed = time.monotonic()
    subprocess.run(["kill", "-KILL", *map(str, victims)], check=False)
    took = _seconds_until(_titan_relaunched, job, killed)
    text = _text(job.log)
    node, why, spare, same = RECOVERED.search(text).groups()  # type: ignore[union-attr]
    assert (node, same) == (other, job.job_id) and spare not in (head, other) and "SIGKILL" in why, text[-3000:]
    runs = _check_completed(client, job, TITAN_STEP, TITAN_STEPS)
    assert re.search(rf"cookbook: pre-flight ok on {spare} in", text), text[-3000:]  # the spare was checked too
    resumed = min(runs[1])
    assert resumed - 1 in (3, 6) and resumed <= max(runs[0]) + 1, runs  # from the newest checkpoint
    if resumed in runs[0]:  # the redone step: the same loss as the first time
        assert runs[1][resumed] == pytest.approx(runs[0][resumed], rel=1e-3), runs
    print(f"torchtitan crash: first new step {took:.1f} s after the kill; {max(runs[0]) - resumed + 1} step(s) redone")
    _against_goal(took, "crash")


def test_torchtune_lora_a_crashed_node_is_replaced_by_the_spare_in_the_same_job(nodes3_cluster, tiny_assets, tmp_path):
    job, client = _submit(nodes3_cluster, tiny_assets, "llama3_3_70b_lora", "spare-lora", LORA, tmp_path)

    def ready() -> bool:
        first = _tune_runs(job)[:1]
        return any(job.run_dir.glob("step_*/recipe_state/recipe_state.pt")) and bool(first) and max(first[0]) >= 3

    _wait_running(client, job, ready, "step 3 after a step checkpoint")
    head, other = _training_nodes(job, client)
    victims = _ranks_on(nodes3_cluster, other, job.run_dir)
    assert victims, f"no training process of {job.run_dir} on {other}"
    killed = time.monotonic()
    subprocess.run(["kill", "-KILL", *map(str, victims)], check=False)
    took = _seconds_until(_tune_relaunched, job, killed)
    node, why, spare, same = RECOVERED.search(_text(job.log)).groups()  # type: ignore[union-attr]
    assert (node, same) == (other, job.job_id) and spare not in (head, other) and "SIGKILL" in why
    info = wait_done(client, job.job_id, job.log)
    assert info.state == "COMPLETED", f"{info}\n{_text(job.log)[-4000:]}"
    first, second = _tune_runs(job)
    resumed = min(second)
    assert (resumed - 1) % 2 == 0 and resumed <= max(first) + 1 and max(second) == LORA_STEPS, (first, second)
    if resumed in first:
        assert second[resumed] == pytest.approx(first[resumed], rel=1e-3), (first, second)
    print(f"torchtune LoRA crash: first new step {took:.1f} s after the kill; {max(first) - resumed + 1} redone")
    _against_goal(took, "crash")


def test_torchtitan_a_lost_node_is_found_by_the_batch_host_and_replaced(nodes3_cluster, tiny_assets, tmp_path):
    if nodes3_cluster.status().mode != "netns":
        pytest.skip("cutting one node's network needs the netns mode of the local cluster")
    job, client = _submit(nodes3_cluster, tiny_assets, "llama3_8b_c4", "spare-lost", TITAN, tmp_path)

    def ready() -> bool:
        done = {int(s) for s, _ in TITAN_STEP.findall(_text(job.log))}
        return any((job.run_dir / "checkpoint").glob("step-*/.metadata")) and bool(done) and max(done) >= 4

    _wait_running(client, job, ready, "step 4 after a checkpoint")
    head, other = _training_nodes(job, client)
    took = _lose(nodes3_cluster, client, job, other, _titan_relaunched)
    _check_lost(job, other, head)
    _check_completed(client, job, TITAN_STEP, TITAN_STEPS)
    print(f"torchtitan lost node: first new step {took:.1f} s after the cut")
    _against_goal(took, "lost")


def test_torchtune_lora_a_lost_node_is_found_by_the_batch_host_and_replaced(nodes3_cluster, tiny_assets, tmp_path):
    if nodes3_cluster.status().mode != "netns":
        pytest.skip("cutting one node's network needs the netns mode of the local cluster")
    job, client = _submit(nodes3_cluster, tiny_assets, "llama3_3_70b_lora", "spare-lora-lost", LORA_LOST, tmp_path)

    def ready() -> bool:  # just after a step that saves nothing (an odd one), past a checkpoint
        first = _tune_runs(job)[:1]
        return any(job.run_dir.glob("step_*/recipe_state/recipe_state.pt")) and bool(first) and max(first[0]) in (3, 5)

    _wait_running(client, job, ready, "step 3 or 5, after a checkpoint")
    head, other = _training_nodes(job, client)
    took = _lose(nodes3_cluster, client, job, other, _tune_relaunched)
    _check_lost(job, other, head)
    info = wait_done(client, job.job_id, job.log)
    assert info.state == "COMPLETED", f"{info}\n{_text(job.log)[-4000:]}"
    first, second = _tune_runs(job)
    redone = max(first)  # resumed from the checkpoint of the step before, the newest
    assert (min(second), max(second)) == (redone, LORA_LOST_STEPS), (first, second)
    assert second[redone] == pytest.approx(first[redone], rel=1e-3), (first, second)  # the redone step's loss
    print(f"torchtune LoRA lost node: first new step {took:.1f} s after the cut")
    _against_goal(took, "lost")
