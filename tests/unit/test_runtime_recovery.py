"""Recovery inside the allocation (issue #40): the decisions as pure functions at 1, 16 and 1,000 nodes with 0, 1
and 8 spares, reservations exactly the job's size and budgets over time; then the batch step itself against a
fake Slurm (tests/unit/batch_step.py): a crashed node swapped for a spare in the same job, the same job requeued
without a node, a spent budget holding a resumable job, and never an ``sbatch``. The real thing on the local
cluster: tests/cluster/test_recovery_cluster.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from batch_step import RUNTIME_ROOT, FakeSlurm

from cookbook_runtime import decide, files
from cookbook_runtime.decide import Incident, NodeState

SIZES = (1, 16, 1000)
SPARES = (0, 1, 8)
HOUR = 3600.0
T0 = 1_800_000_000.0


def nodes(n: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(n)]


# ------------------------------------------------------------------ placement


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", SPARES)
def test_n_plus_k_nodes_train_on_n_with_the_batch_host_among_them(n: int, k: int):
    allocated = nodes(n + k)
    train, spares = decide.placement(allocated, k)
    assert len(train) == n and len(spares) == k and train[0] == allocated[0]
    assert set(train) | set(spares) == set(allocated)


def test_a_bad_node_neither_trains_nor_stands_by_but_the_batch_host_always_trains():
    train, spares = decide.placement(nodes(4), 1, bad=[nodes(4)[1]])
    assert train == [nodes(4)[0], nodes(4)[2], nodes(4)[3]] and spares == []
    train, _ = decide.placement(nodes(3), 1, bad=[nodes(3)[0]])
    assert train[0] == nodes(3)[0]


# ------------------------------------------------------------------ the one answer to a fault


def answer(n: int, k: int, fault: list[str], **kw: object) -> decide.Recovery:
    allocated = nodes(n + k)
    train, spares = decide.placement(allocated, k)
    defaults: dict = {"budget": 2, "lost": False, "resumable": True, "job_nodes": n + k}
    return decide.recovery(fault, spares, allocated[0], **{**defaults, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("n", (16, 1000))
@pytest.mark.parametrize("k", (1, 8))
def test_a_faulty_training_node_is_swapped_for_a_spare_in_the_same_job(n: int, k: int):
    bad = nodes(n + k)[n - 1]
    what = answer(n, k, [bad], lost=True)
    assert what.action == "spare" and what.nodes == (bad,) and what.spares == (nodes(n + k)[n],)


@pytest.mark.parametrize("n", SIZES)
def test_the_batch_host_is_never_swapped_it_leaves_by_a_requeue_of_the_same_job(n: int):
    what = answer(n, 8, [nodes(n + 8)[0]], eligible=n + 8)
    assert what.action == "requeue-excluding" and "batch host" in what.why


@pytest.mark.parametrize("n", (16, 1000))
def test_two_faults_and_one_spare_fall_back_to_the_requeue_when_the_partition_has_room(n: int):
    what = answer(n, 1, nodes(n + 1)[1:3], eligible=n + 5)
    assert what.action == "requeue-excluding" and "no spare left" in what.why


@pytest.mark.parametrize("n", SIZES)
def test_a_reservation_exactly_the_jobs_size_never_leaves_the_job_pending_for_ever(n: int):
    """Excluding a node of a reservation the job's size would pend until the reservation ends: train on the node
    that still answers; a lost one is requeued as it is (Slurm places the job once a node is back)."""
    bad = [nodes(n)[-1]] if n > 1 else [nodes(1)[0]]
    reservation = {x: NodeState("allocated", None) for x in nodes(n)}
    eligible = decide.eligible_nodes(reservation, bad)
    assert eligible == n - 1
    crash = answer(n, 0, bad, eligible=eligible)
    assert crash.action == "train-on" and "pending" in crash.why
    lost = answer(n, 0, bad, eligible=eligible, lost=True)
    assert lost.action == "requeue"


def test_down_and_drained_nodes_of_the_partition_are_not_eligible():
    states = {"a": NodeState("idle", None), "b": NodeState("down*", None), "c": NodeState("drained", None),
              "d": NodeState("allocated", None), "e": NodeState("mixed", None)}  # fmt: skip
    assert decide.eligible_nodes(states, ["d"]) == 2


def test_an_unknown_partition_is_never_excluded_from():
    assert answer(16, 0, [nodes(16)[3]], eligible=None).action == "train-on"


# ------------------------------------------------------------------ budgets over time


def incident(when: float, action: str = "spare") -> Incident:
    return Incident(when, "812", ("gpu0003",), "its ranks died of SIGKILL", action)


def test_the_budget_counts_recoveries_per_window_not_per_life():
    two_recent = [incident(T0 - 600), incident(T0 - 60)]
    assert decide.budget_left(two_recent, T0, 2, HOUR) == 0
    assert decide.budget_left([incident(T0 - 2 * HOUR), incident(T0 - 90 * 60)], T0, 2, HOUR) == 2
    assert decide.budget_left([incident(T0 - 600, "train-on-gate")], T0, 2, HOUR) == 2  # cost nothing


@pytest.mark.parametrize("n", SIZES)
def test_a_spent_budget_never_ends_a_job_that_can_resume_nor_holds_it_for_a_human(n: int):
    bad = [nodes(n + 1)[-2]] if n > 1 else [nodes(2)[1]]
    later = answer(n, 1, bad, budget=0)
    assert later.action == "requeue-later"
    assert answer(n, 1, bad, budget=0, lost=True).action == "requeue-later"
    assert answer(n, 1, bad, budget=0, resumable=False).action == "stop"
    assert answer(n, 1, bad, budget=0, at_gate=True).action == "train-on"  # at the gate: train on it


@pytest.mark.parametrize("n", SIZES)
def test_a_spent_budget_restarts_the_job_once_the_window_allows_a_recovery_again(n: int):
    """Two recoveries 10 and 1 min ago, 2 an hour: the older leaves the window in 50 min; then a recovery is
    allowed, and the deferred restart itself spends none (its start is the wait)."""
    history = [incident(T0 - 600), incident(T0 - 60)]
    assert decide.budget_left(history, T0, 2, HOUR) == 0
    assert decide.budget_back_in(history, T0, 2, HOUR) == pytest.approx(50 * 60)
    history.append(incident(T0, "requeue-later"))
    assert decide.budget_back_in(history, T0, 2, HOUR) == pytest.approx(50 * 60)
    assert decide.budget_left(history, T0 + 50 * 60, 2, HOUR) == 1
    assert decide.budget_back_in(history, T0 + 50 * 60, 2, HOUR) == 0
    assert decide.budget_back_in(history, T0, 0, HOUR) == HOUR  # no recoveries at all: a window
    assert answer(n, 1, [nodes(n + 1)[-2]], budget=decide.budget_left(history, T0, 2, HOUR)).action == "requeue-later"


def test_a_day_of_faults_at_1000_nodes_each_recovered_by_a_spare():
    """Eight faults over 24 h at 1,000 nodes with 8 spares and 2 recoveries an hour: every one by a spare."""
    allocated = nodes(1008)
    train, spares = decide.placement(allocated, 8)
    history: list[Incident] = []
    for h in range(8):
        now = T0 + h * 3 * HOUR
        bad = [train[100 + h]]
        what = decide.recovery(bad, spares, allocated[0], budget=decide.budget_left(history, now, 2, HOUR),
                               lost=h % 2 == 0, resumable=True, job_nodes=1008)  # fmt: skip
        assert what.action == "spare", (h, what)
        train = [what.spares[0] if x in bad else x for x in train]
        spares = [x for x in spares if x not in what.spares]
        history.append(Incident(now, "812", tuple(bad), "crash", what.action))
    assert len(set(train)) == 1000 and spares == []


def test_incidents_read_back():
    row = Incident(T0, "41", ("n2",), "its ranks died of SIGKILL", "spare", T0 - 3, T0 - 1, ("n3",))
    assert decide.parse_incidents(row.row() + "\nnot a row\n") == [row]


# ------------------------------------------------------------------ the culprit of a crash


@pytest.mark.parametrize("n", (2, 16, 1000))
def test_the_node_whose_ranks_died_of_a_signal_first_is_the_culprit(n: int):
    ns = nodes(n)
    exits = {ns[-1]: {"signals": ["SIGKILL"], "at": T0}}
    exits.update({x: {"signals": [], "at": T0 + 1} for x in ns[:-1]})  # the peers: an error, no signal
    assert decide.crashed_nodes(exits, ns) == [ns[-1]]


def test_a_stop_a_cancel_or_a_shared_cause_blames_nobody():
    ns = nodes(16)
    assert decide.crashed_nodes({ns[3]: {"signals": ["SIGTERM"], "at": T0}}, ns) == []
    everyone = {x: {"signals": ["SIGKILL"], "at": T0 + i / 100} for i, x in enumerate(ns)}
    assert decide.crashed_nodes(everyone, ns) == []
    later = {ns[3]: {"signals": ["SIGKILL"], "at": T0}, ns[4]: {"signals": ["SIGKILL"], "at": T0 + 5}}
    assert decide.crashed_nodes(later, ns) == [ns[3]]  # srun tearing the rest down comes later


# ------------------------------------------------------------------ the batch step, against a fake Slurm

ARGV = ["--nproc-per-node=1", "--requeue", "--resume=torchtitan", "--", "torchrun", "-m", "train"]


def checkpoint(run_dir: Path, step: int = 4) -> None:
    (run_dir / "checkpoint" / f"step-{step}").mkdir(parents=True)
    (run_dir / "checkpoint" / f"step-{step}" / ".metadata").write_text("")


def test_a_crashed_node_is_swapped_for_the_spare_and_the_job_trains_on_without_leaving_slurm(tmp_path):
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    ran = fake.run_step(["--spare-nodes=1", *ARGV], FAKE_SRUN="crash:n2", SLURM_JOB_NODELIST="n1,n2,n3",
                        SLURM_JOB_NUM_NODES="3")  # fmt: skip
    assert ran.status == 0, ran.out
    assert "cookbook: recovery: n2 (its ranks died of SIGKILL) replaced by spare n3 in job 41" in ran.out, ran.out
    assert re.search(r"cookbook: relaunching on n1,n3 from the newest checkpoint \(\d+ s after the fault\)", ran.out)
    assert ran.out.count("resuming from") == 2 and "job 41: 2 node(s) [n1,n3]" in ran.out
    first, second = ran.launches()
    assert "--nodelist=n1,n2" in first["argv"] and "--overlap" not in first["argv"]
    assert "--nodelist=n1,n3" in second["argv"] and "--overlap" in second["argv"]
    assert "--rdzv-id=41-1" in second["argv"] and "--nnodes=2" in second["argv"]
    assert not ran.argv("sbatch") and not [a for a in ran.argv("scontrol") if a[0].startswith("requeue")]
    (row,) = decide.parse_incidents(files.recoveries(fake.run_dir).read_text())
    assert (row.nodes, row.action, row.spares) == (("n2",), "spare", ("n3",))
    assert row.fault_at <= row.ended_at <= row.when


def test_a_launcher_killed_outright_is_named_by_srun_and_swapped_for_the_spare(tmp_path):
    """#40 item 2: n2's torchrun agent itself SIGKILLed leaves no exits record; srun's "n2: task 1: Killed" before
    its teardown names the node (n1's task, killed by that teardown, is not blamed)."""
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    ran = fake.run_step(["--spare-nodes=1", *ARGV], FAKE_SRUN="launcher-killed:n2", SLURM_JOB_NODELIST="n1,n2,n3",
                        SLURM_JOB_NUM_NODES="3")  # fmt: skip
    assert ran.status == 0, ran.out
    assert "srun: error: n2: task 1: Killed" in ran.out  # srun's own lines still reach the job log
    assert "cookbook: recovery: n2 (its launcher died of SIGKILL) replaced by spare n3 in job 41" in ran.out, ran.out
    first, second = ran.launches()
    assert "--nodelist=n1,n2" in first["argv"] and "--nodelist=n1,n3" in second["argv"]
    assert not ran.argv("sbatch") and not [a for a in ran.argv("scontrol") if a[0].startswith("requeue")]


@pytest.mark.parametrize(
    ("lines", "blamed"),
    [
        (["srun: error: n2: task 1: Killed", "srun: launch/slurm: _step_signal: Terminating StepId=41.0",
          "srun: error: n1: task 0: Killed"], {"n2": ["SIGKILL"]}),
        (["srun: error: n2: tasks 1-3: Segmentation fault (core dumped)"], {"n2": ["SIGSEGV"]}),
        (["srun: error: n2: task 1: Exited with exit code 1", "srun: error: n1: task 0: Killed"], {"n1": ["SIGKILL"]}),
        (["srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
          "srun: error: n2: task 1: Killed"], {}),
        (["1: srun: error: n2: task 1: Killed", "srun: error: n2: task 1: Exited with exit code 9"], {}),
    ],
)  # fmt: skip
def test_srun_names_the_nodes_whose_task_a_signal_ended_before_its_teardown(
    lines: list[str], blamed: dict, tmp_path: Path
):
    """What the step added to the job log (srun writes its own lines there; nothing is relayed, so no line of
    the training's is cut by another): an earlier launch's lines are not read again."""
    from cookbook_runtime import run

    log = tmp_path / "job.out"
    earlier = "srun: error: n3: task 2: Killed\nsrun: launch/slurm: _step_signal: Terminating StepId=41.0\n"
    log.write_text(earlier + "".join(line + "\n" for line in lines))
    found = run.srun_killed(log, len(earlier))
    assert {node: said["signals"] for node, said in found.items()} == blamed
    assert all(said["at"] == 0.0 for said in found.values())  # first by construction: the teardown came after
    assert run.srun_killed(None, 0) == {} and run.srun_killed(tmp_path / "gone", 0) == {}


def test_a_node_fail_slurm_already_moved_the_run_off_costs_nothing(tmp_path):
    """#40 item 3: n2 died in the previous run; Slurm's requeue placed the job on n1,n3: no recovery, no row in
    recoveries.tsv, the budget untouched, the job trains."""
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    files.state_dir(fake.run_dir).mkdir(parents=True)
    (files.state_dir(fake.run_dir) / files.RUNS).write_text(f"41\t0\tn1,n2\t{time.time() - 600:.0f}\t\t\n")
    ran = fake.run_step(
        ARGV, SLURM_RESTART_COUNT="1", SLURM_JOB_NODELIST="n1,n3", FAKE_SINFO="n1|allocated|\nn2|down*|"
    )
    assert ran.status == 0, ran.out
    assert "cookbook: node failure: n2 of job 41's previous run is down* (NODE_FAIL)" in ran.out, ran.out
    assert (
        "excluding n2 (NODE_FAIL in the previous run) by Slurm's requeue: this run has other nodes [n1,n3]" in ran.out
    )
    assert not files.recoveries(fake.run_dir).exists() or not files.recoveries(fake.run_dir).read_text().strip()
    assert len(ran.launches()) == 1 and not [a for a in ran.argv("scontrol") if a[0].startswith(("requeue", "update"))]


def test_a_node_the_gate_blames_at_the_start_is_replaced_by_the_spare_before_training(tmp_path):
    """#40 item 1: n2's own check fails at the gate, n3 stands by: n1,n3 train in the same job, nothing requeued;
    a swap before any launch spends no relaunch."""
    fake = FakeSlurm(tmp_path)
    argv = ["--spare-nodes=1", "--gate", *ARGV]
    ran = fake.run_step(
        argv, FAKE_GATE="ok", FAKE_GATE_FAIL="n2", SLURM_JOB_NODELIST="n1,n2,n3", SLURM_JOB_NUM_NODES="3"
    )
    assert ran.status == 0, ran.out
    assert "cookbook: pre-flight failed on n2: GPU 0: uncorrectable ECC errors" in ran.out, ran.out
    assert (
        "cookbook: recovery: n2 (pre-flight: GPU 0: uncorrectable ECC errors) replaced by spare n3 in job 41" in ran.out
    )
    assert "job 41: 2 node(s) [n1,n3]" in ran.out
    (launch,) = ran.launches()
    assert "--nodelist=n1,n3" in launch["argv"] and "--overlap" not in launch["argv"]
    assert not ran.argv("sbatch") and not [a for a in ran.argv("scontrol") if a[0].startswith(("requeue", "update"))]
    (row,) = decide.parse_incidents(files.recoveries(fake.run_dir).read_text())
    assert (row.nodes, row.action, row.spares) == (("n2",), "spare", ("n3",))


def test_no_spare_and_no_room_trains_on_the_node_after_a_crash(tmp_path):
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    ran = fake.run_step(ARGV, FAKE_SRUN="crash:n2", FAKE_SINFO="n1|allocated|\nn2|allocated|",
                        FAKE_JOB_RECORD="JobId=41 Partition=gpu ExcNodeList=(null)")  # fmt: skip
    assert ran.status == 0, ran.out
    assert "cookbook: keeping n2 (its ranks died of SIGKILL): no spare left (0 for 1); excluding would leave the " \
        "job pending (only 1 eligible node(s) for 2); training on it" in ran.out, ran.out  # fmt: skip
    assert len(ran.launches()) == 2 and not ran.argv("sbatch")


def test_no_spare_requeues_the_same_job_without_the_node_keeping_its_options(tmp_path):
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    record = "JobId=41 Partition=gpu QOS=high Account=ml Reservation=(null) ExcNodeList=gpu9"
    ran = fake.run_step(ARGV, FAKE_SRUN="crash:n2", FAKE_SINFO="n1|idle|\nn2|idle|\nn3|idle|\ngpu9|idle|",
                        FAKE_JOB_RECORD=record)  # fmt: skip
    assert ran.status == 0, ran.out
    assert "cookbook: excluding n2 (its ranks died of SIGKILL): job 41 requeued with ExcNodeList=gpu9,n2" in ran.out
    calls = [a for a in ran.argv("scontrol") if a[0] in ("requeuehold", "update", "release")]
    assert calls == [
        ["requeuehold", "41"],
        ["update", "JobId=41", "ExcNodeList=gpu9,n2", "StartTime=now+10"],
        ["release", "41"],
    ]
    assert not ran.argv("sbatch") and len(ran.launches()) == 1


def test_a_spent_budget_requeues_a_resumable_job_to_start_by_itself_after_the_window(tmp_path):
    """Never held for a human: requeuehold, StartTime when the budget allows a recovery again, release."""
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    files.state_dir(fake.run_dir).mkdir(parents=True)
    files.recoveries(fake.run_dir).write_text(incident(time.time() - 600).row() + "\n")
    ran = fake.run_step(["--max-retries=1", *ARGV], FAKE_SRUN="crash:n2")
    assert ran.status == 0, ran.out
    said = re.search(r"the recovery budget is spent; job 41 requeued to start again by itself at .+ \(in (\d+) min, "
                     r"once a recovery is allowed\): `scontrol update JobId=41 StartTime=now` starts it now, "
                     r"`scancel 41` cancels it$", ran.out, re.M)  # fmt: skip
    assert said and 49 <= int(said.group(1)) <= 50, ran.out
    calls = [a for a in ran.argv("scontrol") if a[0] in ("requeue", "requeuehold", "update", "release")]
    assert [a[0] for a in calls] == ["requeuehold", "update", "release"], calls
    assert calls[1][: 1 + 1] == ["update", "JobId=41"] and 2900 <= int(calls[1][2].split("+")[1]) <= 3000, calls
    rows = decide.parse_incidents(files.recoveries(fake.run_dir).read_text())
    assert rows[-1].action == "requeue-later" and decide.budget_left(rows, time.time(), 1, HOUR) == 0


def test_a_start_time_slurm_refuses_still_releases_the_job_and_says_so(tmp_path, monkeypatch):
    """Never a job left held: the release follows whatever the update said, and the answer says what failed."""
    from cookbook_runtime import slurm

    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", fake.env()["PATH"])
    monkeypatch.setenv("FAKE_UPDATE_STATUS", "1")
    ok, said = slurm.requeue_updated("41", "StartTime=now+3000", tries=2, pause=0)
    assert not ok and said.startswith("scontrol update StartTime=now+3000: ") and said.endswith("(released: True)")
    calls = [json.loads(line)["argv"][0] for line in fake.calls.read_text().splitlines()]
    assert calls == ["requeuehold", "update", "update", "release"]


def test_a_refused_requeue_is_said_not_taken_for_done(tmp_path):
    fake = FakeSlurm(tmp_path)
    ran = fake.run_step(ARGV, FAKE_SRUN="signal:USR1", FAKE_SCONTROL_STATUS="1")
    assert "cookbook: scontrol requeue 41 refused" in ran.out, ran.out


def test_no_runtime_module_calls_sbatch():
    for path in sorted((RUNTIME_ROOT / "cookbook_runtime").glob("*.py")):
        code = re.sub(r'""".*?"""|#.*', "", path.read_text(), flags=re.S)
        assert not re.search(r"""["']sbatch["']""", code), path


def test_hf_token_reaches_no_slurm_command(tmp_path):
    """The token is read for the ranks' environment only: no Slurm command gets it in an argument."""
    fake = FakeSlurm(tmp_path)
    checkpoint(fake.run_dir)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_secretsecret\n")
    ran = fake.run_step(["--spare-nodes=1", *ARGV], FAKE_SRUN="crash:n2", SLURM_JOB_NODELIST="n1,n2,n3")
    assert "HF token: present" in ran.out
    assert "hf_secretsecret" not in json.dumps([c["argv"] for c in ran.calls]) and "hf_secretsecret" not in ran.out


# ------------------------------------------------------------------ the gate's cost on a restart (#41 item 5)


def test_nodes_that_passed_the_whole_gate_in_this_job_recently_run_their_own_checks_only():
    rows = f"{T0 - 600:.0f}\t41\tn1,n2,n3\t14.0\tfull\n{T0 - 60:.0f}\t41\tn1,n2,n3\t2.0\tlocal\n"
    assert decide.gate_shortcut(rows, "41", ["n1", "n2", "n3"], T0, 6 * HOUR) == 600
    assert decide.gate_shortcut(rows, "41", ["n1", "n4"], T0, 6 * HOUR) is None  # n4 never passed
    assert decide.gate_shortcut(rows, "42", ["n1", "n2"], T0, 6 * HOUR) is None  # another job
    assert decide.gate_shortcut(rows, "41", ["n1"], T0 + 7 * HOUR, 6 * HOUR) is None  # too long ago
    assert decide.gate_shortcut("garbage\n", "41", ["n1"], T0, 6 * HOUR) is None


def test_a_requeued_start_on_nodes_that_passed_skips_the_collective(tmp_path):
    fake = FakeSlurm(tmp_path)
    argv = ["--nproc-per-node=1", "--gate", "--", "torchrun", "-m", "train"]
    first = fake.run_step(argv, FAKE_GATE="ok")
    assert "their own checks only" not in first.out and first.status == 0, first.out
    passes = files.gate_passes(fake.run_dir).read_text().split("\t")
    assert passes[1:3] == ["41", "n1,n2"] and passes[4].strip() == "full"
    again = fake.run_step(argv, FAKE_GATE="ok", SLURM_RESTART_COUNT="1")
    assert re.search(r"every node passed the whole gate in job 41 \d+ min ago: their own checks only", again.out)
    (gate,) = [a for a in again.argv("srun") if "cookbook_runtime.nodecheck" in a]
    assert "--local-only" in gate and "torch.distributed.run" not in gate
    other = fake.run_step(argv, FAKE_GATE="ok", SLURM_JOB_ID="42")
    assert "their own checks only" not in other.out
