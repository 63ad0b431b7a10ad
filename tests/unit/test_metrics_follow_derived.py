"""LogFollower on a growing/replaced file, derived numbers (MFU, tokens, ETA), diagnosis, plots, CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.metrics import (
    LogFollower,
    add_derived,
    diagnose,
    diagnose_text,
    eta,
    hf_config_flops_per_token,
    parse_log,
    peak_tflops,
    plot_runs,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_follower_reads_growing_file_in_odd_pieces_like_parse_log(tmp_path):
    src = (LOGS / "torchtitan_debug_2rank.log").read_bytes()
    log = tmp_path / "job.out"
    log.write_bytes(b"")
    follower, seen = LogFollower(log), set()
    for i in range(0, len(src), 333):
        with open(log, "ab") as f:
            f.write(src[i : i + 333])
        new = follower.poll()
        seen |= set(zip(new["split"], new["step"])) if len(new) else set()
        assert follower.offset - len(follower._partial) <= log.stat().st_size
    assert seen == set(zip(follower.df["split"], follower.df["step"]))
    assert follower.df.equals(parse_log(log))
    assert len(follower.poll()) == 0  # nothing new: nothing returned


def test_follower_keeps_partial_tqdm_line_until_the_next_redraw(tmp_path):
    log = tmp_path / "tune.err"
    log.write_bytes(b"\r1|1|Loss: 2.5:   0%|  | 1/10 [00:01<00:09, 1.00s/it]")
    follower = LogFollower(log)
    assert len(follower.poll()) == 0  # no terminator yet: maybe half written
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
    os.replace(replacement, log)  # requeued job rewrote its log (new inode)
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
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": 512,
    }
    fpt = hf_config_flops_per_token(config, seq_len=256)
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 256 + 2 * 64
    # 6 x non-embedding parameters (the untied output projection counts) + 12 x layers x heads x head_dim x s
    assert fpt == 6 * (2 * per_layer + 64 + 512 * 64) + 12 * 2 * 4 * 16 * 256
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


@pytest.mark.parametrize(
    "name, kind",
    [
        ("slurm_timeout.out", "slurm_timeout"),
        ("torchtune_missing_checkpoint.log", "missing_checkpoint"),
        ("torchrun_rendezvous_fail.log", "rendezvous"),
        ("tune_download_offline.log", "hub_unreachable"),
    ],
)
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
        "*** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 DUE TO NODE FAILURE ***\n"
    )
    found = diagnose(log)
    assert [f.kind for f in found] == ["nccl_timeout", "cuda_oom", "gated_model", "slurm_preempted", "slurm_node_fail"]
    assert found[1].line_number == 2 and "batch size" in found[1].hint


_GAI_TRACEBACK = """Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/utils.py", line 130, in \
_matches_machine_hostname
    addr_list = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP, flags=socket.AI_CANONNAME)
  File "/usr/lib/python3.11/socket.py", line 962, in getaddrinfo
    for res in _socket.getaddrinfo(host, port, family, type, proto, flags):
               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
socket.gaierror: [Errno -2] Name or service not known
"""


@pytest.mark.parametrize(
    "text, kind",
    [
        (
            "[rank2]: RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
            "some other API call, so the stacktrace below might be incorrect.\n",
            "cuda_oom",
        ),
        ("srun: error: Node failure on n3\n", "slurm_node_fail"),
        (
            "[rank0]:[E1122 10:00:00.100000000 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
            "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
            "collectives.\n",
            "nccl_timeout",
        ),
        (_GAI_TRACEBACK, "rendezvous"),
        (
            _GAI_TRACEBACK.replace(
                "[Errno -2] Name or service not known", "[Errno -3] Temporary failure in name resolution"
            ),
            "rendezvous",
        ),
        (
            "JobId=12 JobName=train\n   UserId=me(1000) GroupId=me(1000) MCS_label=N/A\n"
            "   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)\n",
            "slurm_timeout",
        ),
        ("   JobState=PREEMPTED Reason=None Dependency=(null)\n", "slurm_preempted"),
        ("   JobState=CANCELLED Reason=None Dependency=(null)\n", "slurm_cancelled"),
        (
            "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode \n"
            "------------ ---------- ---------- ---------- ---------- ---------- -------- \n"
            "12                train        gpu       acct         16    TIMEOUT      0:0 \n",
            "slurm_timeout",
        ),
        ("12                train        gpu       acct         16 CANCELLED+      0:0 \n", "slurm_cancelled"),
        ("12.batch          batch                  acct         16  CANCELLED     0:15 \n", "slurm_cancelled"),
        ("12|train|gpu|acct|16|PREEMPTED|0:0|\n", "slurm_preempted"),
        (
            "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: "
            "https://huggingface.co/api/models/meta-llama/Llama-3.1-8B/revision/main\n",
            "gated_model",
        ),
        (
            "httpx.HTTPStatusError: Client error '401 Unauthorized' for url "
            "'https://huggingface.co/api/models/meta-llama/Llama-3.1-8B/revision/main'\n",
            "gated_model",
        ),
        ("FileNotFoundError: Tokenizer path 'assets/hf/Llama-3.1-8B' does not exist\n", "missing_tokenizer"),
        (
            'OSError: Not found: "/fsx/models/llama2/tokenizer.model": No such file or directory Error #2\n',
            "missing_tokenizer",
        ),
        (
            "OSError: Can't load tokenizer for 'meta-llama/Llama-3.1-8B'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "missing_tokenizer",
        ),
        ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 ***\n", "slurm_cancelled"),
    ],
)
def test_diagnose_names_more_failures(text, kind):
    assert [f.kind for f in diagnose_text(text)] == [kind]


def test_diagnose_name_resolution_outside_a_rendezvous_is_no_rendezvous_failure():
    text = _GAI_TRACEBACK.replace("torch/distributed/elastic/rendezvous/utils.py", "wandb/sdk/lib/retry.py")
    assert diagnose_text(text) == []
    assert diagnose_text("0: step 12 ... PREEMPTED by nothing\nloss TIMEOUT 12\n") == []


def test_plot_overlays_runs_and_writes_png(tmp_path):
    fig = plot_runs({"log": LOGS / "torchtitan_debug_2rank.log", "tb": LOGS / "torchtitan_tb"}, out=tmp_path / "p.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["loss", "throughput", "memory", "mfu"]
    assert len(fig.axes[0].get_lines()) == 6  # per run: raw, smoothed, validation
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_leaves_out_mfu_a_framework_could_not_compute():
    from cookbook.metrics import parse_text

    # torchtitan on CPU prints "mfu: 0.00%" (no peak FLOPs known): not a real 0, so no MFU panel
    df = parse_text(
        "".join(
            f"[titan] 2026-11-22 12:15:5{s},593 - root - INFO - step: {s}  loss: {8 - s / 4}  "
            f"memory:  0.69GiB(2.91%)  tps: 108  tflops: 0.00  mfu: 0.00%\n"
            for s in range(1, 5)
        )
    )
    fig = plot_runs(df)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["loss", "throughput", "memory"]
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())


def test_cli_metrics_csv_and_plot(tmp_path, capsys):
    rc = main(
        [
            "metrics",
            str(LOGS / "seed_fsdp_llama3_8b.log"),
            "--csv",
            str(tmp_path / "m.csv"),
            "--plot",
            str(tmp_path / "m.png"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "14.346" in out and "6 rows (fsdp)" in out
    assert (tmp_path / "m.csv").read_text().splitlines()[1].startswith("0,train,11.61653")
    assert main(["metrics", str(tmp_path / "missing.log")]) == 2


def test_cli_metrics_derives_flux_mfu_from_the_planner(tmp_path, capsys):
    """FLUX logs pixels as tokens and prints tflops/mfu 0.00: --gpu/--model fill them from the planner."""
    import pandas as pd

    from cookbook.planner.estimate import Settings, flops_per_sample
    from cookbook.planner.models import get_model

    csv = tmp_path / "flux.csv"
    rc = main(
        [
            "metrics",
            str(LOGS / "seed_torchtitan_flux.log"),
            "--gpu",
            "h100",
            "--model",
            "flux_schnell",
            "--csv",
            str(csv),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "derived: flux_schnell" in out and "mfu_pct" in out and "tokens_seen" in out
    df = pd.read_csv(csv)
    images_per_s = df["tokens_per_second_per_gpu"] / (3 * 256 * 256)  # 1,541,366 pixel values/s: 7.84 images/s
    tflops = images_per_s * flops_per_sample(get_model("flux_schnell"), Settings(image_size=256)) / 1e12
    assert df["tflops"].tolist() == pytest.approx(tflops.tolist())
    assert df["mfu_pct"].tolist() == pytest.approx((100 * tflops / 989.0).tolist())
    assert (df["mfu_pct"] > 15).all() and (df["mfu_pct"] < 35).all()  # the planner's calibration: ~24%
    assert df["tokens_seen"].is_monotonic_increasing and df["tokens_seen"].iloc[-1] > 0


def test_cli_metrics_derived_options(capsys):
    from cookbook.planner.estimate import planner_flops

    rc = main(["metrics", str(LOGS / "torchtune_disklogger.txt"), "--gpu", "a100", "--flops-per-token", "2e9"])
    out = capsys.readouterr().out
    assert rc == 0 and "mfu_pct" in out
    rc = main(
        [
            "metrics",
            str(LOGS / "seed_fsdp_llama3_8b.log"),
            "--gpu",
            "h100",
            "--model",
            "llama3_1_8b",
            "--seq-len",
            "8192",
            "--gpus",
            "32",
            "--tail",
            "1",
        ]
    )
    out = capsys.readouterr().out
    per_sample = planner_flops("llama3_1_8b", seq_len=8192)[1]
    mfu = 100 * 8.98 * per_sample / 32 / 1e12 / 989.0
    assert rc == 0 and f"{mfu:.6g}" in out
    assert main(["metrics", str(LOGS / "seed_torchtitan_flux.log"), "--gpu", "t4", "--model", "flux_schnell"]) == 2
    assert main(["metrics", str(LOGS / "seed_torchtitan_flux.log"), "--gpu", "h100", "--model", "gpt5"]) == 2
    assert "unknown model 'gpt5'" in capsys.readouterr().err


def test_benchmark_smoke(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "metrics_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "metrics_bench.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(
        [
            "--size-mb",
            "1",
            "--tqdm-updates",
            "3000",
            "--shapes",
            "dense,tqdm",
            "--poll-steps",
            "100",
            "--no-cli",
            "--dir",
            str(tmp_path / "not" / "yet"),
        ]
    )
    for shape in result["shapes"].values():  # parse_log found every step the generator wrote
        assert shape["parse"]["steps"] == shape["steps"] > 100 and shape["plain"]["rows"] >= shape["steps"]
    assert result["poll_s"][100] > 0
