"""Benchmark: parse_log on a big NCCL-noisy log, as a ratio to `grep -c` on the same file, and the
cost of following a growing log per new MB.

    .venv/bin/python benchmarks/metrics_bench.py              # ~1 GB log (needs ~1 GB free in --dir)
    .venv/bin/python benchmarks/metrics_bench.py --size-mb 8  # smoke run

parse_log is timed as users call it (files > 128 MB: one worker process per CPU) and with
``workers=1``. All timings read the file from the page cache (a warm-up `grep` runs first). Results go to stdout as
a small report (paste into benchmarks/README.md, section "Metrics").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cookbook.metrics import LogFollower, parse_log

NOISE = [
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO Channel {c:02d}/0 : {g}[{g}] -> {h}[{h}] via P2P/CUMEM/read",
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO NET/OFI Using Libfabric version 1.22",
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO comm 0x5581a2c0 rank {g} nRanks 16 nNodes 2 localRanks 8 "
    "localRank {g} MNNVL 0",
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
    "{r}: gpu-node-{n}:{pid}:{tid} [{g}] NCCL INFO Trees [0] {h}/-1/-1->{g}->-1 [1] {h}/-1/-1->{g}->-1",
]
STEP = ("[rank{r}]:[titan] 2025-06-10 21:58:27,008 - root - INFO - \x1b[31mstep: {s:2}  \x1b[32mloss: {l:8.5f}  "
        "\x1b[38;2;180;60;0mgrad_norm: {g:7.4f}  \x1b[38;2;54;234;195mmemory: 76.79GiB(96.97%)  "
        "\x1b[34mtps: {t:,}  \x1b[36mtflops: 412.50  \x1b[35mmfu: 41.71%\x1b[39m")


def generate(path: Path, size_mb: int, noise_per_step: int = 60, ranks: int = 2) -> int:
    """Write a log of about ``size_mb`` MB: per step ``noise_per_step`` NCCL INFO lines, then every rank's
    step line. Returns the number of steps."""
    noise = "\n".join(NOISE[i % len(NOISE)].format(r=i % 2, n=i % 4, pid=47930 + i, tid=47930 + i, g=i % 8,
                                                   h=(i + 1) % 8, c=i % 32) for i in range(noise_per_step)) + "\n"
    target, step, written = size_mb << 20, 0, 0
    with open(path, "w", buffering=16 << 20) as f:
        while written < target:
            step += 1
            block = noise + "".join(STEP.format(r=r, s=step, l=10 / (1 + step / 1000), g=1.5 + r, t=1_500_000 + step)
                                    + "\n" for r in range(ranks))
            f.write(block)
            written += len(block)
    return step


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def follow_cost(path: Path, workdir: Path, mb: int = 32) -> float:
    """Seconds per new MB for LogFollower.poll() when a log grows by 1 MB between polls."""
    grow = workdir / "growing.log"
    grow.write_bytes(b"")
    follower, spent = LogFollower(grow), 0.0
    with open(path, "rb") as src, open(grow, "ab") as dst:
        for _ in range(mb):
            dst.write(src.read(1 << 20))
            dst.flush()
            t = time.perf_counter()
            follower.poll()
            spent += time.perf_counter() - t
    grow.unlink()
    return spent / mb


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the log (created if missing; default: a temp dir)")
    args = ap.parse_args(argv)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        log = Path(tmp) / "noisy.log"
        t = time.perf_counter()
        steps = generate(log, args.size_mb)
        gen_s = time.perf_counter() - t
        size = log.stat().st_size
        grep = ["grep", "-c", "loss", str(log)]
        subprocess.run(grep, check=True, capture_output=True)  # warm the page cache
        matches = int(subprocess.run(grep, check=True, capture_output=True, text=True).stdout)
        df = None

        def parse():
            nonlocal df
            df = parse_log(log)

        # grep and parse_log back to back in each round (other jobs on the machine hit both alike);
        # the ratio reported is the median of the rounds' ratios
        # parse_log picks its worker processes itself (files > 128 MB: one per CPU); "1 process" is
        # parse_log(..., workers=1) timed in the same round
        rounds = [(best_of(lambda: subprocess.run(grep, check=True, capture_output=True), 1), best_of(parse, 1),
                   best_of(lambda: parse_log(log, workers=1), 1)) for _ in range(args.repeat)]
        grep_s, parse_s = min(g for g, _, _ in rounds), min(p for _, p, _ in rounds)
        single_s = min(s for _, _, s in rounds)
        ratio = statistics.median(g / p for g, p, _ in rounds)
        ratio_1 = statistics.median(g / s for g, _, s in rounds)
        assert df is not None and len(df) == steps and df["step"].iloc[-1] == steps, "parse_log lost steps"
        assert df.equals(parse_log(log, workers=1)), "parallel and single-process tables differ"
        follow_s = follow_cost(log, Path(tmp), mb=min(32, args.size_mb))
    mb = size / (1 << 20)
    result = {
        "size_mb": round(mb, 1), "steps": steps, "grep_matching_lines": matches,
        "grep_s": round(grep_s, 3), "parse_log_s": round(parse_s, 3),
        "grep_mb_per_s": round(mb / grep_s), "parse_mb_per_s": round(mb / parse_s),
        "parse_speed_vs_grep": round(ratio, 3),
        "parse_1proc_s": round(single_s, 3), "parse_1proc_speed_vs_grep": round(ratio_1, 3),
        "rounds": [(round(g, 3), round(p, 3), round(s, 3)) for g, p, s in rounds],
        "follow_ms_per_new_mb": round(follow_s * 1000, 2), "generate_s": round(gen_s, 1),
        "cpus": os.cpu_count(),
    }
    for k, v in result.items():
        print(f"{k:24} {v}")
    return result


if __name__ == "__main__":
    main()
