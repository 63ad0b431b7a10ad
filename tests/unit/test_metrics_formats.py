"""parse_log on the exact log lines users see (seeds) and on logs of real CPU runs (fixtures)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cookbook.metrics import parse_log, parse_text

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_seed_torchtune_tqdm_keeps_each_steps_own_line():
    df = parse_log(LOGS / "seed_torchtune_tqdm.log")
    assert df["step"].tolist() == [1, 2]
    assert df["loss"].tolist() == [1.849762201309204, 1.2548030614852905]
    assert df["epoch"].tolist() == [1, 1]
    assert df["total_steps"].tolist() == [1367, 1367]
    # step 1's own line: 1/1367 [04:24<100:30:01, 264.86s/it]
    assert df["elapsed_s"].tolist() == [264.0, 303.0]
    assert df["seconds_per_step"].tolist() == [264.86, 131.58]
    assert df.loc[0, "remaining_s"] == 100 * 3600 + 30 * 60 + 1
    assert df.attrs["skipped"] == []


def test_seed_torchtitan_flux_thousands_separators_and_zero_mfu():
    df = parse_log(LOGS / "seed_torchtitan_flux.log")
    assert df["step"].tolist() == [700, 8200, 8300]
    assert df["loss"].tolist() == [0.7052, 0.5149, 0.5146]
    assert df["tokens_per_second_per_gpu"].tolist() == [1541366, 1567390, 1555416]
    assert df["memory_gib"].tolist() == [76.79, 76.90, 76.82]
    assert df["memory_pct"].tolist() == [96.97, 97.11, 97.01]
    assert df["tflops"].tolist() == [0, 0, 0] and df["mfu_pct"].tolist() == [0, 0, 0]
    assert "grad_norm" not in df  # older line without grad_norm
    assert df.loc[0, "time"] == pd.Timestamp("2025-06-10 21:58:27.008")


@pytest.mark.parametrize(
    "name, steps, loss, speed, lr, last_time",
    [
        (
            "seed_fsdp_mixtral_8x7b.log",
            [0, 1, 2, 3, 4, 5],
            [11.21702, 11.20650, 11.12571, 10.97558, 10.82548, 10.31511],
            [6.19, 14.51, 15.06, 14.70, 14.48, 14.50],
            [0.000006, 0.000013, 0.000019, 0.000025, 0.000031, 0.000038],
            "2025-04-11 16:59:24",
        ),
        (
            "seed_fsdp_mathstral_7b.log",
            [0, 1, 2, 3, 4, 5],
            [11.21489, 11.20829, 11.15640, 10.90571, 10.60309, 10.02562],
            [2.61, 15.37, 14.87, 15.45, 15.35, 16.59],
            [0.000006, 0.000013, 0.000019, 0.000025, 0.000031, 0.000038],
            "2025-04-07 22:06:25",
        ),
    ],
)
def test_seed_fsdp_mixtral_and_mathstral(name, steps, loss, speed, lr, last_time):
    df = parse_log(LOGS / name)
    assert df["step"].tolist() == steps
    assert df["loss"].tolist() == loss
    assert df["samples_per_second"].tolist() == speed
    assert df["lr"].tolist() == lr
    assert df["rank"].tolist() == [0] * 6 and df.attrs["formats"] == ["fsdp"]
    assert df["time"].iloc[-1] == pd.Timestamp(last_time)
    assert df.attrs["skipped"] == []


@pytest.mark.parametrize(
    "index, expected",
    [
        (
            0,
            dict(
                step=100,
                loss=6.4277,
                grad_norm=2.9062,
                memory_gib=158.61,
                memory_pct=86.20,
                tokens_per_second_per_gpu=17581,
                tflops=1018.20,
                mfu_pct=45.25,
            ),
        ),
        (1, dict(step=100, loss=8.2954, grad_norm=29.3788, tokens_per_second_per_gpu=17975, tflops=1040.99)),
        (
            3,
            dict(
                step=10,
                loss=9.9256,
                grad_norm=9.2181,
                memory_gib=161.51,
                tokens_per_second_per_gpu=17441,
                tflops=1010.08,
                mfu_pct=44.89,
            ),
        ),
    ],
)
def test_seed_torchtitan_table_rows(index, expected):
    line = (LOGS / "seed_torchtitan_table.md").read_text().splitlines()[index]
    df = parse_text(line)
    assert len(df) == 1
    for key, value in expected.items():
        assert df.loc[0, key] == pytest.approx(value), key


def test_seed_fsdp_srun_prefix_and_nccl_noise():
    df = parse_log(LOGS / "seed_fsdp_llama3_8b.log")
    assert df["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert df["loss"].tolist() == [11.61653, 11.64398, 10.58705, 15.01381, 11.78982, 14.34635]
    assert df["samples_per_second"].tolist() == [4.88, 10.90, 11.09, 10.61, 10.18, 8.98]
    assert df["lr"].tolist() == [0.0001] * 4 + [0.000099] * 2
    assert df["rank"].tolist() == [0] * 6
    assert df.loc[5, "time"] == pd.Timestamp("2025-06-17 16:25:08")
    assert df.attrs["skipped"] == []


@pytest.mark.parametrize(
    "typo",
    [
        "0: 2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: 11.6l653, Speed: 4.88 samples/sec, lr: 0.000100",
        "[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7O52  memory: 76.79GiB(96.97%)  "
        "tps: 1,541,366  tflops: 0.00  mfu: 0.00%",
        "1|2|Loss: 1.2548030614852905:   0%|          | 2/1367 [05:03<49:53:19 131.58s/it]",
        "Step 3 | loss:5.89x lr:0.001 tokens_per_second_per_gpu:11644.7",
        # a comma is a thousands separator or a typo, never a decimal point or noise to drop
        "[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss: 0,7052  memory: 76.79GiB(96.97%)  "
        "tps: 1,541,366  tflops: 0.00  mfu: 0.00%",
        "[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss: 0.7052  grad_norm: 2.9  "
        "memory: 76.79GiB(96.97%)  tps: 1,541,366  tflops: 0.00  mfu: 0.00%".replace("0.7052", "0,7052"),
        "[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7052  memory: 76.79GiB(96.97%)  "
        "tps: 1,,541,366  tflops: 0.00  mfu: 0.00%",
        "[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 700  loss:  0.7052  memory: 76.79GiB(96.97%)  "
        "tps: 15,41,366  tflops: 0.00  mfu: 0.00%",
        "0: 2025-06-17 16:24:52 I [train.py:103] Batch 0 Loss: 11,61653, Speed: 4.88 samples/sec, lr: 0.000100",
        "1|2|Loss: 1,2548030614852905:   0%|          | 2/1367 [05:03<49:53:19, 131.58s/it]",
        "Step 3 | loss:5,89 lr:0.001 tokens_per_second_per_gpu:11644.7",
    ],
)
def test_seed_line_with_a_typo_is_skipped_not_misread(typo):
    good = "0: 2025-06-17 16:24:55 I [train.py:103] Batch 1 Loss: 11.64398, Speed: 10.90 samples/sec, lr: 0.000100"
    df = parse_text("NCCL INFO noise\n" + typo + "\n" + good + "\n")
    assert df["step"].tolist() == [1]
    assert df.attrs["skipped"] == [(2, typo.strip())]


_TITAN_LINE = (
    "[titan] 2025-06-10 21:58:2{s},008 - root - INFO - step: {s}  loss:  0.7052  grad_norm: 2.9  "
    "memory: 76.79GiB(96.97%)  tps: 1,541,366  tflops: 0.00  mfu: 0.00%"
)
_HUGE = "9" * 23


@pytest.mark.parametrize(
    "bad",
    [
        "1|2|Loss: 1.25:   0%|          | 2/1367 [05::03<49:53:19, 131.58s/it]",
        "1|2|Loss: 1.25:   0%|          | 2/1367 [05:03<49:53:19, 131..58s/it]",
        "1|2|Loss: 1.25:   0%|          | 2/1367 [05:03<49:53:19, .s/it]",
        _TITAN_LINE.format(s=2).replace("step: 2", f"step: {_HUGE}"),  # fast path
        _TITAN_LINE.format(s=2).replace("step: 2", f"step: {_HUGE}").replace("grad_norm: 2.9  ", ""),  # bulk
        _TITAN_LINE.format(s=2).replace("step: 2", "step: 1234567890123456"),  # 16 digits
        f"{_HUGE}: " + _TITAN_LINE.format(s=2),  # srun rank
        f"0: 2025-06-17 16:24:52 I [train.py:103] Batch {_HUGE} Loss: 11.61653, Speed: 4.88 samples/sec, lr: 0.000100",
        f"1|{_HUGE}|Loss: 1.25:   0%|          | 2/1367 [05:03<49:53:19, 131.58s/it]",
        f"1|2|Loss: 1.25:   0%|          | {_HUGE}/1367 [05:03<49:53:19, 131.58s/it]",
        f"Step {_HUGE} | loss:6.22 lr:0.001",
        f'{{"step": {_HUGE}, "loss": 1.0}}',
        f'{{"step": 2, "loss": 1{"0" * 400}}}',  # beyond float64
    ],
)
def test_malformed_line_is_skipped_never_fatal(bad):
    df = parse_text(_TITAN_LINE.format(s=1) + "\n" + bad + "\n" + _TITAN_LINE.format(s=3) + "\n")
    assert df["step"].tolist() == [1, 3]
    assert df.attrs["skipped"] == [(2, bad.strip()[:300])]


@pytest.mark.parametrize(
    "line",
    [
        _TITAN_LINE,  # fast path
        _TITAN_LINE.replace("grad_norm: 2.9  ", ""),  # bulk regex
        _TITAN_LINE.replace("INFO", "WARNING"),  # per-line parser
        "0: 2025-06-1{s} 16:24:52 I [train.py:103] Batch {s} Loss: 11.61653, Speed: 4.88 samples/sec, lr: 0.000100",
    ],
)
def test_a_timestamp_that_is_no_date_gives_a_row_with_no_time(line):
    """``2025-06-37``/``25:00:00`` (a garbled or hand-edited log): the row is kept, its time is NaT."""
    lines = [line.format(s=s) for s in (1, 2, 3)]
    lines[1] = lines[1].replace("2025-06-12", "2025-06-37").replace("2025-06-10 21:58:22", "2025-06-37 21:58:22")
    lines.append(line.format(s=4).replace(":2", ":9").replace("16:24", "25:24"))
    df = parse_text("\n".join(lines) + "\n")
    assert df["step"].tolist() == [1, 2, 3, 4] and df.attrs["skipped"] == []
    assert df["time"].isna().tolist() == [False, True, False, True]
    assert df["loss"].notna().all()


def test_real_torchtitan_two_ranks_ansi_and_validation():
    df = parse_log(LOGS / "torchtitan_debug_2rank.log")
    assert df.attrs["ranks"] == [0, 1] and df.attrs["skipped"] == []
    train, val = df[df["split"] == "train"], df[df["split"] == "validation"]
    assert train["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert train["loss"].tolist() == [7.98863, 7.74540, 7.13840, 6.18503, 5.42659, 5.06574]
    assert train["grad_norm"].iloc[0] == 1.4093
    assert (train["rank"] == 0).all()
    assert train["memory_gib"].iloc[0] == 0.70 and train["memory_pct"].iloc[0] == 2.97  # rank 0's values
    assert val["step"].tolist() == [1, 3, 6]
    assert val["loss"].tolist() == [7.7111, 6.1221, 4.7843]
    everything = parse_log(LOGS / "torchtitan_debug_2rank.log", ranks="all")
    assert len(everything) == 18
    rank1 = everything[(everything["rank"] == 1) & (everything["split"] == "train")]
    assert rank1["memory_gib"].iloc[0] == 0.68


def test_real_torchtitan_tensorboard_matches_its_log():
    tb = parse_log(LOGS / "torchtitan_tb")
    log = parse_log(LOGS / "torchtitan_debug_2rank.log")
    assert tb["step"].tolist() == log["step"].tolist()
    assert tb["split"].tolist() == log["split"].tolist()
    assert (tb["loss"] - log["loss"]).abs().max() < 1e-4  # the log prints 4-5 decimals
    assert tb["lr"].iloc[0] == pytest.approx(0.0004)
    assert 0 < tb["mfu_pct"].iloc[0] < 0.01  # the log rounds it to 0.00%


def test_real_torchtune_tqdm_disklogger_and_tensorboard_agree():
    tqdm = parse_log(LOGS / "torchtune_tqdm.log")
    disk = parse_log(LOGS / "torchtune_disklogger.txt")
    tb = parse_log(LOGS / "torchtune_tb")
    assert tqdm["step"].tolist() == disk["step"].tolist() == list(range(1, 17))
    assert tqdm["loss"].tolist() == disk["loss"].tolist()
    assert disk.loc[0, "loss"] == 6.229515552520752 and disk.loc[0, "lr"] == 0.001
    assert disk.loc[0, "tokens_per_second_per_gpu"] == 6808.6650390625
    assert tb["step"].tolist() == list(range(1, 17))
    assert (tb["loss"] - disk["loss"]).abs().max() < 1e-6
    assert tqdm.attrs["skipped"] == [] and tqdm["total_steps"].iloc[-1] == 16


def test_noise_tracebacks_and_binary_bytes_are_never_fatal():
    blob = (
        b"\xff\xfe\x00garbage NCCL INFO Channel 00/0 : 0[0] -> 1[1]\n"
        b'Traceback (most recent call last):\n  File "loss.py", line 3, in <module>\n'
        b"RuntimeError: loss exploded\n"
        b"[rank0]:[titan] 2025-06-10 21:58:27,008 - root - INFO - step: 7  loss:  nan  memory: 1.00GiB(1.00%)"
        b"  tps: 10  tflops: 0.00  mfu: N/A\n\x80\x81"
    )
    df = parse_text(blob)
    assert df["step"].tolist() == [7]
    assert df["loss"].isna().all()  # a NaN loss is shown as NaN, not dropped
    assert "mfu_pct" not in df  # mfu: N/A is no number
    assert df["rank"].tolist() == [0]


def test_jsonl_and_a_step_logged_again_keep_the_first_line():
    """A step logged twice (a resumed run, a redraw) keeps its first line, never the last."""
    text = (
        '{"step": 1, "loss": 2.5, "lr": 0.1}\n{"step": 2, "loss": 2.0}\n'
        "Step 2 | loss:1.5 lr:0.05 \n"
    )  # resumed: step 2 logged again
    df = parse_text(text)
    assert df["step"].tolist() == [1, 2]
    assert df["loss"].tolist() == [2.5, 2.0]


def test_empty_file(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    df = parse_log(tmp_path / "empty.log")
    assert df.empty and df.attrs["skipped"] == []


def _titan_log(steps: int, prefix: str = "[rank{r}]:", typo_at: int | None = None, typo: str = "0.7O52") -> bytes:
    lines = []
    for s in range(1, steps + 1):
        lines.append(f"0: host:1:1 [0] NCCL INFO Channel {s:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read")
        for r in (1, 0):  # rank 1 first: rank 0's row must still win
            loss = "nan" if s == 3 else (typo if s == typo_at and r == 0 else f"{10 / s:.5f}")
            lines.append(
                prefix.format(r=r) + f"[titan] 2025-06-10 21:58:{s % 60:02d},{s:03d} - root - INFO - "
                f"\x1b[31mstep: {s:2}  \x1b[32mloss: {loss}  \x1b[38;2;180;60;0mgrad_norm: {1.5 + r:7.4f}  "
                f"\x1b[38;2;54;234;195mmemory: {70 + r:.2f}GiB(96.97%)  \x1b[34mtps: {1_500_000 + s:,}  "
                f"\x1b[36mtflops: 412.50  \x1b[35mmfu: {'N/A' if s == 2 else '41.71%'}\x1b[39m"
            )
        if s % 4 == 0:
            lines.append(
                prefix.format(r=0) + f"[titan] 2025-06-10 21:59:00,000 - root - INFO - \x1b[33mvalidate "
                f"step: {s:2}  \x1b[32mloss: {s / 10:.4f}  \x1b[38;2;54;234;195mmemory:  0.68GiB(2.89%)  "
                f"\x1b[34mtps: 468\x1b[39m"
            )
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("prefix", ["[rank{r}]:", "{r}: [default{r}]:", "{r}: ", ""])
def test_big_torchtitan_log_with_each_prefix(tmp_path, prefix):
    log = tmp_path / "titan.log"
    log.write_bytes(_titan_log(12, prefix))
    df = parse_log(log)
    train = df[df["split"] == "train"]
    assert train["step"].tolist() == list(range(1, 13))
    assert train["loss"].iloc[0] == 10.0 and np.isnan(train["loss"].iloc[2])
    assert np.isnan(train["mfu_pct"].iloc[1]) and train["mfu_pct"].iloc[0] == 41.71
    assert train["tokens_per_second_per_gpu"].iloc[0] == 1_500_001
    assert df[df["split"] == "validation"]["step"].tolist() == [4, 8, 12]
    if prefix:  # rank 1 prints first, rank 0's row wins
        assert (train["rank"] == 0).all() and train["memory_gib"].iloc[0] == 70.0
        assert df.attrs["ranks"] == [0, 1]
        everything = parse_log(log, ranks="all")
        assert len(everything) == 2 * 12 + 3 and not everything.duplicated(["split", "step", "rank"]).any()
    else:  # no ranks on the lines: the first line seen (rank 1's)
        assert train["memory_gib"].iloc[0] == 71.0
    assert train["time"].iloc[0] == pd.Timestamp("2025-06-10 21:58:01.001")


@pytest.mark.parametrize("typo", ["0.7O52", "0,7052", "1,5"])
def test_fast_path_log_with_a_typo_reports_it_with_its_line_number(tmp_path, typo):
    log = tmp_path / "titan.log"
    log.write_bytes(_titan_log(6, typo_at=5, typo=typo))
    df = parse_log(log)
    line_no = next(i for i, ln in enumerate(log.read_text().splitlines(), 1) if f"loss: {typo} " in ln)
    assert [n for n, _ in df.attrs["skipped"]] == [line_no]
    assert df.loc[df["step"] == 5, "rank"].tolist() == [1]  # rank 0's line was the typo: never a wrong number
    assert df.loc[df["step"] == 5, "loss"].tolist() == [2.0]


def test_small_read_buffer_gives_the_same_table(tmp_path, monkeypatch):
    """Lines cut by the read buffer, and lines longer than it (the buffer grows), change nothing."""
    from cookbook.metrics import parse

    log = tmp_path / "titan.log"
    log.write_bytes((LOGS / "torchtitan_debug_2rank.log").read_bytes() + _titan_log(5, typo_at=4))
    whole = parse_log(log, ranks="all")
    monkeypatch.setattr(parse, "WINDOW", 100)
    pieces = parse_log(log, ranks="all")
    pd.testing.assert_frame_equal(whole, pieces)
    assert whole.attrs == pieces.attrs and len(whole.attrs["skipped"]) == 1
