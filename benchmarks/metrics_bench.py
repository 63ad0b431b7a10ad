"""Benchmark of cookbook.metrics on every log shape, side by side with the simplest honest code.

    .venv/bin/python benchmarks/metrics_bench.py                  # 256 MB per shape, tqdm 100k and 1M updates
    .venv/bin/python benchmarks/metrics_bench.py --size-mb 16 --tqdm-updates 100000   # quick

Per shape (written once into --dir, each ending in a failure's last lines): ``grep -c oss FILE``; the
simple loop, the baseline (``for line in open(FILE)``, per format in the shape one precompiled regex of the
fields a user wants -- ``SIMPLE`` -- ``search``ed per line, the groups converted with int/float into lists,
then a DataFrame); the grammar loop (the grammar's own regexes ``match``ed per line, ``m.groups()``
appended, one ``pd.DataFrame(...).apply(pd.to_numeric)``: the previous baseline); ``parse_log(FILE)``;
``diagnose(FILE)``; and ``cookbook metrics FILE``. Each runs in a fresh process (peak RSS is that process's
``ru_maxrss``; "baseline" is a process that only imports), timed inside it after its imports, back to back
on the same file read from the page cache. Times are CPU seconds (user + system: the machine is shared,
and other jobs stretch wall time, not CPU time) with the wall time beside them. Then the cost of one
``LogFollower.poll()`` that reads one new step after 100 / 10k / 60k steps, and CLI start times as a
ratio to ``python -c pass``. Prints a markdown table with the issue's thresholds marked pass/fail
(benchmarks/README.md, section "Metrics").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
NOISE = (
    "{r}: gpu-node-{n}:{pid}:{pid} [{g}] NCCL INFO Channel {c:02d}/0 : {g}[{g}] -> {h}[{h}] via P2P/CUMEM/read",
    "{r}: gpu-node-{n}:{pid}:{pid} [{g}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "{r}: gpu-node-{n}:{pid}:{pid} [{g}] NCCL INFO comm 0x5581a2c0 rank {g} nRanks 16 nNodes 2 localRanks 8",
)
TITAN = (
    "{pre}[titan] 2025-06-10 21:58:{sec:02d},008 - root - INFO - \x1b[31mstep: {s:2}  \x1b[32mloss: {l:8.5f}  "
    "\x1b[38;2;180;60;0mgrad_norm: {g:7.4f}  \x1b[38;2;54;234;195mmemory: 76.79GiB(96.97%)  "
    "\x1b[34mtps: {t:,}  \x1b[36mtflops: 412.50  \x1b[35mmfu: 41.71%\x1b[39m"
)
FSDP = (
    "{r}: 2025-06-17 16:24:{sec:02d} I [train.py:103] Batch {s} Loss: {l:.5f}, Speed: 10.90 samples/sec, lr: 0.000100"
)
TQDM = "\r1|{s}|Loss: {l:.16f}:   0%|          | {p}/1000000 [1:{m:02d}:{sec:02d}<99:00:00,  1.31s/it]"
DISK = "Step {s} | loss:{l:.6f} lr:0.001 tokens_per_second_per_gpu:6808.66 "
# the end of a failed job (torch's NCCL watchdog, torchrun, Slurm): something for diagnose to find
FAILURE = (
    "\n[rank1]:[E1122 10:00:00.100000000 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 "
    "milliseconds before timing out.\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "srun: error: gpu-node-1: task 1: Exited with exit code 1\n"
    "slurmstepd: error: *** JOB 1234 ON gpu-node-0 CANCELLED AT 2025-06-10T22:00:00 DUE TO TIME LIMIT ***\n"
)


def _noise(i: int) -> str:
    return NOISE[i % 3].format(r=i % 2, n=i % 4, pid=47930 + i % 97, g=i % 8, h=(i + 1) % 8, c=i % 32)


def _block(shape: str, s: int) -> str:
    """The lines of step ``s`` in a log of ``shape``."""
    loss, sec = 10 / (1 + s / 1000), s % 60
    titan = lambda pre: TITAN.format(pre=pre, sec=sec, s=s, l=loss, g=1.5, t=1_500_000 + s)  # noqa: E731
    if shape == "noisy":  # 97% NCCL noise, torchtitan lines from 2 ranks
        return (
            "".join(_noise(s * 60 + i) + "\n" for i in range(60)) + titan("[rank1]:") + "\n" + titan("[rank0]:") + "\n"
        )
    if shape == "dense":  # 16 ranks each printing every step (torchrun, no LOG_RANK filter)
        return "".join(titan(f"{r // 8}: [rank{r}]:") + "\n" for r in range(16))
    if shape == "fsdp":  # srun -l, 8 tasks each printing every batch, some NCCL noise
        return _noise(s) + "\n" + "".join(FSDP.format(r=r, sec=sec, s=s, l=loss) + "\n" for r in range(8))
    if shape == "tqdm":  # torchtune's stderr: \r redraws only, each step drawn twice
        bar = TQDM.format(s=s, l=loss, p=s, m=(s // 60) % 60, sec=sec)
        return bar + bar.replace("1.31s/it", "1.30s/it")
    # mixed: every format in one file, with noise
    return (
        _noise(s)
        + "\n"
        + titan("[rank0]:")
        + "\n"
        + FSDP.format(r=0, sec=sec, s=s, l=loss)
        + "\n"
        + TQDM.format(s=s, l=loss, p=s, m=(s // 60) % 60, sec=sec)
        + "\n"
        + DISK.format(s=s, l=loss)
        + "\n"
        + json.dumps({"step": s, "loss": loss})
        + "\n"
    )


def generate(path: Path, shape: str, size_mb: int, tqdm_updates: int) -> int:
    """Write a log of ``shape`` (about ``size_mb`` MB; tqdm: ``tqdm_updates`` redraws). Returns its steps."""
    target = size_mb << 20
    step, written = 0, 0
    with open(path, "w", buffering=16 << 20, newline="") as f:
        while (written < target) if shape != "tqdm" else (2 * step < tqdm_updates):
            step += 1
            block = _block(shape, step)
            f.write(block)
            written += len(block)
        f.write(FAILURE)
    return step


# --- one measurement per fresh process ---------------------------------------------------------------
_CHILD = r"""
import json, os, re, resource, sys, time
what, path = sys.argv[1], sys.argv[2]
SIMPLE = json.loads(os.environ["SIMPLE"])
import pandas as pd
from cookbook.metrics import diagnose, parse_log
from cookbook.metrics.formats import FORMATS
if what == "metrics":
    import contextlib, io
    from cookbook.cli import build_parser, main
    build_parser()                   # the CLI's imports, as a user's `cookbook metrics` pays them before
out = {}
t, c = time.perf_counter(), time.process_time()
if what == "baseline":
    pass
elif what == "parse":
    df = parse_log(path)
    out.update(rows=len(df), df_mb=df.memory_usage(deep=True).sum() / 2**20, steps=int(df["step"].max()))
elif what == "simple":  # what a user writes for the format(s) in the log: one regex searched per line
    rxs = {name: re.compile(rx) for name, rx in SIMPLE[sys.argv[3]]}
    cols = {name: [] for name in rxs}
    with open(path, errors="replace", newline="") as f:  # newline="": a tqdm \r ends a line too
        for line in f:
            for name, rx in rxs.items():
                if m := rx.search(line):
                    g = m.groups()
                    cols[name].append((int(g[0]), float(g[1]), float(g[2]), int(g[3].replace(",", "")),
                                       float(g[4])) if name == "titan" else (int(g[0]), *map(float, g[1:])))
                    break
    frames = [pd.DataFrame(rows) for rows in cols.values()]
    out.update(rows=sum(len(f) for f in frames))
elif what == "plain":  # the grammar's own regexes matched per line (the previous baseline)
    shape = sys.argv[3]
    names = {"noisy": ["step:"], "dense": ["step:"], "fsdp": ["Batch "], "tqdm": ["|Loss:"]}.get(shape)
    rxs = [f.regex for f in FORMATS if f.regex is not None and (names is None or f.marker in names)]
    found = {rx: [] for rx in rxs}
    with open(path, errors="replace") as f:
        for line in f:
            for rx in rxs:
                m = rx.match(line)
                if m:
                    found[rx].append(m.groups())
                    break
    frames = [pd.DataFrame(rows, columns=list(rx.groupindex)).apply(pd.to_numeric, errors="coerce")
              for rx, rows in found.items()]
    out.update(rows=sum(len(f) for f in frames))
elif what == "diagnose":
    out.update(findings=len(diagnose(path)))
elif what == "metrics":
    with contextlib.redirect_stdout(io.StringIO()):
        main(["metrics", path, "--tail", "3"])
out.update(wall=time.perf_counter() - t, seconds=time.process_time() - c,
           rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
print(json.dumps(out))
"""


# The simple loop's regexes: for each format in a shape, the fields a user would pull out of it (searched,
# not anchored; ANSI colours and ranks skipped over with .*?; numbers as [\d.,]+, converted with float()).
_TITAN = r"step:\s*(\d+).*?loss:\s*([\d.]+).*?grad_norm:\s*([\d.]+).*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%"
_FSDP = r"Batch (\d+) Loss: ([\d.]+), Speed: ([\d.]+) samples/sec"
_TQDM = r"(\d+)\|(\d+)\|Loss: ([\d.]+)"
SIMPLE = {
    "noisy": [("titan", _TITAN)],
    "dense": [("titan", _TITAN)],
    "fsdp": [("fsdp", _FSDP)],
    "tqdm": [("tqdm", _TQDM)],
    "mixed": [
        ("titan", _TITAN),
        ("fsdp", _FSDP),
        ("tqdm", _TQDM),
        ("disk", r"^Step (\d+) \| loss:([\d.]+)"),
        ("jsonl", r'^\{"step": (\d+), "loss": ([\d.]+)'),
    ],
}


def child(what: str, path: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIMPLE": json.dumps(SIMPLE)}
    res = subprocess.run(
        [PY, "-c", _CHILD, what, str(path), *extra], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def grep_seconds(path: Path) -> float:
    """CPU seconds of ``grep -c oss FILE``."""
    before = _children_cpu()
    subprocess.run(["grep", "-c", "oss", str(path)], capture_output=True, check=False)
    return _children_cpu() - before


def poll_cost(workdir: Path, steps: int, polls: int = 20) -> float:
    """Median CPU seconds of one ``LogFollower.poll()`` (and ``eta()``) reading one new step after ``steps``
    steps of a log where 2 ranks print each step between NCCL lines."""
    from cookbook.metrics import LogFollower

    def block(s: int) -> str:
        return "".join(line + "\n" for line in _block("noisy", s).splitlines()[-4:])

    log = workdir / f"follow{steps}.log"
    log.write_text("".join(block(s) for s in range(1, steps + 1)))
    follower = LogFollower(log)
    follower.poll()
    times = []
    for s in range(steps + 1, steps + 1 + polls):
        with open(log, "a") as f:
            f.write(block(s))
        t = time.process_time()
        new = follower.poll()
        follower.eta(total_steps=steps * 2)
        times.append(time.process_time() - t)
        assert len(new) == 1, "one new step per poll"
    log.unlink()
    return statistics.median(times)


CLI = {
    "python -c pass": ["-c", "pass"],
    "cookbook --help": ["--help"],
    "cookbook recipes": ["recipes"],
    "cookbook plan llama3_8b_c4": ["plan", "llama3_8b_c4"],
    "cookbook render --help": ["render", "--help"],
    "cookbook render fsdp_llama3_1_8b (fsdp)": ["render", "fsdp_llama3_1_8b", "-o", "{tmp}/c/x.sbatch"],
    "cookbook render llama3_3_70b_lora (torchtune)": ["render", "llama3_3_70b_lora", "-o", "{tmp}/b/x.sbatch"],
    "cookbook render llama3_8b_c4 (torchtitan)": ["render", "llama3_8b_c4", "-o", "{tmp}/a/x.sbatch"],
}
CLI_LIMIT_S = 0.3  # the start-up limit (verbs that only start: --help, recipes, plan)


def cli_times(tmp: Path, repeat: int = 5) -> dict[str, float]:
    """Best-of-``repeat`` wall seconds of each command, run in turns (so load hits them alike)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times: dict[str, list[float]] = {name: [] for name in CLI}
    for _ in range(repeat):
        for name, args in CLI.items():
            cmd = [PY, *args] if args[0] == "-c" else [PY, "-m", "cookbook", *(a.format(tmp=tmp) for a in args)]
            t = time.perf_counter()
            ok = subprocess.run(cmd, capture_output=True, env=env, check=False).returncode == 0
            times[name].append(time.perf_counter() - t if ok else math.nan)  # a command that failed
    return {name: min(ts) for name, ts in times.items()}


SHAPES = ("noisy", "dense", "fsdp", "tqdm", "mixed")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=256, help="size of each log but tqdm's (default 256)")
    ap.add_argument("--tqdm-updates", default="100000,1000000", help="tqdm logs: redraws in each (2 per step)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--poll-steps", default="100,10000,60000")
    ap.add_argument("--no-cli", action="store_true")
    ap.add_argument("--dir", default=None, help="where to write the logs (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the raw results to this JSON file")
    args = ap.parse_args(argv)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    result: dict = {"shapes": {}, "poll_s": {}, "cli_s": {}, "size_mb": args.size_mb}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result["baseline"] = child("baseline", Path(tmp))
        runs = [
            (shape, int(n))
            for shape in args.shapes.split(",")
            for n in (args.tqdm_updates.split(",") if shape == "tqdm" else [0])
        ]
        for shape, updates in runs:
            name = f"tqdm {updates:,} updates" if shape == "tqdm" else shape
            log = Path(tmp) / f"{shape}.log"
            steps = generate(log, shape, args.size_mb, updates)
            mb = log.stat().st_size / 2**20
            grep_seconds(log)  # warm the page cache
            r = {
                "mb": mb,
                "steps": steps,
                "grep_s": grep_seconds(log),
                "simple": child("simple", log, shape),
                "plain": child("plain", log, shape),
                "parse": child("parse", log),
                "diagnose": child("diagnose", log),
                "metrics": child("metrics", log),
            }
            assert r["parse"]["steps"] == steps, f"{shape}: parse_log lost steps"
            result["shapes"][name] = r
            log.unlink()
            print(f"{name}: {r}", file=sys.stderr, flush=True)
        for n in (int(x) for x in args.poll_steps.split(",") if x):
            result["poll_s"][n] = poll_cost(Path(tmp), n)
        if not args.no_cli:
            result["cli_s"] = cli_times(Path(tmp))
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


def _mark(ok: bool) -> str:
    return "pass" if ok else "**FAIL**"


def report(result: dict) -> str:
    """The markdown tables, each threshold of issue 17 marked pass/fail."""
    grammar = any(r.get("plain") for r in result["shapes"].values())
    lines = [
        "| shape | MB | steps | `grep -c` s | simple loop s | "
        + ("grammar loop s | " if grammar else "")
        + "`parse_log` s (wall) | parse_log vs simple loop (>= 1.0x, aim 2x) | parse MB/s "
        "| `diagnose` s, MB/s (>= 100) | `cookbook metrics` / parse_log (<= 1.5), CPU; wall | DataFrame MB "
        "| peak RSS MB, absolute | peak RSS above the import-only process (<= 2x DataFrame + 150) |",
        "|" + " --- |" * (13 if grammar else 12),
    ]
    base = result.get("baseline", {}).get("rss_mb", 0.0)
    for shape, r in result["shapes"].items():
        p, simple, diag, mb = r["parse"], r["simple"]["seconds"], r["diagnose"]["seconds"], r["mb"]
        speed, ratio, limit = simple / p["seconds"], r["metrics"]["seconds"] / p["seconds"], 2 * p["df_mb"] + 150
        wall = r["metrics"]["wall"] / p["wall"]  # the diagnosis reads beside the parse (a thread): what a user waits
        aim = "pass, aim met" if speed >= 2 else "pass, aim missed" if speed >= 1 else "**FAIL**"
        tqdm_1m = " (<= 3 s: " + _mark(p["seconds"] <= 3) + ")" if shape.startswith("tqdm 1,000,000") else ""
        plain = f"{r['plain']['seconds']:.2f} | " if grammar and r.get("plain") else "- | " if grammar else ""
        above = p["rss_mb"] - base
        lines.append(
            f"| {shape} | {mb:.0f} | {r['steps']:,} | {r['grep_s']:.2f} | {simple:.2f} | {plain}{p['seconds']:.2f}"
            f"{tqdm_1m} ({p['wall']:.2f}) | {speed:.2f}x {aim} | {mb / p['seconds']:.0f} | "
            f"{diag:.2f}, {mb / diag:.0f} {_mark(mb / diag >= 100)} | "
            f"{ratio:.2f} {_mark(ratio <= 1.5)}; {wall:.2f} {_mark(wall <= 1.5)} | "
            f"{p['df_mb']:.1f} | {p['rss_mb']:.0f} (limit {limit:.0f}: {_mark(p['rss_mb'] <= limit)}) | "
            f"{above:.0f} (limit {limit:.0f}: {_mark(above <= limit)}) |"
        )
    if "baseline" in result:
        lines.append(
            f"\nA process that only imports pandas and cookbook.metrics peaks at {base:.0f} MB RSS "
            "(the import-only process). Times are CPU seconds (user + system)."
        )
    if result["poll_s"]:
        polls = result["poll_s"]
        lines += [
            "",
            "| steps already followed | one poll + `eta()` (one new step), CPU ms | / the poll at the fewest |",
            "| --- | --- | --- |",
        ]
        first = polls[min(polls)]
        lines += [f"| {n:,} | {s * 1000:.2f} | {s / first:.2f} {_mark(s <= 2 * first)} |" for n, s in polls.items()]
    if result["cli_s"]:
        base = result["cli_s"]["python -c pass"]
        lines += [
            "",
            "| command | wall seconds (best of 5) | / `python -c pass` | start <= 0.3 s |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| `{c}` | {s:.3f} | {s / base:.1f} | "
            f"{_mark(s <= CLI_LIMIT_S) if '(' not in c else 'renders and validates: not start-up only'} |"
            for c, s in result["cli_s"].items()
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
