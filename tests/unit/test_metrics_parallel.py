"""parse_log's parallel path (worker processes per byte range) gives exactly the single-process table."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from cookbook.metrics import parse, parse_log


def _mixed_log() -> bytes:
    """Every shape the range split could break: tqdm redraws (\\r and a step printed twice on separate
    lines, first timing wins), rank prefixes, validation rows, typos (skipped), noise, a long line,
    non-UTF-8 bytes, FSDP lines, and no newline at the end. Formats do not share (split, step, rank) keys:
    which of two formats wins such a key depends on the read windows even in one process (bulk-matched
    rows come before per-line rows within a window)."""
    out = []
    for s in range(1, 41):
        out.append(f"0: host:1:1 [0] NCCL INFO Channel {s:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read")
        first = f"1|{s}|Loss: {10 / s:.6f}:   0%|          | {s}/400 [00:{s:02d}<10:00, {s}.50s/it]"
        again = f"1|{s}|Loss: {10 / s:.6f}:   0%|          | {s}/400 [00:{s:02d}<09:59, 9.{s:02d}s/it]"
        out.append(first + "\r" + again if s % 3 == 0 else first)
        out.append(again)                              # the same step again: the first line must win
    out.append("x" * 3000)                             # longer than a byte range
    out.append("\xff garbage line with loss but no step".encode("latin-1").decode("latin-1"))
    for s in range(1, 61):
        for r in (1, 0):
            loss = "0.7O52" if s % 17 == 0 and r == 0 else f"{10 / s:.5f}"   # typo: skipped, never a number
            pre = ["[rank{r}]:", "{r}: [default{r}]:", "{r}: ", ""][s % 4].format(r=r)
            out.append(pre + f"[titan] 2025-06-10 21:58:{s % 60:02d},{s:03d} - root - INFO - "
                       f"\x1b[31mstep: {100 + s}  \x1b[32mloss: {loss}  \x1b[38;2;180;60;0mgrad_norm: {1.5 + r:7.4f}  "
                       f"\x1b[38;2;54;234;195mmemory: {70 + r:.2f}GiB(96.97%)  \x1b[34mtps: {1_500_000 + s:,}  "
                       f"\x1b[36mtflops: 412.50  \x1b[35mmfu: {'N/A' if s % 5 == 0 else '41.71%'}\x1b[39m")
        if s % 4 == 0:
            out.append(f"[rank0]:[titan] 2025-06-10 21:59:00,000 - root - INFO - validate step: {100 + s}  "
                       f"loss: {s / 10:.4f}  memory:  0.68GiB(2.89%)  tps: 468")
        if s % 10 == 0:
            out.append(f"3: 2025-06-17 16:24:52 I [train.py:103] Batch {1000 + s} Loss: {s / 7:.5f}, "
                       f"Speed: 4.88 samples/sec, lr: 0.000100")
            out.append(f"Step {2000 + s} | loss:6.2{s} lr:0.001 tokens_per_second_per_gpu:273.99 ")
    data = "\n".join(out).encode("utf-8")
    return data.replace(b"garbage", b"garb\xfe\xffage")


@pytest.mark.parametrize("piece", [97, 256, 1000, 4096])
def test_parallel_ranges_give_the_single_process_table(tmp_path, monkeypatch, piece):
    log = tmp_path / "mixed.log"
    log.write_bytes(_mixed_log())
    single = {r: parse_log(log, ranks=r, workers=1) for r in ("first", "all")}
    assert len(single["first"].attrs["skipped"]) >= 3

    used = []
    real = parse._parse_parallel
    monkeypatch.setattr(parse, "_parse_parallel", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(parse, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parse, "_PIECE", piece)
    monkeypatch.setattr(parse, "_CHUNK", 300)          # workers' read windows cut lines too
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for ranks, expected in single.items():
        got = parse_log(log, ranks=ranks)
        pd.testing.assert_frame_equal(got, expected)
        assert got.attrs == expected.attrs
    assert len(used) == 2

    df = single["first"]
    tqdm = df[df["format"] == "torchtune-tqdm"].set_index("step")
    assert tqdm.loc[7, "seconds_per_step"] == 7.5 and tqdm.loc[9, "seconds_per_step"] == 9.5
    val = df[df["split"] == "validation"]
    assert val["step"].tolist() == list(range(104, 161, 4)) and (val["rank"] == 0).all()
    assert df.loc[(df["step"] == 117) & (df["format"] == "torchtitan"), "rank"].tolist() == [1]
    lines = log.read_bytes().split(b"\n")
    for number, text in df.attrs["skipped"]:
        assert lines[number - 1].decode("utf-8", "replace").strip().startswith(text[:40])
