"""LogFollower on a growing/replaced file, derived numbers (MFU, tokens, ETA), diagnosis, plots, CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.metrics import (LogFollower, add_derived, diagnose, eta, hf_config_flops_per_token, parse_log,
                              peak_tflops, plot_runs, transformer_flops_per_token)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_follower_reads_growing_file_in_odd_pieces_like_parse_log(tmp_path):
    src = (LOGS / "torchtitan_debug_2rank.log").read_bytes()
    log = tmp_path / "job.out"
    log.write_bytes(b"")
    follower, seen = LogFollower(log), set()
    for i in range(0, len(src), 333):
        with open(log, "ab") as f:
            f.write(src[i:i + 333])
        new = follower.poll()
        seen |= set(zip(new["split"], new["step"])) if len(new) else set()
        assert follower.offset - len(follower._partial) <= log.stat().st_size
    assert seen == set(zip(follower.df["split"], follower.df["step"]))
    assert follower.df.equals(parse_log(log))
    assert len(follower.poll()) == 0          # nothing new: nothing returned


def test_follower_keeps_partial_tqdm_line_until_the_next_redraw(tmp_path):
    log = tmp_path / "tune.err"
    log.write_bytes(b"\r1|1|Loss: 2.5:   0%|  | 1/10 [00:01<00:09, 1.00s/it]")
    follower = LogFollower(log)
    assert len(follower.poll()) == 0          # no terminator yet: maybe half written
    with open(log, "ab") as f:
        f.write(b"\r1|2|Loss: 2.25:  20%|  | 2/10 [00:02<00:08, 1.00s/it]")
    new = follower.poll()
    assert new["step"].tolist() == [1] and new["loss"].tolist() == [2.5]


def test_follower_starts_over_when_the_file_is_replaced(tmp_path):
    log = tmp_path / "job.out"
    log.write_text("Step 1 | loss:3.0 lr:0.1 \nStep 2 | loss:2.0 lr:0.1 \n")
    follower = LogFollower(log)
    assert follower.poll()["step"].tolist() == [1, 2]
    replacement = tmp_path / "new.out"
    replacement.write_text("Step 1 | loss:9.0 lr:0.1 \n")
    os.replace(replacement, log)             # requeued job rewrote its log (new inode)
    assert follower.poll()["loss"].tolist() == [9.0]
    assert follower.resets == 1 and follower.df["step"].tolist() == [1]


def test_peak_table_and_mfu_reproduce_torchtitans_printed_numbers():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("a100") == 312.0 and peak_tflops("GB200") == 2500.0
    with pytest.raises(KeyError):
        peak_tflops("T4")
    # seed B200 row: tflops 1,010.08 and mfu 44.89% -> our MFU from tflops agrees
    df = parse_log(LOGS / "seed_torchtitan_table.md").query("step == 10").copy()
    df["mfu_pct"] = 0.0
    assert add_derived(df, gpu="B200")["mfu_pct"].iloc[0] == pytest.approx(44.89, abs=0.01)


def test_derived_mfu_where_torchtune_prints_none():
    disk = parse_log(LOGS / "torchtune_disklogger.txt")
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 256, "vocab_size": 512}
    fpt = hf_config_flops_per_token(config, seq_len=256)
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 256 + 2 * 64
    assert fpt == transformer_flops_per_token(2 * per_layer + 64 + 512 * 64, 2, 4, 16, 256)
    out = add_derived(disk, flops_per_token=fpt, gpu="H100", tokens_per_step=4 * 256)
    assert out["tflops"].iloc[0] == pytest.approx(fpt * 6808.6650390625 / 1e12)
    assert out["mfu_pct"].iloc[0] == pytest.approx(100 * out["tflops"].iloc[0] / 989.0)
    assert out["tokens_seen"].tolist() == [1024.0 * s for s in range(1, 17)]


def test_eta_from_tqdm_and_from_timestamps():
    tqdm = parse_log(LOGS / "seed_torchtune_tqdm.log")
    assert eta(tqdm).total_seconds() == pytest.approx((1367 - 2) * 131.58)
    flux = parse_log(LOGS / "seed_torchtitan_flux.log")  # steps 700 -> 8300 took 61,612.17 s
    assert eta(flux, total_steps=8400).total_seconds() == pytest.approx(100 * 61612.17 / 7600)
    assert eta(flux) is None


@pytest.mark.parametrize("name, kind", [
    ("slurm_timeout.out", "slurm_timeout"),
    ("torchtune_missing_checkpoint.log", "missing_checkpoint"),
    ("torchrun_rendezvous_fail.log", "rendezvous"),
    ("tune_download_offline.log", "hub_unreachable"),
])
def test_diagnose_real_failures(name, kind):
    kinds = [f.kind for f in diagnose(LOGS / name)]
    assert kinds[0] == kind


def test_diagnose_clean_runs_find_nothing():
    for name in ("torchtitan_debug_2rank.log", "torchtune_tqdm.log", "seed_fsdp_llama3_8b.log"):
        assert diagnose(LOGS / name) == []


def test_diagnose_known_messages(tmp_path):
    log = tmp_path / "x.out"
    log.write_text(
        "[rank3]:[E1122 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access gated repo\n"
        "*** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 DUE TO PREEMPTION ***\n"
        "*** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 DUE TO NODE FAILURE ***\n")
    found = diagnose(log)
    assert [f.kind for f in found] == ["nccl_timeout", "cuda_oom", "gated_model", "slurm_preempted",
                                       "slurm_node_fail"]
    assert found[1].line_number == 2 and "batch size" in found[1].hint


def test_plot_overlays_runs_and_writes_png(tmp_path):
    fig = plot_runs({"log": LOGS / "torchtitan_debug_2rank.log", "tb": LOGS / "torchtitan_tb"},
                    out=tmp_path / "p.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["loss", "throughput", "memory", "mfu"]
    assert len(fig.axes[0].get_lines()) == 6  # per run: raw, smoothed, validation
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_leaves_out_mfu_a_framework_could_not_compute():
    from cookbook.metrics import parse_text

    # torchtitan on CPU prints "mfu: 0.00%" (no peak FLOPs known): not a real 0, so no MFU panel
    df = parse_text("".join(f"[titan] 2026-11-22 12:15:5{s},593 - root - INFO - step: {s}  loss: {8 - s / 4}  "
                            f"memory:  0.69GiB(2.91%)  tps: 108  tflops: 0.00  mfu: 0.00%\n" for s in range(1, 5)))
    fig = plot_runs(df)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["loss", "throughput", "memory"]
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())


def test_cli_metrics_csv_and_plot(tmp_path, capsys):
    rc = main(["metrics", str(LOGS / "seed_fsdp_llama3_8b.log"), "--csv", str(tmp_path / "m.csv"),
               "--plot", str(tmp_path / "m.png")])
    out = capsys.readouterr().out
    assert rc == 0 and "14.346" in out and "6 rows (fsdp)" in out
    assert (tmp_path / "m.csv").read_text().splitlines()[1].startswith("0,train,11.61653")
    assert main(["metrics", str(tmp_path / "missing.log")]) == 2


def test_benchmark_smoke(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "metrics_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "metrics_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--size-mb", "2", "--repeat", "1", "--dir", str(tmp_path)])
    assert result["steps"] > 100 and result["parse_speed_vs_grep"] > 0
