"""The job runtime's decisions (cookbook_runtime.decide) as pure functions, at 1, 16 and 1,000 nodes.

Each numbered problem of issue #29 that a decision answers is a named case: (1) the gate never blames every
node for a failure it cannot attribute, (3) a healthy p4d/p5 passes the bandwidth judgement while a node at
half its peers' bandwidth fails it, (6) NODE_FAIL counts only nodes that failed during the previous run,
(9) the hang floor covers the model's save,
(10) the dump wait grows with the world size, (11) the stop check's cadence. Hostlists and reports are made here.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from cookbook_runtime import decide
from cookbook_runtime.decide import GateThresholds, NodeReport, NodeState, PairResult, RunRecord, gate_verdict

SIZES = (1, 16, 1000)


def nodes(n: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(n)]


def healthy(n: int, tflops: float = 700.0, busbw: float | None = None) -> dict[str, NodeReport]:
    return {
        x: NodeReport(matmul_tflops=tflops + (i % 7), busbw_gbps=busbw, seconds=9.0) for i, x in enumerate(nodes(n))
    }


# ------------------------------------------------------------------ the gate's verdict


@pytest.mark.parametrize("n", SIZES)
def test_a_healthy_allocation_trains_with_nothing_to_say(n: int):
    verdict = gate_verdict(nodes(n), healthy(n), GateThresholds())
    assert verdict.blame == {} and verdict.unattributed == "" and not verdict.stop


@pytest.mark.parametrize("n", (16, 1000))
def test_one_node_whose_own_check_failed_while_its_peers_passed_is_blamed(n: int):
    reports = healthy(n)
    bad = nodes(n)[3]
    reports[bad] = NodeReport(failures=("7 GPU(s) visible, the job needs 8",), matmul_tflops=700.0)
    verdict = gate_verdict(nodes(n), reports, GateThresholds())
    assert verdict.exclude == [bad] and verdict.unattributed == ""


def test_on_two_nodes_the_one_that_failed_its_own_check_is_blamed():
    reports = {"n1": NodeReport(failures=("GPU 3 fell off the bus",)), "n2": NodeReport()}
    assert gate_verdict(["n1", "n2"], reports, GateThresholds()).exclude == ["n1"]


def test_one_node_alone_is_never_excluded_it_has_no_peers_to_tell_a_fault_from_a_setting():
    reports = {"n1": NodeReport(failures=("InfiniBand HCA mlx5 not present",))}
    verdict = gate_verdict(["n1"], reports, GateThresholds())
    assert verdict.blame == {} and "mlx5" in verdict.unattributed and not verdict.stop


@pytest.mark.parametrize("n", (2, 16, 1000))
def test_problem_1_the_same_failure_on_every_node_is_the_clusters_no_node_is_excluded(n: int):
    # a wrong NCCL_IB_HCA, torch missing, a run folder that is not shared: every node fails alike
    reports = {x: NodeReport(failures=(f"InfiniBand HCA mlx5_{i % 8} not present",)) for i, x in enumerate(nodes(n))}
    verdict = gate_verdict(nodes(n), reports, GateThresholds())
    assert verdict.blame == {} and "no node blamed" in verdict.unattributed and not verdict.stop


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_1_the_same_failure_on_half_the_nodes_blames_none_of_them(n: int):
    reports = healthy(n)
    for x in nodes(n)[: n // 2]:
        reports[x] = NodeReport(failures=("local disk /tmp: 3.0 GB free < 20 GB",), matmul_tflops=700.0)
    assert gate_verdict(nodes(n), reports, GateThresholds()).blame == {}


@pytest.mark.parametrize("n", (2, 16, 1000))
def test_problem_1_a_collective_that_could_not_start_blames_nobody_and_the_job_trains(n: int):
    reports = {x: NodeReport(matmul_tflops=700.0, collective_error="RendezvousTimeoutError: ...") for x in nodes(n)}
    verdict = gate_verdict(nodes(n), reports, GateThresholds())
    assert verdict.blame == {} and "collective part failed" in verdict.unattributed and not verdict.stop


@pytest.mark.parametrize("n", (3, 16, 1000))
def test_problem_2_missing_reports_are_never_a_node_fault(n: int):
    reports = healthy(n)
    gone = nodes(n)[: max(1, n // 2)]  # a cold start from shared storage: these did not finish in time
    for x in gone:
        del reports[x]
    verdict = gate_verdict(nodes(n), reports, GateThresholds())
    assert verdict.blame == {} and "no report from" in verdict.unattributed


def test_a_strict_gate_stops_on_what_it_cannot_attribute_and_only_then():
    reports = {x: NodeReport(collective_error="timeout") for x in nodes(16)}
    assert gate_verdict(nodes(16), reports, GateThresholds(strict=True)).stop
    assert not gate_verdict(nodes(16), healthy(16), GateThresholds(strict=True)).stop


def pairwise(names: list[str], speed: dict[str, float], link: float = 343.0, rails: int = 1) -> list[PairResult]:
    """The gate's two rounds over a modelled fabric: a pair carries the slower of its two nodes' links (``speed``,
    default ``link``); the rounds are the runtime's own (decide.first_pairs, then decide.second_pairs)."""
    limits = GateThresholds(busbw_floor_gbps=35.0)

    def run(pairs: list[tuple[str, str]], round_: int) -> list[PairResult]:
        return [PairResult(a, b, min(speed.get(a, link), speed.get(b, link)), round_, rail)
                for a, b in pairs for rail in range(rails)]  # fmt: skip

    first = run(decide.first_pairs(names), 1)
    return first + run(decide.second_pairs(names, first, limits), 2)


EFA = GateThresholds(busbw_floor_gbps=35.0)  # aws-efa's floor


@pytest.mark.parametrize(("fabric", "busbw"), [("p4d (2 nodes, ~70 GB/s)", 70.0), ("p5 (~343 GB/s)", 343.0)])
@pytest.mark.parametrize("n", (2, 15, 16, 1000))
def test_problem_3_a_healthy_p4d_and_p5_pass_the_pairwise_test(fabric: str, busbw: float, n: int):
    pairs = pairwise(nodes(n), {}, link=busbw, rails=8)
    assert {r.round for r in pairs} == ({1, 2} if n % 2 else {1}), fabric  # odd N: the node out, in round 2
    verdict = gate_verdict(nodes(n), healthy(n), EFA, pairs)
    assert verdict.blame == {} and verdict.unattributed == "" and not verdict.stop, fabric


@pytest.mark.parametrize("n", (2, 3, 16, 1000))
@pytest.mark.parametrize("where", (0, 1, -1))  # either side of a round-1 pair, and the last node (odd N: the one out)
def test_problem_3_a_slow_node_is_named_and_its_pair_partner_is_not(n: int, where: int):
    names = nodes(n)
    slow = names[where]
    pairs = pairwise(names, {slow: 12.0})  # one NIC down to a tenth: under the floor
    verdict = gate_verdict(names, healthy(n), EFA, pairs)
    if n == 2 or (n == 3 and where == 0):  # no known-good node: which side is slow cannot be told, nobody named
        # (at 3 nodes round 2 pairs the odd node with the first suspect: the slow node itself here)
        assert verdict.blame == {} and "no good node to tell which side" in verdict.unattributed and not verdict.stop
        return
    assert verdict.exclude == [slow], verdict
    assert re.fullmatch(
        r"link bandwidth with gpu\d+: 12 GB/s < 35 GB/s \(gpu\d+ passed with gpu\d+\)", verdict.blame[slow][0]
    )
    assert len([r for r in pairs if r.round == 2]) <= 2  # two suspects, two partners: the rounds stay O(1)


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_3_a_node_at_half_its_peers_is_named_by_the_peer_ratio_above_the_floor(n: int):
    slow = nodes(n)[7]
    verdict = gate_verdict(nodes(n), healthy(n), EFA, pairwise(nodes(n), {slow: 171.0}))
    assert verdict.exclude == [slow] and "x the pairs' median 343" in verdict.blame[slow][0]


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_3_a_slow_path_between_two_good_nodes_names_neither(n: int):
    names = nodes(n)
    pairs = [PairResult(r.a, r.b, 9.0 if (r.a, r.b) == (names[2], names[3]) else r.gbps, r.round)
             for r in pairwise(names, {})]  # fmt: skip
    pairs += [PairResult(x, g, 343.0, 2) for x, g in decide.second_pairs(names, pairs, EFA)]
    verdict = gate_verdict(names, healthy(n), EFA, pairs)
    assert verdict.blame == {} and f"the pair {names[2]}-{names[3]}" in verdict.unattributed and not verdict.stop


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_3_many_slow_nodes_are_the_fabrics_not_theirs(n: int):
    names = nodes(n)
    pairs = pairwise(names, {x: 20.0 for x in names[: n // 2 + 2]})  # more than half: no node blamed
    verdict = gate_verdict(names, healthy(n), EFA, pairs)
    assert verdict.blame == {} and not verdict.stop and verdict.unattributed


def test_problem_3_the_network_part_is_two_rounds_at_any_size_each_node_in_at_most_one_pair_per_round():
    for n in (2, 3, 16, 999, 1000):
        names = nodes(n)
        pairs = pairwise(names, {names[1]: 1.0, names[-1]: 2.0})
        for round_ in (1, 2):
            members = [x for r in pairs if r.round == round_ for x in (r.a, r.b)]
            assert len(members) == len(set(members)), (n, round_)
        assert {r.round for r in pairs} <= {1, 2}
    assert decide.collective_timeout(30, 1000) > decide.collective_timeout(30, 16) > decide.collective_timeout(30, 2)


@pytest.mark.parametrize("n", (2, 16, 1000))
def test_problem_4_every_pair_under_a_quarter_of_the_floor_stops_blaming_no_node(n: int):
    pairs = pairwise(nodes(n), {}, link=1.2)  # TCP sockets on an EFA site
    verdict = gate_verdict(nodes(n), healthy(n), EFA, pairs)
    assert verdict.stop and verdict.blame == {} and "under a quarter of the 35 GB/s floor" in verdict.unattributed
    assert decide.FABRIC_OVERRIDE in verdict.unattributed and "Fix:" in verdict.unattributed
    assert "\n" not in verdict.unattributed
    off = gate_verdict(nodes(n), healthy(n), replace(EFA, fabric_stop=False), pairs)
    assert not off.stop  # COOKBOOK_FABRIC_STOP=0: logged, trains
    slow = gate_verdict(nodes(n), healthy(n), EFA, pairwise(nodes(n), {}, link=12.0))  # under the floor, not 1/4
    assert not slow.stop and slow.blame == {}


@pytest.mark.parametrize("n", (2, 16, 1000))
def test_problem_4_the_efa_plugin_missing_on_every_node_stops_and_on_one_node_names_it(n: int):
    missing = f"{decide.NO_NET_PLUGIN} (libnccl-net*.so) not found: NCCL would fall back to sockets"
    everywhere = {x: NodeReport(failures=(missing,), matmul_tflops=700.0) for x in nodes(n)}
    verdict = gate_verdict(nodes(n), everywhere, EFA)
    assert verdict.stop and verdict.blame == {} and f"missing on all {n} nodes" in verdict.unattributed
    assert "LD_LIBRARY_PATH" in verdict.unattributed and decide.FABRIC_OVERRIDE in verdict.unattributed
    one = healthy(n)
    one[nodes(n)[-1]] = everywhere[nodes(n)[-1]]
    verdict = gate_verdict(nodes(n), one, EFA)
    assert not verdict.stop and (verdict.exclude == [nodes(n)[-1]] if n > 2 else True)


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_4_a_power_capped_site_where_every_gpu_is_slow_alike_trains(n: int):
    reports = healthy(n, tflops=420.0)  # ~0.42 x the H100 peak everywhere: capped, not broken
    assert gate_verdict(nodes(n), reports, GateThresholds()).blame == {}


@pytest.mark.parametrize("n", (16, 1000))
def test_problem_4_one_gpu_far_below_its_peers_is_blamed(n: int):
    reports = healthy(n)
    slow = nodes(n)[-1]
    reports[slow] = NodeReport(matmul_tflops=200.0)
    assert gate_verdict(nodes(n), reports, GateThresholds()).exclude == [slow]


def test_the_gate_budget_grows_with_the_nodes_and_the_cold_start():
    assert decide.gate_budget(60, 1) < decide.gate_budget(60, 16) < decide.gate_budget(60, 1000)
    assert decide.gate_budget(60, 1000) >= 60 + 120 + 250


# ------------------------------------------------------------------ interfaces, devices, head address


@pytest.mark.parametrize(
    ("spec", "name", "yes"),
    [("eth", "eth0", True), ("=eth0", "eth0", True), ("=eth", "eth0", False), ("^docker,lo", "ens5", True),
     ("^docker,lo", "lo", False), ("ib,eth", "eth1", True)],
)  # fmt: skip
def test_interface_selection_follows_nccl_socket_ifname(spec: str, name: str, yes: bool):
    assert decide.interface_matches(spec, name) is yes


def test_one_parser_for_nccl_ib_hca_lists():
    present = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_bond_0"]
    assert decide.devices_selected("=mlx5_0,mlx5_1:1", present) == ["mlx5_0", "mlx5_1"]
    assert decide.devices_selected("^mlx5_4", present) == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
    assert decide.devices_selected("mlx5", present) == present  # a prefix: every mlx5 device, RoCE ones too


def test_the_head_address_is_the_batch_hosts_own_never_the_nodename():
    local = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "10.1.2.3"), ("ib0", "192.168.7.3")]
    assert decide.head_address(local, ["127.0.1.1"]) == ("10.1.2.3", "eth0")  # name resolves to loopback
    assert decide.head_address(local, ["192.168.7.3"]) == ("192.168.7.3", "ib0")
    assert decide.head_address(local, [], "ib") == ("192.168.7.3", "ib0")
    assert decide.head_address([("lo", "127.0.0.1")], []) is None


@pytest.mark.parametrize("n", SIZES)
def test_shared_nodes_get_a_port_per_job(n: int):
    assert decide.rendezvous_port(29500, 123456, exclusive=True, span=2000) == 29500
    ports = {decide.rendezvous_port(20000, job, exclusive=False, span=2000) for job in range(n)}
    assert len(ports) == min(n, 2000) and max(ports) < 22000


# ------------------------------------------------------------------ NODE_FAIL


T0 = 1_800_000_000.0


@pytest.mark.parametrize("n", SIZES)
def test_problem_6_a_node_that_died_during_the_previous_run_is_its_node_fail(n: int):
    ns = tuple(nodes(n))
    previous = RunRecord("812", 0, ns, start=T0)  # never recorded an end: Slurm killed it
    states = {x: NodeState("allocated", None) for x in ns}
    states[ns[-1]] = NodeState("down*", T0 + 3600)
    assert decide.node_fail_culprits(previous, states, now=T0 + 3700) == [ns[-1]]


@pytest.mark.parametrize("n", SIZES)
def test_problem_6_a_node_drained_after_the_run_ended_is_not_this_jobs_failure(n: int):
    ns = tuple(nodes(n))
    previous = RunRecord("812", 0, ns, start=T0, end=T0 + 3600, outcome="failed")
    states = {x: NodeState("drained", T0 + 7200) for x in ns}  # an admin drained them later
    assert decide.node_fail_culprits(previous, states, now=T0 + 7300) == []


@pytest.mark.parametrize("outcome", ["stop-saved", "TERM", "USR1", "completed", "excluded", "requeued"])
def test_problem_6_time_limit_and_preemption_requeues_never_spend_the_budget(outcome: str):
    """A run that ended on its own terms while the admins drained its nodes (maintenance, a preemption): no
    node of it failed."""
    ns = tuple(nodes(16))
    previous = RunRecord("812", 0, ns, start=T0, end=T0 + 60, outcome=outcome)
    states = {x: NodeState("drained", T0 + 30) for x in ns}
    assert decide.node_fail_culprits(previous, states, now=T0 + 100) == []


@pytest.mark.parametrize("n", SIZES)
def test_problem_6_a_node_that_died_while_the_others_saved_is_still_its_node_fail(n: int):
    """Slurm's NODE_FAIL requeue sends TERM to the survivors, whose ranks may save: the dead node is still blamed."""
    ns = tuple(nodes(n))
    previous = RunRecord("812", 0, ns, start=T0, end=T0 + 60, outcome="stop-saved")
    states = {x: NodeState("allocated", None) for x in ns}
    states[ns[-1]] = NodeState("down*", T0 + 30)
    assert decide.node_fail_culprits(previous, states, now=T0 + 100) == [ns[-1]]


def test_the_run_records_read_back():
    text = f"812\t0\tn1,n2\t{T0:.0f}\t\t\n812\t0\tn1,n2\t{T0:.0f}\t{T0 + 5:.0f}\tstop-saved\n813\t1\tn3\t{T0:.0f}\t\t\n"
    runs = decide.parse_runs(text)
    assert runs[0] == RunRecord("812", 0, ("n1", "n2"), T0, T0 + 5, "stop-saved")
    assert runs[1].end is None and runs[1].nodes == ("n3",)


# ------------------------------------------------------------------ after the ranks exit


def test_every_signal_status_and_save_has_an_answer():
    for key in [(s, ok, saved) for s in (None, "USR1", "TERM") for ok in (True, False) for saved in (True, False)]:
        assert key in decide.AFTER_EXIT
    assert decide.after_exit("TERM", 0, True).action == "exit"  # a cancel stays cancelled
    assert decide.after_exit("USR1", 0, True).action == "requeue"
    assert decide.after_exit("USR1", 1, False).action == "requeue"  # resumes from its newest checkpoint
    assert decide.after_exit("USR1", 0, False).action == "exit"  # training finished first
    assert decide.after_exit(None, 0, False).action == "exit"
    assert decide.outcome("TERM", 0, True) == "stop-saved" and decide.outcome(None, 1, False) == "failed"


# ------------------------------------------------------------------ saves, signals, hangs


def test_problem_8_the_log_says_when_killwait_is_shorter_than_the_save():
    assert decide.kill_wait_problem(846, kill_wait=30, grace=None).startswith("this site's KillWait=30 s")
    assert decide.kill_wait_problem(40, kill_wait=60, grace=120) == ""
    assert "GraceTime=10 s" in decide.kill_wait_problem(40, kill_wait=60, grace=10)


def test_problem_9_a_70b_stop_save_is_never_a_hang():
    assert decide.hang_min_seconds(846) >= 846 * 1.5
    assert decide.hang_min_seconds(2) == 600


@pytest.mark.parametrize("world", (8, 128, 8000))
def test_problem_10_the_dump_wait_grows_with_the_world(world: int):
    assert decide.dump_wait_seconds(world) >= 26 + world / 16


def test_problem_11_the_stop_check_is_as_rare_as_the_lead_time_allows():
    assert decide.stop_check_every(None, 120, 10) == 1
    assert decide.stop_check_every(0.5, 600, 100) > 10
    assert decide.stop_check_every(30, 120, 60) == 1  # thin margin: every step


# ------------------------------------------------------------------ the package itself


def test_the_runtime_never_imports_cookbook_and_is_held_once():
    import ast
    from pathlib import Path

    import cookbook_runtime

    root = Path(cookbook_runtime.__file__).parent
    assert root.parent.name == "slurm-recipes"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n == "cookbook" or n.startswith("cookbook.") for n in names), (path.name, names)
    shipped = [p for p in root.parent.rglob("*.py") if p.parent != root and p.name.startswith("cookbook_")]
    texts = [p.read_text() for p in shipped]
    assert len(texts) == len(set(texts))  # no byte-identical copies left beside the scripts


def test_the_batch_step_writes_the_names_the_runtime_reads(tmp_path):
    """The batch step (cookbook_runtime.run, run for real against stand-in srun/scontrol, a rank hanging on n2)
    keeps its state under cookbook_runtime.files' names, where the ranks (COOKBOOK_STOP_FILE, COOKBOOK_HANG_DIR,
    the flight recorder's dump prefix) and the login node's readers (cookbook.analysis: the hang report, the
    node report, the run folder named in the log) look for them."""
    from batch_step import FakeSlurm, runtime_argv

    from cookbook.analysis.hang import hang_folders, hang_report, run_dir_of
    from cookbook.analysis.node_health import node_events
    from cookbook.render import render_job
    from cookbook.spec import make_spec
    from cookbook_runtime import files

    fake = FakeSlurm(tmp_path)
    run_dir = fake.run_dir
    argv = runtime_argv(render_job(make_spec("llama3_3_70b_full", profile="generic")).script)
    partition = "n1|allocated|\nn2|allocated|\nn3|idle|"  # room for the job without n2: the same job, requeued
    ran = fake.run_step(argv, FAKE_SRUN="hang", FAKE_SINFO=partition, FAKE_JOB_RECORD="JobId=41 Partition=gpu")
    _, check, launch = ran.argv("srun")  # the nodes' Python, the gate, the ranks
    assert check[check.index("--out") + 1] == str(files.gate_dir(run_dir, "41", 0)), ran.out
    env = ran.launches()[0]["env"]
    hang_dir = files.hang_dir(run_dir, "41", 0)
    assert env[files.STOP_FILE_ENV] == str(files.state_dir(run_dir) / files.STOP)
    assert env[files.HANG_DIR_ENV] == str(hang_dir)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{hang_dir}/{files.TRACE_PREFIX}"  # + the rank
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"]
    assert hang_folders(run_dir) == [hang_dir]
    assert hang_report(run_dir)[0] == "hang: rank 1 on n2 (last step behind the others)"
    log = tmp_path / "job.out"
    log.write_text(ran.out)
    assert run_dir_of(log) == run_dir
    assert [(e.kind, e.node) for e in node_events(log)][-1] == ("excluded", "n2")
    (incident,) = decide.parse_incidents(files.recoveries(run_dir).read_text())
    assert (incident.job, incident.nodes, incident.action) == ("41", ("n2",), "requeue-excluding")
    assert incident.reason.startswith("hang: rank 1 on n2")
    assert [a for a in ran.argv("scontrol") if a[0] in ("requeuehold", "update", "release")] == [
        ["requeuehold", "41"], ["update", "JobId=41", "ExcNodeList=n2", "StartTime=now+10"], ["release", "41"]
    ]  # fmt: skip
    assert not ran.argv("sbatch")
    runs = decide.parse_runs((files.state_dir(run_dir) / files.RUNS).read_text())
    assert [(r.job, r.restart, r.nodes, r.outcome) for r in runs] == [("41", 0, ("n1", "n2"), "requeued")]


# ------------------------------------------------------------------ the nodes' Python and the run folder (#30)


def answer(node: str, torch: str | None = "2.13.0+cu128", framework: str | None = "0.6.1") -> dict:
    return {"node": node, "python": "/shared/env/bin/python3", "machine": "x86_64",
            "versions": {"torch": torch, "torchtune": framework}}  # fmt: skip


NEEDS = {"torch": "2.13.0", "torchtune": "0.6.1"}


@pytest.mark.parametrize("n", SIZES)
def test_the_tested_stack_on_every_node_trains_with_nothing_to_say(n: int):
    verdict = decide.environment_verdict(nodes(n), {x: answer(x) for x in nodes(n)}, NEEDS)
    assert verdict == decide.EnvVerdict()


@pytest.mark.parametrize("n", SIZES)
def test_nodes_without_torch_stop_the_job_in_one_line_naming_them_and_the_fix(n: int):
    """#30 item 1: a fresh login shell or SBATCH_EXPORT=NONE gives the nodes the system python3."""
    answers = {x: answer(x, torch=None, framework=None) for x in nodes(n)}
    verdict = decide.environment_verdict(nodes(n), answers, NEEDS)
    assert verdict.stop.startswith(f"the Python environment of {nodes(n)[0]}")
    assert "lacks torch (" in verdict.stop and "no node is excluded" in verdict.stop and "VENV=" in verdict.stop
    assert "\n" not in verdict.stop and len(verdict.stop) < 600  # one line, whatever the node count


@pytest.mark.parametrize("n", (16, 1000))
def test_one_node_without_the_framework_stops_the_job_too_and_names_that_node(n: int):
    answers = {x: answer(x) for x in nodes(n)} | {nodes(n)[3]: answer(nodes(n)[3], framework=None)}
    verdict = decide.environment_verdict(nodes(n), answers, NEEDS)
    assert f"the Python environment of {nodes(n)[3]} " in verdict.stop and "lacks torchtune:" in verdict.stop


@pytest.mark.parametrize("n", SIZES)
def test_another_version_or_a_silent_node_is_said_and_the_job_trains(n: int):
    answers = {x: answer(x, torch="2.11.0+cu126") for x in nodes(n)[1:]}
    verdict = decide.environment_verdict(nodes(n), answers, NEEDS)
    assert verdict.stop == ""
    if n > 1:
        assert verdict.notes[0].startswith("torch 2.11.0+cu126 on ") and "(tested: 2.13.0)" in verdict.notes[0]
    assert verdict.notes[-1].startswith(f"no answer about the Python environment from {nodes(n)[0]}")


def test_the_run_folder_space_warns_on_an_estimate_and_stops_only_when_certain():
    """#41 item 1: the planner's size is an estimate (a 70B full stop-save ~423 GB): a shortfall warns and the job
    trains; the newest checkpoint already in the run folder is a measurement: a shortfall against it stops."""
    problem, stop = decide.run_dir_space_problem(12 * 10**9, 500 * 10**9, 423 * 10**9)
    assert (
        problem.startswith("12.0 GB free where the checkpoints go") and "~423.0 GB by the planner's estimate" in problem
    )
    assert not stop and "training anyway" in problem
    problem, stop = decide.run_dir_space_problem(12 * 10**9, 500 * 10**9, 423 * 10**9, measured_bytes=40 * 10**9)
    assert stop and "newest checkpoint there is 40.0 GB: the next save fails" in problem
    assert "COOKBOOK_CHECKPOINT_GB=0" in problem
    assert decide.run_dir_space_problem(500 * 10**9, 10**12, 423 * 10**9) == ("", False)
    assert decide.run_dir_space_problem(0, 0, 423 * 10**9) == ("", False)  # a filesystem that reports no size
    assert decide.run_dir_space_problem(12 * 10**9, 500 * 10**9, 0) == ("", False)  # nothing to size
    assert decide.run_dir_space_problem(50 * 10**9, 500 * 10**9, 423 * 10**9, 40 * 10**9) == ("", False)


@pytest.mark.parametrize(
    ("limit", "lead", "refused"),
    [("00:15:00", 960, True), ("04:00:00", 960, False), ("1-00:00:00", 960, False), ("UNLIMITED", 960, False),
     ("10:00", 300, False), ("10:00", 301, True)],
)  # fmt: skip
def test_a_lead_over_half_the_time_limit_is_refused_it_would_requeue_for_ever(limit: str, lead: int, refused: bool):
    """#41 item 2: sbatch --time=00:15:00 with a 960 s lead would stop-save after the first step, for ever."""
    problem = decide.lead_problem(lead, decide.time_limit_seconds(limit))
    assert bool(problem) == refused
    if refused:
        assert "more than half the time limit" in problem and "--signal-seconds" in problem


def test_the_batch_step_stops_before_the_gate_when_the_nodes_lack_torch(tmp_path):
    """The runtime itself: n2's Python lacks torch -> one line, exit 2, no gate, no exclusion, no launch."""
    from batch_step import FakeSlurm, runtime_argv

    from cookbook.render import render_job
    from cookbook.spec import make_spec

    argv = runtime_argv(render_job(make_spec("llama3_3_70b_lora", profile="nebius")).script)
    ran = FakeSlurm(tmp_path / "env").run_step(argv, FAKE_NO_TORCH="n2", SLURM_GPUS_ON_NODE="8")
    assert ran.status == 2, ran.out
    stops = [line for line in ran.out.splitlines() if "not training" in line]
    assert len(stops) == 1 and stops[0].startswith("cookbook: the Python environment of n2 ("), ran.out
    assert [a[-3:] for a in ran.argv("srun")] == [["cookbook_runtime.pyenv", "torch", "torchtune"]]
    assert not ran.argv("sbatch") and not [a for a in ran.argv("scontrol") if a[0] in ("update", "requeue")]


def test_the_batch_step_warns_on_an_estimate_and_stops_on_a_measured_checkpoint(tmp_path):
    import shutil

    from batch_step import FakeSlurm, runtime_argv

    from cookbook.render import render_job
    from cookbook.spec import make_spec
    from cookbook_runtime import files

    argv = runtime_argv(render_job(make_spec("llama3_3_70b_full", profile="nebius")).script)
    assert "--checkpoint-gb=423" in argv  # the planner's 70B stop-save: 6 bytes x 70.6 B parameters
    warned = FakeSlurm(tmp_path / "space").run_step(argv, COOKBOOK_CHECKPOINT_GB="1e9", SLURM_GPUS_ON_NODE="8")
    assert warned.status == 0 and "one checkpoint of this job is ~1000000000.0 GB by the planner" in warned.out
    assert "training anyway" in warned.out and warned.launches(), warned.out
    fake = FakeSlurm(tmp_path / "measured")
    step = fake.run_dir / "step_4" / "recipe_state"
    step.mkdir(parents=True)
    with open(step / "recipe_state.pt", "wb") as f:  # sparse: its size, none of the disk
        f.truncate(shutil.disk_usage(tmp_path).free + 10**9)
    (fake.run_dir / "step_4" / "epoch_0").mkdir()
    ran = fake.run_step(argv, COOKBOOK_CHECKPOINT_GB="1", SLURM_GPUS_ON_NODE="8")
    assert ran.status == 2 and "this run's newest checkpoint there is" in ran.out and "not training" in ran.out
    assert len(ran.argv("srun")) == 1  # the nodes' Python was asked; no gate, no launch
    runs = decide.parse_runs((files.state_dir(fake.run_dir) / files.RUNS).read_text())
    assert runs[-1].outcome == "failed"


def test_the_batch_step_refuses_a_lead_over_half_the_time_limit(tmp_path):
    from batch_step import FakeSlurm

    record = "JobId=41 TimeLimit=00:15:00 Partition=gpu"
    argv = ["--requeue", "--lead-seconds=960", "--", "torchrun", "-m", "train"]
    ran = FakeSlurm(tmp_path).run_step(argv, FAKE_JOB_RECORD=record)
    assert ran.status == 2 and "more than half the time limit (900 s)" in ran.out and not ran.launches(), ran.out


def test_the_lead_time_is_written_once_the_runtime_reads_the_jobs_own_signal(tmp_path):
    """#41 item 2: no committed script writes its lead twice: the launch line says --lead-from-signal and the
    runtime reads #SBATCH --signal from Slurm's copy of the script."""
    from batch_step import FakeSlurm, committed_scripts, runtime_argv

    for name, text in committed_scripts().items():
        assert "--lead-seconds" not in text, name
        signal = re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", text, re.M)
        assert ("--lead-from-signal" in text) == (signal is not None and ".local-cpu." not in name), name
    assert decide.signal_lead("#!/bin/bash\n#SBATCH --signal=B:USR1@180\n#SBATCH --signal=USR1@240\nset -e\n") == 240
    assert decide.signal_lead("#!/bin/bash\nset -e\n#SBATCH --signal=B:USR1@180\n") is None  # after a command
    script = committed_scripts()["torchtitan/llama3_8b_c4.nebius.sbatch"]
    ran = FakeSlurm(tmp_path).run_step(runtime_argv(script), FAKE_BATCH_SCRIPT=script, SLURM_GPUS_ON_NODE="8",
                                       FAKE_JOB_RECORD="JobId=41 TimeLimit=04:00:00")  # fmt: skip
    (launch,) = ran.launches()
    assert launch["env"]["COOKBOOK_STOP_LEAD_S"] == "180", ran.out


def test_a_lora_job_whose_run_folder_has_20_gb_free_trains(tmp_path):
    """#41 acceptance: the nebius LoRA script's own launch line, its run folder on a real 20 GB filesystem (tmpfs):
    the adapter (--checkpoint-gb=1) fits, so the batch step trains without a space line (cf74e12 asked 141 GB)."""
    import subprocess

    from batch_step import FakeSlurm, committed_scripts, runtime_argv

    argv = runtime_argv(committed_scripts()["torchtune/llama3_3_70b_lora.nebius.sbatch"])
    assert "--checkpoint-gb=1" in argv
    fs = tmp_path / "fs"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20g", "tmpfs", str(fs)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        ran = FakeSlurm(fs).run_step(argv, SLURM_GPUS_ON_NODE="8", COOKBOOK_CHECKPOINT_GB="")  # the script's own size
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
    assert ran.status == 0 and ran.launches(), ran.out
    assert "cookbook: RUN_DIR" not in ran.out, ran.out  # no space line: nothing short, nothing estimated short
