"""Profiling: enable overrides, collect, summarize, memory timeline, view, CLI.

Real traces: tests/fixtures/traces/{torchtune,torchtitan} come from tiny 2-process CPU runs
(tests/fixtures/traces/regenerate.sh) with the run's own logs next to them. synthetic_gpu/ is SYNTHETIC
(hand-built, no GPU was available; make_synthetic_gpu.py documents every number).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from cookbook.cli import main as cli_main
from cookbook.profiling import intervals, memory
from cookbook.profiling.collect import collect, find_traces, trace_rank
from cookbook.profiling.enable import schedule
from cookbook.profiling.summarize import (
    is_comm,
    plot_summary,
    self_times,
    step_times,
    summarize,
    time_breakdown,
    top_kernels,
    top_operators,
)
from cookbook.profiling.trace import load_trace
from cookbook.profiling.view import free_port, ssh_tunnel_command, start_tensorboard, viewing_instructions
from cookbook.recipes import get_recipe
from cookbook.recipes.torchtitan import cli_args

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
TT = FIX / "torchtune"
TI = FIX / "torchtitan"
GPU = FIX / "synthetic_gpu"


@pytest.fixture(scope="module")
def tt_traces():
    return [load_trace(TT / f"rank{r}_iter5.pt.trace.json.gz") for r in (0, 1)]


@pytest.fixture(scope="module")
def ti_trace():
    return load_trace(TI / "rank0_iter5.pt.trace.json.gz")


@pytest.fixture(scope="module")
def gpu_traces():
    return [load_trace(GPU / f"rank{r}_iter10.pt.trace.json.gz") for r in (0, 1)]


# ---------------------------------------------------------------- enable


def test_schedule_counts_steps_like_the_logs():
    s = schedule(steps=3, warmup=1, start_step=3)
    assert (s.wait, s.warmup, s.active) == (1, 1, 3)
    assert (s.first_traced_step, s.last_traced_step, s.trace_iteration) == (3, 5, 5)
    with pytest.raises(ValueError):
        schedule(steps=0)


def test_torchtune_overrides_build_torchtunes_profiler(tmp_path):
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    tune = get_recipe("llama3_3_70b_lora")
    ovr = tune.profiling_overrides(device="cpu", steps=2, start_step=4)
    cfg = OmegaConf.merge(
        OmegaConf.create({"output_dir": str(tmp_path)}), OmegaConf.from_dotlist([f"{k}={v}" for k, v in ovr.items()])
    )
    prof, prof_cfg = tt_config.instantiate(cfg.profiler)
    assert prof_cfg["enabled"] is True and prof_cfg["cuda"] is False
    assert (prof_cfg["wait_steps"], prof_cfg["warmup_steps"], prof_cfg["active_steps"], prof_cfg["num_cycles"]) == (
        2,
        1,
        2,
        1,
    )
    assert prof_cfg["output_dir"] == f"{tmp_path}/profiling_outputs"
    assert tune.profiling_overrides(device="cuda")["profiler.cuda"] == "True"


def test_torchtitan_flags_parse_into_its_profiler_config():
    import tyro
    from torchtitan.tools.profiler import Profiler

    # the real Profiler.Config under the same section name as in torchtitan's Trainer.Config
    Wrap = dataclasses.make_dataclass(
        "Wrap", [("profiler", Profiler.Config, dataclasses.field(default_factory=Profiler.Config))]
    )

    titan = get_recipe("llama3_8b_c4")
    flags = cli_args(titan.profiling_overrides(device="cuda", steps=2, start_step=4, memory=True))
    cfg = tyro.cli(Wrap, args=flags).profiler
    assert cfg.enable_profiling and cfg.enable_memory_snapshot
    assert (cfg.profile_freq, cfg.profiler_warmup, cfg.profiler_active, cfg.profiler_repeat) == (5, 1, 2, 1)
    # torchtitan asserts profile_freq >= warmup + active
    assert cfg.profile_freq - (cfg.profiler_warmup + cfg.profiler_active) >= 0


def test_enable_rejects_bad_requests():
    with pytest.raises(KeyError, match="unknown recipe"):
        get_recipe("deepspeed")
    with pytest.raises(ValueError, match="CUDA"):
        get_recipe("llama3_8b_c4").profiling_overrides(device="cpu", memory=True)
    with pytest.raises(ValueError, match="no memory snapshots"):
        get_recipe("fsdp_llama3_2_1b").profiling_overrides(device="cuda", memory=True)


# ---------------------------------------------------------------- collect


def _torchtune_layout(tmp_path: Path) -> Path:
    """The traces as torchtune 0.6.1 leaves them: both ranks named r0-<date>.<ns>.pt.trace.json.gz."""
    it = tmp_path / "run" / "profiling_outputs" / "iteration_5"
    it.mkdir(parents=True)
    shutil.copy(TT / "rank1_iter5.pt.trace.json.gz", it / "r0-2026-11-22-22-19.1795385965174767040.pt.trace.json.gz")
    shutil.copy(TT / "rank0_iter5.pt.trace.json.gz", it / "r0-2026-11-22-22-19.1795385965207193914.pt.trace.json.gz")
    shutil.copy(TT / "rank0_key_averages.txt", it)
    return tmp_path / "run"


def test_torchtune_ranks_told_apart_by_content(tmp_path):
    run = _torchtune_layout(tmp_path)
    found = find_traces(run)
    assert [(t.iteration, t.rank, t.world_size, t.has_steps) for t in found] == [(5, 0, 2, True), (5, 1, 2, True)]
    assert found[0].path.name.endswith("207193914.pt.trace.json.gz")  # rank 0 is the second file by name
    out = collect(run, tmp_path / "view", ranks=[1])
    assert list(out["rank"]) == [1]
    dest = Path(out["dest"][0])
    assert dest.name == "rank1_iter5.pt.trace.json.gz"
    assert dest.read_bytes() == (TT / "rank1_iter5.pt.trace.json.gz").read_bytes()
    assert out["size_mb"][0] == pytest.approx(dest.stat().st_size / 1e6, abs=1e-3)


def test_rank_header_matches_full_json():
    for path in [*TT.glob("*.gz"), *TI.glob("*.gz"), *GPU.glob("*.gz")]:
        with gzip.open(path, "rt") as f:
            info = json.load(f)["distributedInfo"]
        assert trace_rank(path) == (info["rank"], info["world_size"])


def test_collect_picks_latest_iteration_and_skips_empty_traces(tmp_path):
    traces = tmp_path / "out" / "profiling" / "traces"
    for it in (5, 10):
        (traces / f"iteration_{it}").mkdir(parents=True)
        shutil.copy(TI / "rank0_iter5.pt.trace.json.gz", traces / f"iteration_{it}" / "rank0_trace.json.gz")
    # what torchtitan writes when a run ends in the profiler's wait phase: a trace without steps
    (traces / "iteration_12").mkdir()
    empty = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2}, "traceEvents": []}
    with gzip.open(traces / "iteration_12" / "rank0_trace.json.gz", "wt") as f:
        json.dump(empty, f)
    found = find_traces(tmp_path / "out")
    assert [(t.iteration, t.has_steps) for t in found] == [(5, True), (10, True), (12, False)]
    out = collect(tmp_path / "out", tmp_path / "view")
    assert [Path(d).name for d in out["dest"]] == ["rank0_iter10.pt.trace.json.gz"]
    with pytest.raises(FileNotFoundError, match="available"):
        collect(tmp_path / "out", tmp_path / "view2", ranks=[3])
    with pytest.raises(ValueError, match="no ProfilerStep"):
        summarize([traces / "iteration_12" / "rank0_trace.json.gz"])


# ---------------------------------------------------------------- numbers vs the runs' own logs


def test_torchtune_step_times_match_its_log(tt_traces):
    # every step holds 2 x 256 labelled tokens per rank (packed text, split across packs), and the
    # recipe logs tokens_per_second_per_gpu = all ranks' tokens / (step seconds * world size)
    tps = {
        int(m[1]): float(m[2])
        for m in re.finditer(r"Step (\d+) \|.*tokens_per_second_per_gpu:([\d.]+)", (TT / "metrics_log.txt").read_text())
    }
    st = step_times(tt_traces[0])
    assert list(st["training_step"]) == [3, 4, 5]
    for _, row in st.iterrows():
        logged_ms = 1e3 * 512 / tps[row["training_step"]]
        assert row["step_ms"] == pytest.approx(logged_ms, rel=0.01)  # measured: within 0.2 %


def test_torchtune_step_times_match_its_key_averages(tt_traces):
    table = (TT / "rank0_key_averages.txt").read_text()
    total = re.search(r"ProfilerStep\*(?:\s+\S+){3}\s+([\d.]+)(ms|s)\s", table)
    total_ms = float(total[1]) * (1e3 if total[2] == "s" else 1)
    assert step_times(tt_traces[0])["step_ms"].sum() == pytest.approx(total_ms, rel=0.005)


def test_torchtitan_step_times_match_its_log(ti_trace):
    log = (TI / "run.log").read_text()
    rank0 = [
        (m[1], int(m[2]), int(m[3].replace(",", "")))
        for m in re.finditer(r"\[default0\]:\[titan\] \S+ (\S+) - root - INFO - step:\s+(\d+)\s.*?tps: ([\d,]+)", log)
    ]
    stamp = {
        step: float(hms[:2]) * 3600 + float(hms[3:5]) * 60 + float(hms[6:].replace(",", ".")) for hms, step, _ in rank0
    }
    tps = {step: t for _, step, t in rank0}
    st = step_times(ti_trace)
    assert list(st["training_step"]) == [4, 5]
    for _, row in st.iterrows():
        step = row["training_step"]
        # tps = local_batch_size 2 * seq_len 512 / step seconds, printed rounded to an integer
        assert row["step_ms"] == pytest.approx(1e3 * 1024 / tps[step], rel=0.02)
        assert row["step_ms"] == pytest.approx(1e3 * (stamp[step] - stamp[step - 1]), rel=0.02)


# ---------------------------------------------------------------- operators, breakdown


def test_operator_names_and_self_times(tt_traces, ti_trace):
    for tr in (*tt_traces, ti_trace):
        top = top_operators(tr, n=10)
        assert "aten::mm" in set(top["name"])
        assert (top["self_ms"] <= top["total_ms"] + 1e-6).all()
        assert top["self_ms"].is_monotonic_decreasing
        assert top_kernels(tr).empty  # CPU run
    assert top_operators(tt_traces[0], n=3)["name"].iloc[0] == "aten::mm"


def test_self_times_add_up_to_busy_time(tt_traces):
    # on one thread, self times partition the time covered by its events
    tr = tt_traces[0]
    ev = self_times(tr)
    pid, tid = tr.main_thread
    main = ev[(ev["pid"] == pid) & (ev["tid"] == tid)]
    busy = intervals.total(main[["ts", "end"]].to_numpy())
    assert main["self"].sum() == pytest.approx(busy, rel=0.01)


def test_cpu_breakdown_on_real_gloo_traces(tt_traces, ti_trace):
    for tr in (*tt_traces, ti_trace):
        bd = time_breakdown(tr)
        shares = bd[["compute_share", "comm_share", "idle_share"]]
        assert np.allclose(shares.sum(axis=1), 1.0)
        assert (shares >= 0).all().all()
        assert (bd["compute_share"] > 0.3).all() and (bd["comm_share"] > 0).all()
    assert is_comm("gloo:all_gather") and is_comm("c10d::_allgather_base_") and is_comm("record_param_comms")
    assert not is_comm("aten::mm") and not is_comm("aten::broadcast_tensors")


def test_summary_of_real_ranks(tt_traces):
    s = summarize(tt_traces)
    assert list(s.per_rank["rank"]) == [0, 1]
    assert set(s.steps["training_step"]) == {3, 4, 5}
    means = s.per_rank.set_index("rank")["mean_step_ms"]
    assert s.slowest_rank == int(means.idxmax())
    text = s.render()
    assert "aten::mm" in text and f"Slowest rank: {s.slowest_rank}" in text and "CPU run" in text
    fig = plot_summary(s)
    assert isinstance(fig, Figure) and len(fig.axes) == 3


def test_gpu_breakdown_on_synthetic_trace(gpu_traces):
    bd0, bd1 = time_breakdown(gpu_traces[0]), time_breakdown(gpu_traces[1])
    assert list(bd0["training_step"]) == [9, 10]
    row0, row1 = bd0.iloc[0], bd1.iloc[0]
    assert (
        row0["step_ms"],
        row0["compute_ms"],
        row0["comm_ms"],
        row0["comm_overlapped_ms"],
        row0["idle_ms"],
    ) == pytest.approx((10.0, 5.5, 2.0, 2.0, 2.5))
    assert (
        row1["step_ms"],
        row1["compute_ms"],
        row1["comm_ms"],
        row1["comm_overlapped_ms"],
        row1["idle_ms"],
    ) == pytest.approx((12.0, 7.5, 0.0, 4.0, 4.5))
    s = summarize(gpu_traces)
    assert s.slowest_rank == 1 and s.straggler_rank == 1
    assert set(s.per_rank["device"]) == {"gpu"}
    assert s.top_kernels["name"].iloc[0].startswith("sm90_xmma_gemm")
    assert "ncclDevKernel_AllGather" in s.top_kernels["name"].iloc[1]
    assert "Top GPU kernels" in s.render()


def test_intervals():
    a = np.array([[0, 10], [5, 15], [20, 30]])
    assert intervals.union(a).tolist() == [[0, 15], [20, 30]]
    assert intervals.total(a) == 25
    assert intervals.subtract(a, [[2, 4], [12, 22]]).tolist() == [[0, 2], [4, 12], [22, 30]]
    assert intervals.clip(a, 8, 25).tolist() == [[8, 10], [8, 15], [20, 25]]
    assert intervals.total(intervals.EMPTY) == 0


# ---------------------------------------------------------------- memory


def _snapshot() -> dict:
    """SYNTHETIC snapshot in torch.cuda.memory._snapshot()'s layout (no GPU here to record one):
    1 MiB allocated before recording, then +4 MiB, +2 MiB, -4 MiB."""
    mib = 2**20
    trace = [
        {"action": "alloc", "addr": 1, "size": 4 * mib, "stream": 0, "time_us": 100, "frames": []},
        {"action": "alloc", "addr": 2, "size": 2 * mib, "stream": 0, "time_us": 200, "frames": []},
        {"action": "free_requested", "addr": 1, "size": 4 * mib, "stream": 0, "time_us": 300, "frames": []},
        {"action": "free_completed", "addr": 1, "size": 4 * mib, "stream": 0, "time_us": 310, "frames": []},
    ]
    blocks = [
        {"address": 0, "size": 1 * mib, "state": "active_allocated"},
        {"address": 2, "size": 2 * mib, "state": "active_allocated"},
        {"address": 3, "size": 17 * mib, "state": "inactive"},
    ]
    seg = {"device": 0, "address": 0, "total_size": 20 * mib, "stream": 0, "segment_type": "large", "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace]}


def test_memory_timeline_from_snapshot(tmp_path):
    path = tmp_path / "rank0_memory_snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    tl = memory.memory_timeline(memory.load_snapshot(path))
    assert (tl["allocated_bytes"] / 2**20).tolist() == [5, 7, 3]
    assert isinstance(memory.plot_memory_timeline(tl), Figure)
    # collect copies it next to the traces, and the summary plots it
    run = _torchtune_layout(tmp_path)
    shutil.copy(path, run / "profiling_outputs" / "iteration_5" / "rank0_memory_snapshot.pickle")
    out = collect(run, tmp_path / "view", ranks=[0])
    assert sorted(Path(d).name for d in out["dest"]) == [
        "rank0_iter5.memory_snapshot.pickle",
        "rank0_iter5.pt.trace.json.gz",
    ]
    assert cli_main(["profile", "summary", str(tmp_path / "view"), "--plot", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s_rank0_iter5.memory_snapshot.png").exists()
    bad = tmp_path / "x.pickle"
    bad.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ValueError, match="not a torch.cuda memory snapshot"):
        memory.load_snapshot(bad)


# ---------------------------------------------------------------- view


def test_tensorboard_starts_on_a_private_socket_and_stops(tmp_path):
    shutil.copy(GPU / "rank0_iter10.pt.trace.json.gz", tmp_path)
    with start_tensorboard(tmp_path) as tb:
        assert tb.port is None and tb.get("/", timeout=10)[0] == 200
        assert oct(tb.sock.parent.stat().st_mode & 0o777) == "0o700"
        assert tb.process.poll() is None
    assert tb.process.poll() is not None and not tb.private.exists()
    with pytest.raises(PermissionError, match="every user"):  # a TCP port only when said so
        start_tensorboard(tmp_path, port=free_port())
    with start_tensorboard(tmp_path, open_to_all_users=True) as tb:
        with urllib.request.urlopen(f"http://127.0.0.1:{tb.port}/", timeout=10) as r:
            assert r.status == 200
    assert ssh_tunnel_command(6007, login_node="login1", user="alice") == "ssh -N -L 6007:localhost:6007 alice@login1"
    text = viewing_instructions(tmp_path, port=6007, login_node="login1")
    assert "ssh -N -L 6007:localhost:6007 login1" in text and "https://ui.perfetto.dev" in text
    assert "rank0_iter10.pt.trace.json.gz" not in text or "Traces (1)" in text
    assert isinstance(free_port(), int)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_profile_view_stops_and_removes_its_folder_on_ctrl_c_or_term_even_where_sigint_was_ignored(tmp_path, stop):
    """Started from a shell that ignores SIGINT (`cmd &`, CI runners), Ctrl-C still stops the server and removes
    its private folder; so does TERM (a closed session). Before, such a Ctrl-C did nothing: TensorBoard and
    its socket folder outlived the command once the caller gave up and killed it."""
    shutil.copy(GPU / "rank0_iter10.pt.trace.json.gz", tmp_path)
    cli = subprocess.Popen(
        [sys.executable, "-m", "cookbook", "profile", "view", str(tmp_path), "--login-node", "login1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        for line in cli.stdout:  # type: ignore[union-attr]
            if m := re.search(r"ssh -N -L 6006:(\S+\.sock) login1", line):
                break
        folder = Path(m[1]).parent
        assert folder.is_dir()
        cli.send_signal(stop)
        assert cli.wait(30) in (0, 130), cli.returncode
        assert not folder.exists()
    finally:
        cli.kill()


# ---------------------------------------------------------------- CLI


def test_cli_collect_and_summary(tmp_path, capsys):
    run = _torchtune_layout(tmp_path)
    view = tmp_path / "view"
    assert cli_main(["profile", "collect", str(run), "--ranks", "0,1", "--out", str(view)]) == 0
    out = capsys.readouterr().out
    assert "Copied 2" in out and "rank1_iter5.pt.trace.json.gz" in out
    plot = tmp_path / "summary.png"
    assert cli_main(["profile", "summary", str(view), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "Slowest rank" in out and "aten::mm" in out and "No memory snapshot" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["profile", "view", str(view), "--no-tensorboard", "--login-node", "login1"]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out and (view / "summary.png").exists()


def test_cli_user_errors(tmp_path, capsys):
    assert cli_main(["profile", "collect", str(tmp_path / "missing")]) == 2
    assert cli_main(["profile", "summary", str(tmp_path)]) == 2
    assert "no profiler traces" in capsys.readouterr().err
