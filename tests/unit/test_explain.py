"""``explain`` on fixture logs: each explanation names its cause (README in tests/fixtures/logs)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cookbook.analysis.explain import (
    check_checkpointing,
    check_cpu_binding,
    check_gpus_per_node,
    check_scaling,
    explain_log,
    explain_plot,
)
from cookbook.analysis.stragglers import rank_step_times, stragglers, stragglers_plot
from cookbook.cli import main as cli_main
from cookbook.metrics import parse_log

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_nccl_on_sockets_is_named_from_a_real_public_log():
    report = explain_log(LOGS / "nccl_socket_gcp_slurm.log", nodes=2)
    assert report.causes[:2] == ["nccl_socket", "nccl_plugin_missing"]
    assert "NET/Socket : Using [0]eth0" in report.evidence[0].finding and "EFA" in report.evidence[0].fix
    # where TCP is all the cluster has (no fabric expected), or on one node, it is not a finding
    assert explain_log(LOGS / "nccl_socket_gcp_slurm.log", nodes=2, expects_fabric=False).causes == []
    assert explain_log(LOGS / "nccl_socket_gcp_slurm.log", nodes=1).causes == []


def test_a_fabric_log_is_not_blamed():
    # seed 003 (awsome-distributed-training on EFA): NCCL over the OFI plugin
    text = (LOGS / "seed_fsdp_llama3_8b.log").read_text()
    report = explain_log(LOGS / "seed_fsdp_llama3_8b.log", nodes=4)
    assert "nccl_socket" not in report.causes, (text[:500], report.render())


def test_slow_rank_is_named_with_its_host():
    report = explain_log(LOGS / "torchtitan_slow_rank.log", hosts=["n1", "n2"], procs_per_node=2)
    assert report.causes == ["straggler"]
    assert "rank 3 on n2" in report.evidence[0].finding
    found = stragglers(parse_log(LOGS / "torchtitan_slow_rank.log", ranks="all"))
    assert [s.rank for s in found] == [3] and found[0].slow_share == 1.0 and found[0].median_lag_s > 0.5
    table, fig = stragglers_plot(parse_log(LOGS / "torchtitan_slow_rank.log", ranks="all"))
    assert list(table["rank"]) == [0, 1, 2, 3] and fig.axes


def test_even_ranks_have_no_straggler():
    # a real 2-rank torchtitan run: both ranks log each step at the same millisecond
    df = parse_log(LOGS / "torchtitan_debug_2rank.log", ranks="all")
    assert len(rank_step_times(df)) > 0
    assert stragglers(df) == []


def test_per_rank_step_times_name_a_slow_rank():
    rows = [
        {"step": s, "rank": r, "split": "train", "seconds_per_step": 1.0 + (0.5 if r == 1 else 0.0)}
        for s in range(1, 8)
        for r in range(4)
    ]
    found = stragglers(pd.DataFrame(rows))
    assert [s.rank for s in found] == [1] and found[0].median_ratio == pytest.approx(1.5)


def test_dataloader_stall_is_named():
    report = explain_log(LOGS / "torchtitan_dataloader_stall.log")
    assert report.causes[0] == "dataloader_stall"
    assert "3 of" in report.evidence[0].finding and "num_workers" in report.evidence[0].fix
    assert 0.3 < report.evidence[0].cost < 0.6
    assert "dataloader_stall" not in explain_log(LOGS / "torchtitan_slow_rank.log").causes


def test_other_checks():
    assert check_gpus_per_node(4, 8)[0].cost == 0.5 and check_gpus_per_node(8, 8) == []
    assert check_cpu_binding("#SBATCH --nodes=2\n", 8)[0].kind == "cpu_binding"
    assert check_cpu_binding("#SBATCH --cpus-per-task=96\n", 8) == []
    assert check_scaling(3000, 6000, 4)[0].cost == 0.5 and check_scaling(5900, 6000, 4) == []
    ac = check_checkpointing("", "llama3_8b_c4", "h200", 2, 8, "full")
    assert ac and ac[0].kind == "activation_checkpointing" and ac[0].cost == pytest.approx(0.125)
    assert check_checkpointing("", "llama3_3_70b_full", "a100-40", 1, 8, "full") == []  # nothing lighter fits


def test_measured_vs_planned_mfu_and_the_cli(tmp_path, capsys):
    report = explain_log(
        LOGS / "torchtitan_dataloader_stall.log", recipe="llama3_8b_c4", gpu="h100", nodes=1, gpus_per_node=2
    )
    assert report.expected_mfu == pytest.approx(0.42) and report.measured_mfu is not None
    assert "planner expects 42.0%" in report.render()
    assert explain_plot(report).axes
    assert (
        cli_main(
            [
                "explain",
                str(LOGS / "nccl_socket_gcp_slurm.log"),
                "--nodes",
                "2",
                "--gpu",
                "h100",
                "--plot",
                str(tmp_path / "e.png"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "nccl_socket" in out and (tmp_path / "e.png").exists()
    assert cli_main(["explain", str(tmp_path / "missing.log")]) == 2
    assert cli_main(["explain", str(LOGS / "nccl_socket_gcp_slurm.log"), "--nodes", "0"]) == 2


def test_watch_lines_name_the_straggler():
    from cookbook.analysis.stragglers import straggler_lines

    assert straggler_lines(str(LOGS / "torchtitan_slow_rank.log"), ["n1", "n2"], 2) == [
        "straggler: rank 3 on n2 GPU 1 is slow in 100% of 11 steps: reaches each step 0.68 s after the first rank"
    ]
    assert straggler_lines(str(LOGS / "torchtitan_debug_2rank.log")) == []
    assert straggler_lines(str(LOGS / "no_such.log")) == []


TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def test_trace_stragglers_name_the_rank_the_others_wait_for():
    from cookbook.analysis.explain import check_trace_stragglers

    # synthetic H100 traces: rank 1's gemm is 2 ms longer, so rank 0 waits 20% of its step in the all-gather
    found = check_trace_stragglers(sorted((TRACES / "synthetic_gpu").glob("*.trace.json.gz")))
    assert [e.kind for e in found] == ["straggler"] and found[0].cost == pytest.approx(0.2)
    assert "they wait for rank 1" in found[0].finding
    # real CPU traces of two even ranks (spread under 10 points), and one rank alone: nothing to blame
    assert check_trace_stragglers(sorted((TRACES / "torchtune").glob("*.trace.json.gz"))) == []
    assert check_trace_stragglers(sorted((TRACES / "torchtitan").glob("*.trace.json.gz"))) == []
    report = explain_log(
        LOGS / "torchtitan_debug_2rank.log", traces=sorted((TRACES / "synthetic_gpu").glob("*.trace.json.gz"))
    )
    assert report.causes == ["straggler"]


def test_fabric_is_expected_from_the_profile():
    from cookbook.analysis.explain import expects_fabric

    assert expects_fabric("aws-efa") and expects_fabric("nebius") and expects_fabric("crusoe")
    assert not expects_fabric("generic") and not expects_fabric("local-cpu", on_gpus=False)
    assert expects_fabric(None, on_gpus=True) and not expects_fabric(None, on_gpus=False)


def _run_folder(tmp_path, log, profile, nodes=2):
    from cookbook.slurm.record import JobRecord

    folder = tmp_path / f"run-{profile}"
    folder.mkdir()
    script = folder / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --gpus-per-node=8\n")
    JobRecord("80", script, log, folder / "runs", "llama3_8b_c4", profile, "x").save()
    return folder


def test_explain_takes_the_fabric_from_the_run_profile(tmp_path, capsys):
    log = LOGS / "nccl_socket_gcp_slurm.log"
    assert cli_main(["explain", str(_run_folder(tmp_path, log, "aws-efa"))]) == 0
    assert "nccl_socket" in capsys.readouterr().out
    assert cli_main(["explain", str(_run_folder(tmp_path, log, "generic"))]) == 0  # TCP may be all it has
    assert "nccl_socket" not in capsys.readouterr().out


class FakeSlurm:
    """What ``watch`` and ``job_hosts`` ask Slurm, answered from a fixture (no cluster)."""

    def __init__(self, log, nodes="n[1-2]", env=None):
        self.log, self.nodes, self.asked = log, nodes, []

    def state(self, job_id):
        from cookbook.slurm.client import JobInfo

        return JobInfo(job_id, "COMPLETED", "0:0", self.nodes, "sacct")

    def output_path(self, job_id):
        return self.log

    def hostnames(self, nodelist):
        self.asked.append(nodelist)
        return {"n[1-2]": ["n1", "n2"]}[nodelist]


def test_watch_names_the_straggler_and_its_host(tmp_path, capsys, monkeypatch):
    import cookbook.slurm.client as client_module

    log = tmp_path / "slow-80.out"
    log.write_bytes((LOGS / "torchtitan_slow_rank.log").read_bytes())
    monkeypatch.setattr(client_module, "SlurmClient", lambda *a, **k: FakeSlurm(log))
    assert cli_main(["watch", "80", "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "job 80 ended COMPLETED" in out
    assert "straggler: rank 3 on n2 GPU 1 is slow in 100% of 11 steps" in out  # 4 ranks on 2 hosts: ranks 2, 3 on n2


def test_hosts_come_from_the_log_or_slurm():
    from cookbook.analysis.stragglers import job_hosts, log_nodelist

    requeued = LOGS / "torchtitan_requeued_local.log"  # the script printed `job 80: 2 node(s) [n[1-2]], ...`
    assert log_nodelist(requeued) == "n[1-2]" and log_nodelist(LOGS / "torchtitan_slow_rank.log") is None
    fake = FakeSlurm(requeued)
    assert job_hosts(requeued, "80", fake) == ["n1", "n2"] and fake.asked == ["n[1-2]"]
    assert job_hosts(LOGS / "torchtitan_slow_rank.log", "80", fake) == ["n1", "n2"]  # sacct's NodeList
    assert job_hosts(LOGS / "torchtitan_slow_rank.log", "80", fake, nodelist="a1,a2") == ["a1", "a2"]
    assert job_hosts(LOGS / "torchtitan_slow_rank.log", None, fake) is None
    assert job_hosts(LOGS / "torchtitan_slow_rank.log", "80", FakeSlurm(requeued, nodes="(Resources)")) is None


def test_explain_names_the_host_without_hosts_given(tmp_path, capsys, monkeypatch):
    import cookbook.slurm.client as client_module

    # the slow-rank log as a generated script writes it: its first line names the nodes
    log = tmp_path / "slow-80.out"
    log.write_text(
        "job 80: 2 node(s) [n[1-2]], rendezvous 10.0.0.1:29500, run dir /r\n"
        + (LOGS / "torchtitan_slow_rank.log").read_text()
    )
    monkeypatch.setattr(client_module, "SlurmClient", lambda *a, **k: FakeSlurm(log))
    assert cli_main(["explain", str(log)]) == 0
    assert "rank 3 on n2" in capsys.readouterr().out
