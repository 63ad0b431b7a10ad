"""A property test of the whole safety net (issue #41 item 10): 10,000 generated sites, in seconds.

Healthy sites -- 1 to 1,000 nodes, spares, filesystems that may or may not report sizes, run folders near full
by the planner's estimate, reservations the job's size, NODE_FAIL and requeue histories whose drains came after
the run, a slow controller that answers nothing, mixed Python and package versions, GPUs as fast as their peers
within noise -- must make every decision say "train". A single-node fault (its own check failed, a GPU far
below its peers, its ranks killed first, the node down during the run) must name exactly that node, and a spare,
where there is one, must take its place. Each scenario's seed is in the failure message.
"""

from __future__ import annotations

import random

import pytest

from cookbook_runtime import decide
from cookbook_runtime.decide import GateThresholds, Incident, NodeReport, NodeState, RunRecord

SCENARIOS = 10_000
T0 = 1_800_000_000.0
HOUR = 3600.0


def _size(rng: random.Random) -> int:
    """Mostly the sizes people run (1-64 nodes), now and then the 128-1,000 of the largest sites."""
    roll = rng.random()
    if roll < 0.002:
        return rng.choice((512, 1000))
    if roll < 0.02:
        return rng.choice((128, 256))
    return rng.randint(1, 64)


def _site(seed: int) -> dict:
    rng = random.Random(seed)
    n, spares = _size(rng), rng.choice((0, 0, 1, 2, 8))
    nodes = [f"gpu{i:04d}" for i in range(n)]
    gpus = rng.choice((0, 8))
    base = rng.uniform(0.01, 900.0)
    reports = {
        x: NodeReport(
            matmul_tflops=base * rng.uniform(0.8, 1.2),
            busbw_gbps=rng.choice((None, 40 * rng.uniform(0.8, 1.2))),
            seconds=rng.uniform(2, 30),
        )  # fmt: skip
        for x in nodes
    }
    return {"rng": rng, "n": n, "spares": spares, "nodes": nodes, "gpus": gpus, "reports": reports}


def _healthy_decisions(seed: int) -> None:
    s = _site(seed)
    rng, nodes, n = s["rng"], s["nodes"], s["n"]
    why = f"seed {seed}: {n} nodes, {s['spares']} spares"
    # the gate: peers alike within noise, floors below them
    limits = GateThresholds(matmul_floor_tflops=rng.choice((0.0, 0.001)), busbw_floor_gbps=rng.choice((0.0, 5.0)))
    verdict = decide.gate_verdict(nodes, s["reports"], limits)
    assert not verdict.blame and not verdict.stop, (why, verdict)
    # the nodes' Python: every node has the packages, some another version, some silent
    needs = {"torch": "2.13.0", "torchtitan": "0.3.0"}
    answers = {}
    for x in nodes:
        if rng.random() < 0.05:
            continue  # a slow node that did not answer
        version = rng.choice(("2.13.0", "2.13.0+cu128", "2.12.1"))
        answers[x] = {"python": f"3.{rng.choice((9, 10, 11, 12))}", "machine": "x86_64",
                      "versions": {"torch": version, "torchtitan": "0.3.0"}}  # fmt: skip
    assert not decide.environment_verdict(nodes, answers, needs).stop, why
    # the run folder: the estimate may exceed the free space (a warning), no checkpoint there yet
    free = rng.choice((0, 10**9, 20 * 10**9, 10**13))
    total = rng.choice((0, 10**14))
    _, stop = decide.run_dir_space_problem(free, total, rng.choice((0, 10**9, 141 * 10**9)), 0)
    assert not stop, why
    # the previous run ended on its own terms; its nodes were drained (maintenance) after it, or are fine
    end = T0 + rng.uniform(60, 10 * HOUR)
    outcome = rng.choice(("stop-saved", "TERM", "USR1", "completed", "requeued", "failed"))
    previous = RunRecord("812", 0, tuple(nodes), start=T0, end=end, outcome=outcome)
    drained = {x: NodeState(rng.choice(("drained", "idle", "allocated", "mixed")), end + rng.uniform(61, HOUR))
               for x in nodes}  # fmt: skip
    assert decide.node_fail_culprits(previous, drained, now=end + 2 * HOUR) == [], why
    assert decide.node_fail_culprits(previous, {}, now=end + HOUR) == [], why  # a controller that said nothing
    # a stop, a cancel, a requeue: SIGTERM everywhere is nobody's crash
    exits = {x: {"signals": rng.choice(([], ["SIGTERM"])), "at": T0 + rng.random()} for x in nodes}
    assert decide.crashed_nodes(exits, nodes) == [], why
    # the lead fits the time limit; old recoveries no longer count
    limit = rng.choice((3600.0, 4 * HOUR, 24 * HOUR))
    assert decide.lead_problem(rng.uniform(0, limit / 2), limit) == "", why
    old = [Incident(T0 - rng.uniform(HOUR, 48 * HOUR), "812", (nodes[-1],), "crash", "spare") for _ in range(3)]
    assert decide.budget_left(old, T0, 2, HOUR) == 2, why


def _single_fault(seed: int) -> None:
    s = _site(seed)
    rng, nodes, n = s["rng"], s["nodes"], s["n"]
    if n < 3:
        return  # a fault needs peers to be told from a setting (1-2 nodes: tests/unit/test_runtime_decide.py)
    bad = rng.choice(nodes)
    why = f"seed {seed}: {n} nodes, {bad} at fault"
    kind = rng.choice(("local", "slow", "crash", "node_fail"))
    if kind == "local":
        reports = dict(s["reports"])
        failure = rng.choice(("GPU 3 fell off the bus", "7 GPU(s) visible, the job needs 8", "mlx5_2: port down"))
        reports[bad] = NodeReport(failures=(failure,), matmul_tflops=reports[bad].matmul_tflops)
        named = decide.gate_verdict(nodes, reports, GateThresholds()).exclude
    elif kind == "slow":
        reports = dict(s["reports"])
        reports[bad] = NodeReport(matmul_tflops=reports[bad].matmul_tflops * rng.uniform(0.05, 0.4))  # type: ignore[operator]
        named = decide.gate_verdict(nodes, reports, GateThresholds()).exclude
    elif kind == "crash":
        exits = {x: {"signals": [], "at": T0 + 1 + rng.random()} for x in nodes if rng.random() < 0.7}
        exits[bad] = {"signals": [rng.choice(("SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT"))], "at": T0}
        named = decide.crashed_nodes(exits, nodes)
    else:
        previous = RunRecord("812", 1, tuple(nodes), start=T0)  # no end recorded: Slurm killed it
        states = {x: NodeState("allocated", None) for x in nodes}
        states[bad] = NodeState(rng.choice(("down*", "down", "fail", "drained*")), T0 + rng.uniform(0, HOUR))
        named = decide.node_fail_culprits(previous, states, now=T0 + 2 * HOUR)
    assert named == [bad], (why, kind, named)
    allocated = nodes + [f"spare{i}" for i in range(s["spares"])]
    train, spares = decide.placement(allocated, s["spares"])
    if bad == train[0] or not spares:
        return  # the batch host, or no spare: tests/unit/test_runtime_recovery.py
    what = decide.recovery([bad], spares, train[0], budget=2, lost=kind == "node_fail", resumable=True,
                           job_nodes=len(allocated))  # fmt: skip
    assert (what.action, what.nodes, what.spares) == ("spare", (bad,), (spares[0],)), (why, what)


@pytest.mark.parametrize("check", [_healthy_decisions, _single_fault], ids=["healthy", "single-fault"])
def test_the_net_trains_on_healthy_sites_and_names_exactly_the_faulty_node(check) -> None:
    for seed in range(SCENARIOS):
        check(seed)
