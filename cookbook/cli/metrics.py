"""``cookbook metrics LOG`` (table, CSV, plot, diagnosis) and ``cookbook watch JOBID`` (live)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from cookbook.cli import UserError

_SHOW = ("step", "split", "loss", "lr", "grad_norm", "tokens_per_second_per_gpu", "samples_per_second",
         "memory_gib", "tflops", "mfu_pct", "rank")
_SHORT = {"tokens_per_second_per_gpu": "tok/s/gpu", "samples_per_second": "samples/s", "memory_gib": "mem_gib"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metrics", help="parse a training log (or TensorBoard folder) into a table")
    p.add_argument("log", help="log file or TensorBoard event folder")
    p.add_argument("--csv", help="write all rows to this CSV file")
    p.add_argument("--plot", help="write loss/throughput/memory/MFU plots to this PNG")
    p.add_argument("--tail", type=int, default=10, help="rows to print (default 10, 0 = all)")
    p.add_argument("--all-ranks", action="store_true", help="keep every rank's row, not only the lowest rank's")
    p.set_defaults(func=_metrics)
    w = sub.add_parser("watch", help="follow a Slurm job's log live: new steps, progress, diagnosis at the end")
    w.add_argument("job_id")
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    w.add_argument("--timeout", type=float, default=None, help="stop watching after this many seconds")
    w.set_defaults(func=_watch)


def format_rows(df: pd.DataFrame, header: bool = True) -> str:
    """The useful columns of ``df`` as a fixed-width text table."""
    cols = [c for c in _SHOW if c in df and df[c].notna().any()]
    if df.empty or not cols:
        return ""
    view = df[cols].rename(columns=_SHORT)
    return view.to_string(index=False, header=header, col_space=10, float_format=lambda v: f"{v:.6g}", na_rep="-")


def _metrics(args: argparse.Namespace) -> int:
    from cookbook.metrics import diagnose, parse_log, plot_runs

    path = Path(args.log)
    if not path.exists():
        raise UserError(f"{path} does not exist")
    try:
        df = parse_log(path, ranks="all" if args.all_ranks else "first")
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    if df.empty:
        print(f"no training steps found in {path}")
    else:
        shown = df if args.tail == 0 else df.tail(args.tail)
        print(format_rows(shown))
        train = df[df["split"].eq("train")]
        formats = ", ".join(df.attrs.get("formats", []))
        last = f", last step {train['step'].iloc[-1]} loss {train['loss'].iloc[-1]:.4g}" if len(train) else ""
        print(f"\n{len(df)} rows ({formats}){last}")
    for line_no, text in df.attrs.get("skipped", []):
        print(f"skipped line {line_no} (looks like metrics, matches no format): {text[:120]}", file=sys.stderr)
    if path.is_file():
        for finding in diagnose(path):
            print(finding)
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.plot:
        plot_runs({path.name: df}, out=args.plot)
        print(f"wrote {args.plot}")
    return 0


def _watch(args: argparse.Namespace) -> int:
    from cookbook.metrics import LogFollower, diagnose, eta
    from cookbook.slurm.client import SlurmClient, SlurmError

    client = SlurmClient()
    try:
        info = client.state(args.job_id)
        out = client.output_path(args.job_id)
    except SlurmError as e:
        raise UserError(str(e)) from e
    if out is None:
        raise UserError(f"Slurm no longer knows job {args.job_id}'s output file; use `cookbook metrics LOG`")
    print(f"job {args.job_id} {info.state}: following {out}", flush=True)
    follower, header, state = LogFollower(out), True, info.state
    end = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        new = follower.poll()
        if len(new):
            print(format_rows(new, header=header), flush=True)
            header = False
            left = eta(follower.df)
            if left is not None:
                print(f"  ETA {str(left).split('.')[0]}", flush=True)
        if info.done:
            break
        if end is not None and time.monotonic() > end:
            print(f"stopped watching; job {args.job_id} is {info.state}")
            return 0
        time.sleep(args.interval)
        info = client.state(args.job_id)
        if info.state != state:
            print(f"job {args.job_id}: {state} -> {info.state}", flush=True)
            state = info.state
    follower.poll()
    print(f"job {args.job_id} ended {info.state} (exit {info.exit_code or '?'}), {len(follower.df)} steps logged")
    for finding in diagnose(out) if Path(out).exists() else []:
        print(finding)
    return 0 if info.state == "COMPLETED" else 1
