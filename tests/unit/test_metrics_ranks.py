"""Rank-aware parsing on real public log lines, read windows that change nothing, the follower's contract
(each step once, rank 0's row), run folders read from their best source."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cookbook.metrics import LogFollower, best_source, diagnose_text, parse_log, parse_text

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# pytorch/torchtitan issue #1232 (pipeline parallelism, 2 nodes): ranks without the last stage print -1.0000
PP = (
    "[rank0]:[titan] 2025-05-28 21:13:37,816 - root - INFO - step:  1  loss: -1.0000  memory: 36.90GiB(46.63%)  "
    "tps: 4  tflops: 0.90  mfu: 0.29%"
)
# pytorch/torchtitan PR #3393: a torchrun [rankN]: line
TITAN = (
    "[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24405  grad_norm:  0.8319  "
    "memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%"
)
# meta-pytorch/torchtune PR #2620 (LoRA on multi-node): the [trainerN|M]: prefix, a redraw ending in the next
# line's prefix, and (cut by the log viewer) a bar without its closing bracket
TRAINER = [
    "[trainer0|0]:1|54|Loss: 1.0960569381713867:  54%|█████▍    | 55/101 [15:04<11:17, 14.73s/it]",
    "[trainer0|0]:1|55|Loss: 1.0744975805282593:  54%|█████▍    | 55/101 [15:04<11:17, 14.73s/it][trainer0|0]:",
    "[trainer0|0]:1|55|Loss: 1.0744975805282593:  55%|█████▌    | 56/101 [15:19<11:17, 15.06s/it]",
    "[trainer0|0]:1|56|Loss: 1.073961615562439:  55%|█████▌    | 56/101 [15:19<11:17, 15.06s/it] [trainer0|0]:",
    "[trainer0|0]:1|61|Loss: 0.9896326661109924:  60%|██████    | 61/101 [16:34<09:42, 14.55s/it",
]


def test_pipeline_parallel_placeholder_loss_is_missing():
    df = parse_text(PP + "\n" + PP.replace("step:  1", "step:  2").replace("-1.0000", "2.5000") + "\n")
    assert np.isnan(df["loss"].iloc[0]) and df["loss"].iloc[1] == 2.5
    assert df["memory_gib"].tolist() == [36.90, 36.90] and df["rank"].tolist() == [0, 0]


def test_torchtune_multi_node_prefix_and_a_cut_bar():
    df = parse_text("\n".join(TRAINER) + "\n")
    assert df.attrs["skipped"] == []
    assert df["step"].tolist() == [54, 55, 56, 61]
    assert df["loss"].tolist() == [1.0960569381713867, 1.0744975805282593, 1.073961615562439, 0.9896326661109924]
    assert df["seconds_per_step"].tolist() == [14.73, 14.73, 15.06, 14.55]  # each step's first line
    assert df["rank"].tolist() == [0] * 4 and df["total_steps"].tolist() == [101] * 4


def test_rank_zero_kept_on_the_real_torchtitan_line():
    """Rank 1 prints step 14 first (its loss differs): rank 0's line wins, and ranks="all" keeps both."""
    rank1 = TITAN.replace("[rank0]:", "[rank1]:").replace("loss:  3.24405", "loss:  3.25001")
    df = parse_text(rank1 + "\n" + TITAN + "\n" + rank1.replace("step: 14", "step: 15") + "\n")
    assert df["step"].tolist() == [14, 15] and df["rank"].tolist() == [0, 1]
    assert df["loss"].tolist() == [3.24405, 3.25001] and df["tokens_per_second_per_gpu"].tolist() == [7282] * 2
    assert len(parse_text(rank1 + "\n" + TITAN + "\n", ranks="all")) == 2


def test_tqdm_redraws_are_read_once_and_never_hide_another_step():
    """A redraw of the bar just read is skipped before the regex (the step's first line wins anyway); a
    step whose number starts like the last one's (5 then 55) is still read."""
    bars = [
        TRAINER[0].replace("|54|", "|5|"),
        TRAINER[0].replace("|54|", "|5|").replace("55/101", "56/101"),
        TRAINER[0].replace("|54|", "|55|"),
        TRAINER[0].replace("|54|", "|5|").replace("Loss: 1.09", "Loss: 9.09"),
    ]
    df = parse_text("\r".join(bars) + "\r")
    assert df["step"].tolist() == [5, 55] and df["progress"].tolist() == [55, 55]
    assert df["loss"].tolist() == [1.0960569381713867] * 2 and df.attrs["skipped"] == []
    redrawn_typo = TRAINER[0] + "\r" + TRAINER[0].replace("1.0960569381713867", "1.09605693817I3867")
    assert parse_text(redrawn_typo).attrs["skipped"] == []  # a redraw of a step read: not parsed again


@pytest.mark.parametrize(
    "prefix, rank, node",
    [
        ("", 0, None),  # [rank0]: only
        ("0: ", 0, 0),  # srun --label with torchrun's [rankN]: the label is the node
        ("12: ", 0, 12),
        ("1: ", 0, 1),
    ],
)
def test_srun_label_with_a_rank_tag_is_the_node(prefix, rank, node):
    df = parse_text(prefix + TITAN + "\n", ranks="all")
    assert df["rank"].tolist() == [rank] and df["loss"].tolist() == [3.24405]
    assert (df["node"].tolist() == [node]) if node is not None else "node" not in df
    assert df["time"].iloc[0] == pd.Timestamp("2026-05-18 16:04:46.338")


def test_rehearsal_prefixes_and_rank_zero_wins_not_the_last_line():
    line = (
        "{pre}[titan] 2026-01-01 10:00:0{s},000 - root - INFO - step: {s}  loss:  {loss}  memory:  9.46GiB(64.99%)"
        "  tps: 7,282"
    )
    lines = []
    for s in (1, 2):
        for node, rank in ((1, 9), (0, 0), (1, 8)):  # rank 0 is neither first nor last
            lines.append(line.format(pre=f"{node}: [rank{rank}]:", s=s, loss=f"{s + rank / 100:.2f}"))
    text = "\n".join(lines) + "\n"
    df = parse_text(text)
    assert df["loss"].tolist() == [1.0, 2.0] and df["rank"].tolist() == [0, 0] and df["node"].tolist() == [0, 0]
    everything = parse_text(text, ranks="all")
    assert len(everything) == 6 and sorted(set(everything["rank"])) == [0, 8, 9]
    assert everything.set_index(["step", "rank"]).loc[(2, 9), "loss"] == 2.09
    assert parse_text(text).attrs["ranks"] == [0, 8, 9]
    # only ranks other than 0 print (e.g. LOG_RANK=7 under pipeline parallelism): the first line seen
    no_zero = "\n".join(ln for ln in lines if "[rank0]" not in ln) + "\n"
    assert parse_text(no_zero)["rank"].tolist() == [9, 9]


def _mixed_log() -> bytes:
    """tqdm redraws (\\r), rank prefixes, validation rows, typos (skipped), noise, a long line, bad bytes, FSDP
    and DiskLogger lines, no newline at the end."""
    out = []
    for s in range(1, 41):
        out.append(f"0: host:1:1 [0] NCCL INFO Channel {s:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read")
        first = f"1|{s}|Loss: {10 / s:.6f}:   0%|          | {s}/400 [00:{s:02d}<10:00, {s}.50s/it]"
        again = f"1|{s}|Loss: {10 / s:.6f}:   0%|          | {s}/400 [00:{s:02d}<09:59, 9.{s:02d}s/it]"
        out.append(first + "\r" + again if s % 3 == 0 else first)
        out.append(again)
    out.append("x" * 3000)
    out.append("garbage line with loss but no step")
    for s in range(1, 61):
        for r in (1, 0):
            loss = "0.7O52" if s % 17 == 0 and r == 0 else f"{10 / s:.5f}"
            pre = ["[rank{r}]:", "{r}: [default{r}]:", "{r}: ", ""][s % 4].format(r=r)
            out.append(
                pre + f"[titan] 2025-06-10 21:58:{s % 60:02d},{s:03d} - root - INFO - "
                f"\x1b[31mstep: {100 + s}  \x1b[32mloss: {loss}  \x1b[38;2;180;60;0mgrad_norm: {1.5 + r:7.4f}  "
                f"\x1b[38;2;54;234;195mmemory: {70 + r:.2f}GiB(96.97%)  \x1b[34mtps: {1_500_000 + s:,}  "
                f"\x1b[36mtflops: 412.50  \x1b[35mmfu: {'N/A' if s % 5 == 0 else '41.71%'}\x1b[39m"
            )
        if s % 10 == 0:
            out.append(
                f"3: 2025-06-17 16:24:52 I [train.py:103] Batch {1000 + s} Loss: {s / 7:.5f}, "
                f"Speed: 4.88 samples/sec, lr: 0.000100"
            )
            out.append(f"Step {2000 + s} | loss:6.2{s} lr:0.001 tokens_per_second_per_gpu:273.99 ")
    return "\n".join(out).encode("utf-8").replace(b"garbage", b"garb\xfe\xffage")


@pytest.mark.parametrize("window", [97, 256, 1000, 4096])
def test_read_windows_change_nothing(tmp_path, monkeypatch, window):
    from cookbook.metrics import parse

    log = tmp_path / "mixed.log"
    log.write_bytes(_mixed_log())
    whole = {r: parse_log(log, ranks=r) for r in ("first", "all")}
    monkeypatch.setattr(parse, "WINDOW", window)
    monkeypatch.setattr(parse, "BATCH", window // 50)  # rows converted and reduced in small batches too
    for ranks, expected in whole.items():
        got = parse_log(log, ranks=ranks)
        pd.testing.assert_frame_equal(got, expected)
        assert got.attrs == expected.attrs
    df = whole["first"]
    assert len(df.attrs["skipped"]) == 3
    tqdm = df[df["format"] == "torchtune-tqdm"].set_index("step")
    assert tqdm.loc[7, "seconds_per_step"] == 7.5 and tqdm.loc[9, "seconds_per_step"] == 9.5
    assert df.loc[(df["step"] == 117) & (df["format"] == "torchtitan"), "rank"].tolist() == [1]
    lines = log.read_bytes().split(b"\n")
    for number, text in df.attrs["skipped"]:
        assert lines[number - 1].decode("utf-8", "replace").strip().startswith(text[:40])


def _bench_log(shape: str, steps: int = 30) -> str:
    """A small log of one of the benchmark's shapes (benchmarks/metrics_bench.py), its rank order shuffled."""
    spec = importlib.util.spec_from_file_location("metrics_bench", LOGS.parents[2] / "benchmarks" / "metrics_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lines = "".join(bench._block(shape, s) for s in range(1, steps + 1)).split("\n")
    rng = np.random.default_rng(0)  # some steps' lines in another order: rank 0 first, last, or between
    for start in range(0, len(lines) - 8, 23):
        lines[start : start + 8] = rng.permutation(lines[start : start + 8]).tolist()
    return "\n".join(lines) + bench.FAILURE


_FSDP = "{r}: 2025-06-17 16:24:52 I [train.py:103] Batch {s} Loss: 1.5, Speed: 4.88 samples/sec, lr: 0.000100"
# lines the shortcut must not take for the step just read: a longer step number, another format's line
_NOT_THAT_STEP = [_FSDP.format(r=0, s=1), _FSDP.format(r=1, s=12), _FSDP.format(r=0, s=5), "1: [rank1]:" + TITAN]
_NOT_THAT_STEP[-1] = _NOT_THAT_STEP[-1].replace("INFO - ", "INFO - Batch 5 of ")


@pytest.mark.parametrize("shape", ["noisy", "dense", "fsdp", "tqdm", "mixed", "rehearsal", "not that step"])
def test_the_other_ranks_shortcut_changes_nothing(monkeypatch, shape):
    """ranks="first" reads a line holding the key text of the step just read from rank 0 no further, and another
    format's line of that step only up to its step; with both shortcuts off (every line holds a marker read
    "before" its format; no step is taken), every table and attr is the same."""
    from cookbook.metrics import formats, parse

    text = {"rehearsal": _mixed_log().decode("utf-8", "replace"), "not that step": "\n".join(_NOT_THAT_STEP * 15)}
    text = text.get(shape) or _bench_log(shape)
    fast = parse_text(text)
    monkeypatch.setattr(parse, "_EARLIER", {f: ("oss",) * 4 for f in parse._EARLIER})
    monkeypatch.setattr(parse, "parse_line", lambda line, *won: formats.parse_line(line))
    slow = parse_text(text)
    pd.testing.assert_frame_equal(fast, slow)
    assert fast.attrs == slow.attrs and len(fast) >= 4


def test_tqdm_carriage_return_stream_is_read_in_linear_time(tmp_path):
    bar = "\r1|{s}|Loss: {loss:.4f}:   1%|          | {s}/50000 [00:{t:02d}<10:00,  1.00it/s]"
    log = tmp_path / "tune.err"
    log.write_text("".join(bar.format(s=s, loss=10 / s, t=s % 60) for s in range(1, 50001)))
    df = parse_log(log)
    assert len(df) == 50000 and df["seconds_per_step"].iloc[-1] == 1.0
    assert diagnose_text(log.read_text()) == []


def test_follower_emits_each_step_once_with_rank_zeros_row(tmp_path):
    src = (LOGS / "torchtitan_debug_2rank.log").read_bytes()  # rank 1's line comes first for most steps
    log = tmp_path / "job.out"
    log.write_bytes(b"")
    follower, emitted = LogFollower(log), []
    for i in range(0, len(src), 200):
        with open(log, "ab") as f:
            f.write(src[i : i + 200])
        new = follower.poll()
        emitted += list(zip(new["split"], new["step"], new["rank"])) if len(new) else []
    assert len(emitted) == len(set((s, t) for s, t, _ in emitted)) == 9  # 6 train + 3 validation steps
    assert {r for _, _, r in emitted} == {0}
    pd.testing.assert_frame_equal(follower.df, parse_log(log))
    assert follower.eta(total_steps=10).total_seconds() > 0


def test_run_folder_reads_its_best_source(tmp_path):
    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    shutil.copy(LOGS / "torchtune_disklogger.txt", run / "log_1795385799.txt")
    assert best_source(run) == ("log", run / "log_1795385799.txt")
    assert parse_log(run)["step"].tolist() == list(range(1, 17))
    shutil.copy(next((LOGS / "torchtune_tb").iterdir()), run / "tb")
    assert best_source(run) == ("tensorboard", run)
    assert parse_log(run).attrs["formats"] == ["tensorboard"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        best_source(tmp_path / "empty")


def test_diagnose_windows_change_nothing(monkeypatch, tmp_path):
    diag = importlib.import_module("cookbook.metrics.diagnose")  # the package exports diagnose(), the function

    before = (LOGS / "torchtune_missing_checkpoint.log").read_bytes() * 3
    slurm = (LOGS / "slurm_timeout.out").read_bytes()
    whole = diag.diagnose_bytes(before + slurm)
    monkeypatch.setattr(diag, "WINDOW", 333)
    assert diag.diagnose_bytes(before + slurm) == whole
    assert whole[0].kind == "missing_checkpoint" and whole[0].count == 3
    log = tmp_path / "job.err"  # a tqdm stream (no \n, longer than a window) then the failure, from a file
    log.write_bytes(b"".join(b"\r" + TRAINER[0].encode() for _ in range(40)) + b"\n" + before + slurm)
    found = diag.diagnose(log)
    assert [(f.kind, f.line_number - 1, f.count) for f in found] == [(f.kind, f.line_number, f.count) for f in whole]
    timeout = next(f for f in whole if f.kind == "slurm_timeout")
    assert timeout.line_number == before.count(b"\n") + diag.diagnose_bytes(slurm)[0].line_number
