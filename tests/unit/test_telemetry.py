"""The nodes' GPU/NIC telemetry (issue #32): the runtime's sampler, driven by the local bench's fake NVML (recorded
values: a throttled GPU, an XID, ECC errors) and a fake sysfs of InfiniBand counters; what the cookbook reads from
it (findings, node lines, energy, the plot, explain's evidence); the gate's GPU health at 1, 16 and 1,000 nodes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from cookbook.analysis.explain import check_telemetry
from cookbook.metrics import telemetry as readings
from cookbook.paths import project_root
from cookbook_runtime import decide, files, telemetry
from cookbook_runtime.decide import GateThresholds, NodeReport

FAKE = project_root() / "cookbook" / "local" / "fake_nvml"
HEALTHY = {
    "gpus": 8, "sm_mhz": 1980, "mem_mhz": 2619, "power_w": 650, "power_limit_w": 700, "temp_c": 62,
    "util_pct": 99, "mem_used_mib": 61000, "throttle": 0, "ecc_uncorrected": 0,
}  # fmt: skip


def fake_nvml(tmp_path: Path, node: str, nodes: dict[str, Any]) -> ModuleType:
    """The fake pynvml, loaded under its own name, answering as ``node`` from a file of recorded values."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "nvml.json").write_text(json.dumps({"default": HEALTHY, "nodes": nodes}))
    os.environ["COOKBOOK_FAKE_NVML"], os.environ["SLURMD_NODENAME"] = str(tmp_path / "nvml.json"), node
    spec = importlib.util.spec_from_file_location(f"fake_pynvml_{node}", FAKE / "pynvml.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ib_port(root: Path, device: str = "mlx5_0", port: str = "1", **counters: int) -> Path:
    folder = root / device / "ports" / port / "counters"
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in counters.items():
        (folder / name).write_text(f"{value}\n")
    return folder


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COOKBOOK_FAKE_NVML", "SLURMD_NODENAME"):
        monkeypatch.delenv(name, raising=False)


def sampled(tmp_path: Path, node: str, nodes: dict[str, Any], seconds: float = 0.5, bump: int = 0) -> pd.DataFrame:
    """The sampler on ``node`` for ``seconds`` at 0.1 s (a NIC's symbol errors raised by ``bump`` half-way)."""
    nvml = telemetry.Nvml(fake_nvml(tmp_path, node, nodes))
    sysfs = tmp_path / f"ib-{node}"
    counters = ib_port(sysfs, symbol_error=3, link_downed=1)
    out = files.telemetry_dir(tmp_path / "run", "7", 0) / f"{node}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    worker = threading.Thread(target=telemetry.run, args=(out, 0.1, stop, nvml, sysfs))
    worker.start()
    time.sleep(seconds / 2)
    if bump:
        (counters / "symbol_error").write_text(f"{3 + bump}\n")
    time.sleep(seconds / 2)
    stop.set()
    worker.join(5)
    return readings.read_telemetry(tmp_path / "run")


def test_every_sample_is_a_row_per_gpu_the_host_and_each_nic_port_in_one_schema(tmp_path: Path) -> None:
    df = sampled(tmp_path, "n1", {"n1": {"xid": {"3": [79]}}})
    csv = next((tmp_path / "run").rglob("n1.csv"))
    assert csv.read_text().splitlines()[0] == ",".join(telemetry.COLUMNS)
    assert csv.parent.name == "7-0" and csv.parent.parent.name == files.TELEMETRY
    times = df["time"].unique()
    assert len(times) >= 3
    first = df[df["time"] == times[0]]
    assert sorted(first["device"]) == sorted([*map(str, range(8)), "host", "mlx5_0:1"])
    gpu = first[first["device"] == "0"].iloc[0]
    assert (gpu["sm_mhz"], gpu["power_w"], gpu["power_limit_w"], gpu["temp_c"]) == (1980, 650.0, 700, 62)
    assert first[first["device"] == "mlx5_0:1"].iloc[0]["nic_errors"] == 4  # symbol 3 + link downed 1
    xids = df[df["xid"].notna()]
    assert list(zip(xids["device"], xids["xid"], strict=True)) == [("3", "79")]  # reported once, as NVML does


def test_a_node_without_nvml_records_its_host_and_says_so_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(project_root() / "slurm-recipes"),
        files.TELEMETRY_DIR_ENV: str(tmp_path / "t"),
        files.TELEMETRY_S_ENV: "0.1",
        "SLURMD_NODENAME": "cpu1",
        telemetry.SYSFS_ENV: str(tmp_path / "none"),
    }
    code = "import time; from cookbook_runtime import telemetry; s = telemetry.start_from_env(); time.sleep(0.4)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (said,) = [ln for ln in r.stderr.splitlines() if "telemetry" in ln]
    assert said.startswith("cookbook: telemetry on cpu1: host only, ")
    rows = pd.read_csv(tmp_path / "t" / "cpu1.csv", dtype={"device": str})
    assert set(rows["device"]) == {"host"} and rows["load"].notna().all()


def test_a_week_at_the_default_interval_stays_under_the_stated_size_and_a_longer_run_samples_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    df = sampled(tmp_path, "n1", {}, seconds=0.3)
    csv = next((tmp_path / "run").rglob("n1.csv"))
    samples = df["time"].nunique()
    per_sample = (csv.stat().st_size - len(csv.read_text().splitlines()[0])) / samples  # 8 GPUs, host, 1 port
    week = per_sample * (1 + 3 / 10) * 7 * 86400 / 10  # + 3 more ports (13 rows, not 10)
    assert week < 50e6, f"{week / 1e6:.0f} MB a node-week at 10 s"
    print(
        f"telemetry: {per_sample:.0f} bytes a sample (8 GPUs, host, 1 port); a node-week at 10 s: {week / 1e6:.0f} MB"
    )
    monkeypatch.setattr(telemetry, "MAX_BYTES", 200)  # the header ~130 bytes, a host row ~20
    stop, seen = threading.Event(), []
    real_wait = stop.wait

    def wait(timeout: float) -> bool:
        seen.append(round(timeout, 1))
        return len(seen) > 30 or real_wait(0)

    monkeypatch.setattr(stop, "wait", wait)
    telemetry.run(tmp_path / "long.csv", 1.0, stop, None, tmp_path / "none")
    assert seen[0] == 1.0 and max(seen) >= 4.0  # past 200 bytes, then 400...: the interval doubled each time


def test_the_gate_names_an_xid_ecc_errors_and_a_hardware_slowdown_but_not_power_capping_or_idle_clocks(
    tmp_path: Path,
) -> None:
    nodes = {
        "n2": {
            "xid": {"3": [79]},
            "gpu": {"1": {"ecc_uncorrected": 2}, "4": {"throttle": 0x8 | 0x40}, "5": {"throttle": 0x4 | 0x1}},
        }
    }
    said = telemetry.gpu_faults(telemetry.Nvml(fake_nvml(tmp_path, "n2", nodes)))
    assert said == [
        "GPU 1 has uncorrected ECC errors: 2",
        "GPU 3 reported an XID: 79 (`dmesg | grep -i xid` on the node)",
        "GPU 4 clocks held by a slowdown: hw_slowdown+hw_thermal",
    ]
    assert telemetry.gpu_faults(telemetry.Nvml(fake_nvml(tmp_path, "n1", nodes))) == []
    late = {"n3": {"xid": {"0": [48]}, "gpu": {"0": {"throttle": 8}}, "after_s": 30}}  # during the run, not at the gate
    assert telemetry.gpu_faults(telemetry.Nvml(fake_nvml(tmp_path, "n3", late))) == []


@pytest.mark.parametrize("n", [1, 16, 1000])
def test_the_node_whose_gpu_reported_an_xid_is_excluded_while_its_peers_show_none(n: int) -> None:
    nodes = [f"gpu{i:04d}" for i in range(n)]
    xid = "GPU 3 reported an XID: 79 (`dmesg | grep -i xid` on the node)"
    reports = {x: NodeReport((xid,) if x == nodes[-1] else (), 500.0, 300.0) for x in nodes}
    verdict = decide.gate_verdict(nodes, reports, GateThresholds())
    if n == 1:  # a lone node's own fault is still the same fault "on half the nodes": logged, the job trains
        assert verdict.blame == {} and "cluster or setting problem" in verdict.unattributed
    else:
        assert verdict.blame == {nodes[-1]: [xid]} and not verdict.unattributed
    half = {x: NodeReport((xid,) if i % 2 else (), 500.0, 300.0) for i, x in enumerate(nodes)}
    if n > 1:  # the same fault on half the allocation: a setting or the cluster, nobody excluded
        assert decide.gate_verdict(nodes, half, GateThresholds()).blame == {}


def test_the_findings_name_node_gpu_and_nic_and_rank_faults_first(tmp_path: Path) -> None:
    throttled = {"gpu": {"4": {"sm_mhz": 1410, "throttle": 0x8}}}
    df = pd.concat(
        [
            sampled(tmp_path / "a", "n1", {"n1": {"xid": {"2": [79]}}}),
            sampled(tmp_path / "b", "n2", {"n2": throttled}),
            sampled(tmp_path / "c", "n3", {}, bump=1_200_000),
        ]
    )
    found = readings.findings(df)
    assert [(f.kind, f.node, f.device) for f in found] == [
        ("xid", "n1", "2"),
        ("throttle", "n2", "4"),
        ("nic", "n3", "mlx5_0:1"),
    ]
    assert found[1].finding.startswith("n2 GPU 4 spent 100% of the run throttled by hw_slowdown at 1,410 MHz")
    assert found[2].finding == "n3's mlx5_0:1 counted 1.2M link errors during the run (1.2M since boot)"
    lines = readings.node_lines(df)
    assert lines[0].startswith("n1: 8 GPUs, SM 1,980-1,980 MHz, max 62 C, 650 W mean; GPU 2 reported XID 79")
    assert lines[1].startswith("n2: 8 GPUs, SM 1,410-1,980 MHz") and "GPU 4 spent 100%" in lines[1]
    assert "mlx5_0:1 counted 1.2M" in lines[2]
    evidence = check_telemetry(df)
    assert [e.kind for e in evidence] == ["gpu_xid", "gpu_throttle", "gpu_nic"]
    assert evidence[0].fault and "a fault" in str(evidence[0])
    assert evidence[1].cost == pytest.approx(1 - 1410 / 1980)  # the whole run at the throttled GPU's pace
    spans = df.groupby("node")["time"].agg(lambda t: t.max() - t.min())
    assert readings.energy_kwh(df) == pytest.approx(8 * 650 * spans.sum() / 3.6e6)  # 8 GPUs at 650 W a node
    summary = readings.gpu_summary(df)
    assert summary and summary["gpus"] == 24 and summary["mean_power_w"] == 650
    assert summary["mean_sm_mhz"] == pytest.approx((23 * 1980 + 1410) / 24, rel=0.01)
    fig = readings.plot_nodes(df)
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == ["n1\nSM MHz", "n2\nSM MHz", "n3\nSM MHz"]
    assert min(min(line.get_ydata()) for line in fig.axes[2].get_lines()) == 1410
    assert fig.axes[0].get_title(loc="left") == "GPU 2 reported XID 79"
    assert [round(line.get_xdata()[0], 4) for line in fig.axes[0].lines if line.get_color() == "red"] != []


def test_no_telemetry_is_no_finding_and_the_log_names_the_folder(tmp_path: Path) -> None:
    assert readings.findings(readings.read_telemetry(tmp_path)) == [] and check_telemetry(None) == []
    folder = files.telemetry_dir(tmp_path / "run", "12", 1)
    sampled_df = sampled(tmp_path, "n1", {})
    assert len(sampled_df)
    log = tmp_path / "job-12.out"
    log.write_text(f"cookbook: node telemetry every 10 s in {folder}\n")
    assert set(readings.telemetry_from_log(log)["node"]) == {"n1"}


def test_the_steps_join_what_the_gpus_did_at_each_by_time(tmp_path: Path) -> None:
    """`Job.metrics(gpus=True)` / `cookbook metrics --telemetry`: each step gets the newest sample at or before it."""
    df = sampled(tmp_path, "n2", {"n2": {"gpu": {"4": {"sm_mhz": 1410, "throttle": 8}}, "after_s": 0.25}})
    first, last = df["time"].min(), df["time"].max()
    local = (
        pd.to_datetime([first - 5, first + 0.05, last + 1], unit="s", utc=True)
        .tz_convert(readings._local_zone())
        .tz_localize(None)
    )
    steps = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4.0, 3.0, 2.0, 1.0], "time": [*local, pd.NaT]})
    joined = readings.join_telemetry(steps, df)
    assert list(joined["step"]) == [1, 2, 3, 4]  # the order and rows of the steps are kept
    assert pd.isna(joined["gpu_min_sm_mhz"][0]) and pd.isna(joined["gpu_min_sm_mhz"][3])  # before any sample; no time
    assert joined["gpu_min_sm_mhz"][1] == 1980 and joined["gpu_faults"][1] == ""
    assert joined["gpu_min_sm_mhz"][2] == 1410 and joined["gpu_faults"][2] == "n2:4"
    assert joined["gpu_power_w"][2] == 8 * 650 and joined["gpu_max_temp_c"][2] == 62
    assert readings.join_telemetry(steps, readings.read_telemetry(tmp_path / "none")) is steps
    # each node samples on its own clock: a step sees every node's newest sample, not the newest node's alone
    healthy = sampled(tmp_path / "later", "n3", {})
    both = pd.concat([df, healthy])
    after = pd.to_datetime([healthy["time"].max() + 1], unit="s", utc=True).tz_convert(readings._local_zone())
    late = readings.join_telemetry(pd.DataFrame({"step": [9], "time": after.tz_localize(None)}), both)
    assert late["gpu_min_sm_mhz"][0] == 1410 and late["gpu_faults"][0] == "n2:4" and late["gpu_power_w"][0] == 16 * 650


def test_the_notebook_monitor_shows_a_line_per_node_in_red_when_a_gpu_errs(tmp_path: Path) -> None:
    from cookbook.widgets.monitor import JobMonitor

    sampled(tmp_path / "a", "n1", {})
    sampled(tmp_path / "a", "n2", {"n2": {"xid": {"5": [79]}}})
    log = tmp_path / "job-7.out"
    log.write_text(f"cookbook: node telemetry every 10 s in {files.telemetry_dir(tmp_path / 'a' / 'run', '7', 0)}\n")
    monitor = JobMonitor(log=log)
    monitor.refresh()
    lines = monitor.nodes.value.split("</div>")[:-1]
    assert len(lines) == 2 and "n1: 8 GPUs" in lines[0] and "#333" in lines[0]
    assert "n2: 8 GPUs" in lines[1] and "GPU 5 reported XID 79" in lines[1] and "#c62828" in lines[1]


def test_a_straggler_is_named_with_what_its_gpu_did(tmp_path: Path) -> None:
    """The straggler report (explain, watch) says why the slow rank was slow when its node's telemetry saw it."""
    from cookbook.analysis.stragglers import Straggler, with_telemetry

    df = sampled(tmp_path, "n7", {"n7": {"gpu": {"4": {"sm_mhz": 1410, "throttle": 0x40}}}})
    slow, fine = Straggler(60, "n7", 40, 0.9, 0.0, 1.4, gpu=4), Straggler(57, "n7", 40, 0.9, 0.0, 1.4, gpu=1)
    named, unnamed = with_telemetry([slow, fine], df)
    assert str(named).startswith("rank 60 on n7 GPU 4 is slow in 90% of 40 steps: steps take x1.40 the median")
    assert str(named).endswith(
        "; n7 GPU 4 spent 100% of the run throttled by hw_thermal at 1,410 MHz (its peers 1,980)"
    )
    assert unnamed == fine and with_telemetry([slow], None) == [slow]
