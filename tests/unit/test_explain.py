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
        "straggler: rank 3 on n2 is slow in 100% of 11 steps: reaches each step 0.68 s after the first rank"
    ]
    assert straggler_lines(str(LOGS / "torchtitan_debug_2rank.log")) == []
    assert straggler_lines(str(LOGS / "no_such.log")) == []
