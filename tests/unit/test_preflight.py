"""The pre-flight gate's pieces that need no cluster: the standalone check's summary of per-rank reports
(one line per node, failing nodes to a file, exit codes), its interface matching (NCCL_SOCKET_IFNAME syntax),
a real `check` run as one CPU process, the profiles' thresholds (each with a source) as the runtime's switches
and the gate's command line, and the log report of `cookbook metrics`/`watch`. The gate on a real cluster, with a node
excluded and NODE_FAIL: tests/cluster/test_preflight_cluster.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_step import FakeSlurm, runtime_args, runtime_argv

from cookbook.analysis.node_health import node_events, node_report
from cookbook.cli import main
from cookbook.render import render_job
from cookbook.spec import JobSpec, profile_defaults, profiles
from cookbook_runtime import nodecheck as preflight
from cookbook_runtime.decide import GateThresholds, GateVerdict

SCRIPT = Path(preflight.__file__)
MODULE = [sys.executable, "-m", "cookbook_runtime.nodecheck"]


def _report(out: Path, node: str, rank: int, failures: list[str], **measures: object) -> None:
    """Local rank ``rank``'s report (a new one, or in place of its earlier one) in its node's one file, as the
    gate's local rank 0 writes it."""
    report = {"node": node, "local_rank": rank, "failures": failures, "measures": measures, "seconds": 3.2}
    path = preflight.report_path(out, node)
    ranks = [r for r in (json.loads(path.read_text())["ranks"] if path.exists() else []) if r["local_rank"] != rank]
    path.write_text(json.dumps({"node": node, "ranks": sorted([*ranks, report], key=lambda r: r["local_rank"])}))


def _ranks(out: Path, node: str) -> list[dict]:
    """The reports of ``node``'s local ranks, from its one file."""
    return list(json.loads(preflight.report_path(out, node).read_text())["ranks"])


def _judge(out: Path, nodes: str, procs: int = 1) -> tuple[GateVerdict, str]:
    """The batch step's reading of the reports: the verdict and the lines it logs."""
    lines: list[str] = []
    verdict = preflight.judge(out, nodes.split(), procs, 0, GateThresholds(), lines.append)
    return verdict, "\n".join(lines)


def test_summary_blames_the_node_whose_own_checks_failed_never_one_that_did_not_report(tmp_path: Path):
    _report(tmp_path, "n1", 0, [], matmul_tflops=700.0, allreduce_busbw_gbps=300.0)
    _report(tmp_path, "n1", 1, [], matmul_tflops=650.0)
    _report(tmp_path, "n2", 0, ["network interface ib0 not present (have eth0, lo)"], matmul_tflops=700.0)
    _report(tmp_path, "n2", 1, ["matmul on GPU 1: 100 TFLOP/s < 494 TFLOP/s"])
    _report(tmp_path, "n3", 0, [])
    verdict, out = _judge(tmp_path, "n1 n2 n3", procs=2)
    assert "cookbook: pre-flight ok on n1 in 3.2 s: matmul_tflops 650.0, allreduce_busbw_gbps 300.0" in out
    assert (
        "cookbook: pre-flight failed on n2: network interface ib0 not present (have eth0, lo); "
        "matmul on GPU 1: 100 TFLOP/s < 494 TFLOP/s" in out
    )
    assert "pre-flight failed on n3" not in out and "1 of 2 local rank(s) of n3 did not report" in verdict.unattributed
    assert list(verdict.blame) == ["n2"] and verdict.exclude == ["n2"]


def _pairs(*found: tuple[int, str, float | None]) -> list[dict]:
    return [{"round": r, "partner": x, "gbps": g} for r, x, g in found]


def test_the_judge_names_the_node_slow_with_a_partner_that_passed_with_another(tmp_path: Path):
    """Issue #41 item 3, from the report files: round 1 n1-n2 and n3-n4, n3-n4 slow; round 2 n3 with the
    known-good n1 (slow), n4 with n2 (fine): n3 is named, n4 is not. Each side reports; the slower counts."""
    _report(tmp_path, "n1", 0, [], pairs=_pairs((1, "n2", 40.0), (2, "n3", 3.0)))
    _report(tmp_path, "n2", 0, [], pairs=_pairs((1, "n1", 41.0), (2, "n4", 39.0)))
    _report(tmp_path, "n3", 0, [], pairs=_pairs((1, "n4", 3.1), (2, "n1", 3.2)))
    _report(tmp_path, "n4", 0, [], pairs=_pairs((1, "n3", 2.9), (2, "n2", 40.0)))
    lines: list[str] = []
    verdict = preflight.judge(tmp_path, ["n1", "n2", "n3", "n4"], 1, 0, GateThresholds(busbw_floor_gbps=10.0),
                              lines.append)  # fmt: skip
    assert verdict.exclude == ["n3"] and not verdict.stop, verdict
    said = "cookbook: pre-flight failed on n3: link bandwidth with n1: 3 GB/s < 10 GB/s (n1 passed with n2); link "
    assert any(line.startswith(said + "bandwidth with n4: 2.9 GB/s") for line in lines), lines


def test_a_fabric_at_socket_speed_on_every_pair_stops_in_one_line_naming_no_node(tmp_path: Path):
    for x, y in (("n1", "n2"), ("n2", "n1")):
        _report(tmp_path, x, 0, [], pairs=_pairs((1, y, 1.2)))
    lines: list[str] = []
    verdict = preflight.judge(tmp_path, ["n1", "n2"], 1, 0, GateThresholds(busbw_floor_gbps=35.0), lines.append)
    assert not any("failed on" in line for line in lines)
    assert verdict.stop and not verdict.blame and "COOKBOOK_FABRIC_STOP=0" in verdict.unattributed


@pytest.mark.parametrize(
    ("log", "net"),
    [("NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.9.1-aws\nNCCL INFO Using network Libfabric", "Libfabric"),
     ("NCCL INFO NET/Plugin: Could not find: libnccl-net.so\nNCCL INFO Using network Socket", "Socket"),
     ("NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.7.4-aws", "Libfabric"), ("nothing", None)],
)  # fmt: skip
def test_the_gate_reads_nccls_own_network_line(log: str, net: str | None):
    assert preflight.nccl_network(log) == net


STALL = "import time, torch.distributed as d; d.all_reduce = lambda *a, **k: time.sleep(3600); "  # never answers


def _three_nodes(out: Path, port: int, timeout: float, stalled: str = "") -> list[subprocess.Popen]:
    """The gate's check on three CPU "nodes" (one process each, as srun starts them); the ``stalled`` node's
    all-reduce never answers (a hung NIC or GPU), everything else of it is the real check."""
    args = [f"--out={out}", f"--master=127.0.0.1:{port}", "--allreduce-mb=1", f"--timeout={timeout:g}",
            "--matmul-seconds=0.05", "--min-busbw=0.0001"]  # fmt: skip
    procs = []
    for i in range(3):
        node = f"n{i + 1}"
        run = f"{STALL if node == stalled else ''}from cookbook_runtime.nodecheck import main; main({['check', *args]})"
        env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_PROCID": str(i), "SLURM_NTASKS": "3",
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", run], env=env))
    return procs


@pytest.mark.slow
def test_three_cpu_processes_pair_in_two_rounds_and_the_odd_node_meets_a_good_one(tmp_path: Path):
    """The network part for real (gloo, one process per node as srun starts them): round 1 pairs n1-n2, round 2
    the odd n3 with a node of a pair that passed; every report holds its pairs and the judge blames nobody."""
    out, port = tmp_path / "pf", 29000 + os.getpid() % 1000
    procs = _three_nodes(out, port, 60.0)
    assert [p.wait(timeout=240) for p in procs] == [0, 0, 0]
    pairs = {x: _ranks(out, x)[0]["measures"]["pairs"] for x in ("n1", "n2", "n3")}
    assert [(p["round"], p["partner"]) for p in pairs["n2"]] == [(1, "n1")], pairs
    assert [(p["round"], p["partner"]) for p in pairs["n3"]] in ([(2, "n1")], [(2, "n2")]), pairs
    assert all(p["gbps"] and p["gbps"] > 0 for ps in pairs.values() for p in ps), pairs
    verdict, said = _judge(out, "n1 n2 n3")
    assert not verdict.blame and not verdict.unattributed and said.count("pre-flight ok") == 3, said


@pytest.mark.slow
def test_a_pair_that_never_answers_is_cut_at_the_timeout_and_its_node_named(tmp_path: Path):
    """Issue #41 (audit): n2's all-reduce with n1 never answers. n1's pair gives up after the gate's 5 s
    timeout (cf74e12's groups had torch's default, 30 min for gloo), round 2 pairs n1 with n3, both are through
    within seconds, and n2 -- stopped by SIGTERM as the gate's budget ends -- is named by the verdict."""
    out = tmp_path / "pf"
    n1, n2, n3 = _three_nodes(out, 29000 + (os.getpid() + 500) % 1000, 5.0, stalled="n2")
    try:
        began = time.monotonic()
        assert [n1.wait(timeout=150), n3.wait(timeout=60)] == [0, 0]
        took = time.monotonic() - began
        assert n2.poll() is None  # still in its all-reduce
        n2.terminate()
        assert n2.wait(timeout=30) == 0
    finally:
        for p in (n1, n2, n3):
            p.kill()
    pairs = {x: [(p["round"], p["partner"], p["gbps"]) for p in _ranks(out, x)[0]["measures"]["pairs"]]
             for x in ("n1", "n3")}  # fmt: skip
    assert pairs["n1"][0] == (1, "n2", None) and pairs["n1"][1][:2] == (2, "n3") and pairs["n1"][1][2], (
        pairs, _ranks(out, "n3")
    )  # fmt: skip
    assert "SIGTERM" in _ranks(out, "n2")[0]["collective_error"]  # what n2 had when stopped: written
    verdict, said = _judge(out, "n1 n2 n3")
    assert verdict.exclude == ["n2"], said
    assert "pre-flight failed on n2: link bandwidth with n1: the all-reduce failed (n1 passed with n3)" in said
    print(f"n1 through in {took:.0f} s with a 5 s pair timeout")


@pytest.mark.parametrize(
    ("spec", "present"), [("", True), ("lo", True), ("=lo", True), ("^lo", None), ("nosuchif0", False), ("=l", False)]
)
def test_interface_matching_follows_nccl_socket_ifname(spec: str, present: bool | None):
    problem = preflight.interface_present(spec)
    if present is None:  # "every interface but lo": present where the machine has another one
        assert (problem is None) == any(n != "lo" for n in os.listdir("/sys/class/net"))
    else:
        assert (problem is None) is present, problem


@pytest.mark.slow
def test_check_runs_as_one_cpu_process_and_the_injection_fails_only_its_node(tmp_path: Path):
    out = tmp_path / "pf"
    env = {**os.environ, "COOKBOOK_PREFLIGHT_INJECT": "thisnode:bad DIMM", "SLURMD_NODENAME": "thisnode"}
    cmd = [*MODULE, "check", f"--out={out}", "--matmul-min-tflops=0.0001", "--min-free-gb=0.01"]
    subprocess.run(cmd, env=env, check=True, timeout=120)
    [report] = _ranks(out, "thisnode")
    assert report["failures"] == ["bad DIMM (injected by COOKBOOK_PREFLIGHT_INJECT)"]
    assert report["measures"]["matmul_tflops"] > 0.0001 and report["measures"]["run_dir"] == "writable"
    subprocess.run(cmd, env={**env, "SLURMD_NODENAME": "othernode"}, check=True, timeout=120)
    assert _ranks(out, "othernode")[0]["failures"] == []


def _flags(argv: list[str]) -> dict[str, float]:
    """``--name=NUMBER`` words of a command line as ``{name: value}``."""
    out = {}
    for word in argv:
        name, eq, value = word.partition("=")
        if eq:
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def test_every_profile_has_sourced_thresholds_and_the_script_carries_them(tmp_path: Path):
    """Each profile's thresholds have a source, reach the script's runtime switches, and -- the batch step run
    for real against stand-in srun/scontrol -- the node check, which runs before the training launch."""
    for profile in profiles().values():
        pf = profile.gate()
        thresholds = [pf.allreduce_min_busbw_gbps, pf.min_free_disk_gb, pf.time_limit_s, pf.max_retries]
        thresholds += [t for t in (pf.matmul_fraction, pf.matmul_min_tflops) if t]
        assert all(t.source and t.value >= 0 for t in thresholds), profile.name
        assert (pf.matmul_fraction is not None) == profile.uses_gpus, profile.name
        assert pf.time_limit_s.value <= (60 if profile.uses_gpus else 90)
        spec = JobSpec(recipe="fsdp_llama3_1_8b", profile=profile.name, **profile_defaults(profile.name))
        job = render_job(spec)
        assert job.files["cookbook_runtime/nodecheck.py"] == SCRIPT.read_text()
        args = runtime_args(job.script)
        matmul_fraction = pf.matmul_fraction.value if pf.matmul_fraction else 0.0
        matmul_min_tflops = pf.matmul_min_tflops.value if pf.matmul_min_tflops else 0.0
        assert args.gate and not args.gate_strict, profile.name
        assert (args.gate_seconds, args.gate_busbw_floor, args.gate_min_free_gb, args.gate_allreduce_mb) == (
            pf.time_limit_s.value, pf.allreduce_min_busbw_gbps.value, pf.min_free_disk_gb.value, pf.allreduce_mb,
        )  # fmt: skip
        assert (args.gate_matmul_fraction, args.gate_matmul_min_tflops) == (matmul_fraction, matmul_min_tflops)
        assert args.max_retries == int(pf.max_retries.value)
        gpus = {"SLURM_GPUS_ON_NODE": str(spec.gpus_per_node)} if profile.uses_gpus else {}
        argv = [a for a in runtime_argv(job.script) if not a.startswith("--checkpoint-gb=")]  # whatever /tmp holds
        ran = FakeSlurm(tmp_path / profile.name).run_step(argv, **gpus)
        pyenv, check, launch = ran.argv("srun")  # the nodes' Python, the gate, then the ranks
        assert pyenv[-2:] == ["cookbook_runtime.pyenv", "torch"], pyenv
        assert "cookbook_runtime.nodecheck" in check and "cookbook_runtime.nodecheck" not in launch, ran.out
        measured = _flags(check[check.index("check") :])
        assert measured["--min-busbw"] == pf.allreduce_min_busbw_gbps.value, profile.name
        assert measured["--min-free-gb"] == pf.min_free_disk_gb.value
        assert measured["--matmul-fraction"] == matmul_fraction
        assert measured["--matmul-min-tflops"] == matmul_min_tflops
        assert measured["--allreduce-mb"] == pf.allreduce_mb
        assert measured["--gpus"] == (spec.gpus_per_node if profile.uses_gpus else 0)
        assert "cookbook: pre-flight took" in ran.out


def test_the_gate_is_skipped_on_request_and_the_retry_budget_can_be_overridden(tmp_path: Path):
    """COOKBOOK_PREFLIGHT=0 trains without the gate; COOKBOOK_MAX_RETRIES overrides the profile's budget: at 0 a
    node at fault (here a hung rank) is named and not recovered from, and with no checkpoint to resume the job
    ends (with one, it is held: tests/unit/test_runtime_recovery.py)."""
    job = render_job(JobSpec(recipe="fsdp_llama3_1_8b", profile="local-cpu", **profile_defaults("local-cpu")))
    argv = runtime_argv(job.script)
    skipped = FakeSlurm(tmp_path / "skipped").run_step(argv, COOKBOOK_PREFLIGHT="0")
    assert len(skipped.argv("srun")) == 1 and "pre-flight" not in skipped.out
    spent = FakeSlurm(tmp_path / "spent").run_step(argv, COOKBOOK_MAX_RETRIES="0", FAKE_SRUN="hang")
    assert "cookbook: not recovering from n2 (hang: rank 1 on n2" in spent.out, spent.out
    assert "the recovery budget is spent and there is no checkpoint to resume; ending job 41" in spent.out
    assert spent.status == 1 and not [a for a in spent.argv("scontrol") if a[0].startswith(("update", "requeue"))]
    assert not spent.argv("sbatch")


def test_node_report_says_what_the_gate_found_and_what_was_done(tmp_path: Path):
    log = tmp_path / "job.out"
    log.write_text(
        "HF token: absent\n"
        "cookbook: pre-flight ok on n2 in 6 s: matmul_tflops 0.02\n"
        "cookbook: pre-flight failed on n1: GPU 3 fell off the bus\n"
        "cookbook: pre-flight took 17 s on 2 node(s)\n"
        "cookbook: excluding n1 (pre-flight: GPU 3 fell off the bus) by resubmission with --exclude=n1 "
        "(scontrol update ExcNodeList is refused for a running job): job 3 (retry 1 of 2); ending job 2\n"
        "cookbook: node failure: n4 of job 2's previous run is down* (NODE_FAIL)\n"
        "cookbook: not excluding n1 (x): the retry budget is spent (2 of COOKBOOK_MAX_RETRIES=2); ending job 9\n"
    )
    kinds = [(e.kind, e.node) for e in node_events(log)]
    assert kinds == [
        ("preflight_ok", "n2"),
        ("preflight_failed", "n1"),
        ("preflight_time", None),
        ("excluded", "n1"),
        ("node_failure", "n4"),
        ("not_excluded", None),
    ]
    report = node_report(log)
    assert report[1] == "pre-flight FAILED on n1: GPU 3 fell off the bus"
    assert report[3].startswith("done: excluded n1 (pre-flight: GPU 3 fell off the bus) by resubmission")
    assert report[5].startswith("not done: n1 (x): the retry budget is spent")
    assert [e.line_number for e in node_events(log)] == [2, 3, 4, 5, 6, 7]
    # `cookbook metrics LOG` prints the same report, from the lines its one diagnose pass collected
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["metrics", str(log)]) == 0
    assert [ln.removeprefix("nodes: ") for ln in out.getvalue().splitlines() if ln.startswith("nodes: ")] == report


NODE_FAIL_LOG = (
    "step 3 loss 2.1\n"
    "srun: error: Node failure on n3\n"
    "slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2025-01-01T00:00:09 DUE TO NODE FAILURE ***\n"
    "cookbook: node failure: n3 of job 12's previous run is down* (NODE_FAIL)\n"
)
EXCLUDED = (
    "cookbook: excluding n3 (NODE_FAIL in the previous run) by Slurm's requeue: this run has other nodes [n[1-2]] "
    "(retry 1 of 2)\n"
)
SPENT = (
    "cookbook: not retrying after NODE_FAIL on n3: the retry budget is spent (COOKBOOK_MAX_RETRIES=2); ending job 12\n"
)


def _diagnose_cli(log: Path) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", str(log)]) == 0
    return out.getvalue().splitlines()


def test_diagnose_prints_the_node_report_and_no_stale_advice_after_a_node_fail(tmp_path: Path):
    """`cookbook diagnose LOG` prints the node report `metrics`/`watch` print; a NODE_FAIL the job already excluded
    and requeued is reported as done, not with the advice to resubmit excluding the node."""
    log = tmp_path / "job.out"
    log.write_text(NODE_FAIL_LOG + EXCLUDED + "step 4 loss 2.0\n")
    printed = _diagnose_cli(log)
    assert [ln.removeprefix("nodes: ") for ln in printed if ln.startswith("nodes: ")] == node_report(log)
    assert "nodes: node n3 failed under the job: of job 12's previous run is down* (NODE_FAIL)" in printed
    assert any(
        ln.startswith("nodes: done: excluded n3 (NODE_FAIL in the previous run) by Slurm's requeue") for ln in printed
    )
    text = "\n".join(printed)
    assert "slurm_node_fail" in text and "resubmit excluding it" not in text, text
    assert "already done by the job: excluded n3 and ran again (line 5" in text, text
    assert "no known failure found" not in text
    # the same lines from `cookbook metrics LOG` (one function prints both)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["metrics", str(log)]) == 0
    assert [ln for ln in out.getvalue().splitlines() if ln.startswith(("nodes: ", "    -> "))] == [
        ln for ln in printed if ln.startswith(("nodes: ", "    -> "))
    ]


@pytest.mark.parametrize("after", ["", SPENT], ids=["not-excluded", "budget-spent"])
def test_diagnose_keeps_the_node_fail_advice_when_the_job_did_not_exclude(tmp_path: Path, after: str):
    log = tmp_path / "job.out"
    log.write_text(NODE_FAIL_LOG + (EXCLUDED + after if after else ""))
    text = "\n".join(_diagnose_cli(log))
    assert "resubmit excluding it (--exclude=NODE)" in text and "already done by the job" not in text, text
    if after:
        assert "nodes: not done: after NODE_FAIL on n3: the retry budget is spent" in text, text


def test_the_efa_plugin_is_found_where_aws_installs_it_and_its_absence_blames_no_node(tmp_path, monkeypatch):
    """#30 item 4: without aws-ofi-nccl NCCL quietly uses sockets. The gate names it; every node alike blames none
    and (#41 item 4) stops the job in one line with the fix and the override: it would train at socket speed."""
    monkeypatch.setattr(preflight, "PLUGIN_DIRS", ())
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "lib"))
    assert preflight.nccl_net_plugin() is None  # this machine: no plugin anywhere
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnccl-net-ofi.so").touch()
    assert preflight.nccl_net_plugin() == str(tmp_path / "lib" / "libnccl-net-ofi.so")
    missing = "aws-ofi-nccl's NCCL plugin (libnccl-net*.so) not found on LD_LIBRARY_PATH: NCCL would fall back"
    for node in ("n1", "n2", "n3"):
        _report(tmp_path, node, 0, [missing], matmul_tflops=700.0)
    verdict, _ = _judge(tmp_path, "n1 n2 n3")
    assert not verdict.blame and verdict.stop and "missing on all 3 nodes" in verdict.unattributed
    assert "Fix: install aws-ofi-nccl" in verdict.unattributed and "COOKBOOK_FABRIC_STOP=0" in verdict.unattributed
    _report(tmp_path, "n1", 0, [], matmul_tflops=700.0)
    _report(tmp_path, "n2", 0, [], matmul_tflops=700.0)
    verdict, _ = _judge(tmp_path, "n1 n2 n3")
    assert list(verdict.blame) == ["n3"]  # one node without it, its peers with it: that node's own fault
