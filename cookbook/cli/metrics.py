"""``cookbook metrics LOG`` (table, CSV, plot, diagnosis) and ``cookbook watch JOBID`` (live)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cookbook.cli import UserError
from cookbook.cli.files import at_least, given_path, known_gpu, output_file, training_log

if TYPE_CHECKING:  # pandas is imported by the handlers only: fast `cookbook --help`
    import pandas as pd

    from cookbook.metrics import Finding
    from cookbook.slurm.client import SlurmClient

_SHOW = (
    "step",
    "split",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_second_per_gpu",
    "samples_per_second",
    "memory_gib",
    "tflops",
    "mfu_pct",
    "tokens_seen",
    "rank",
    "gpu_min_sm_mhz",
    "gpu_max_temp_c",
    "gpu_faults",
)
_SHORT = {
    "tokens_per_second_per_gpu": "tok/s/gpu",
    "samples_per_second": "samples/s",
    "memory_gib": "mem_gib",
    "gpu_min_sm_mhz": "min_MHz",
    "gpu_max_temp_c": "max_C",
    "gpu_faults": "held",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metrics", help="parse a training log (or a run / TensorBoard folder) into a table")
    p.add_argument("log", help="log file, or a run folder: its TensorBoard events if any, else its log")
    p.add_argument("--csv", help="write all rows to this CSV file")
    p.add_argument("--plot", help="write loss/throughput/memory/MFU plots to this PNG")
    p.add_argument("--tail", type=int, default=10, help="rows to print (default 10, 0 = all)")
    p.add_argument("--all-ranks", action="store_true", help="keep every rank's row, not only the lowest rank's")
    p.add_argument(
        "--telemetry", action="store_true", help="add what the GPUs did at each step (the run's telemetry, by time)"
    )
    d = p.add_argument_group(
        "derived numbers", "fill tflops / mfu_pct where the log prints none or 0, and add tokens_seen"
    )
    d.add_argument("--gpu", help="GPU kind for MFU (h100, a100, b200, gb200 ...: dense bf16 peak)")
    flops = d.add_mutually_exclusive_group()
    flops.add_argument(
        "--model",
        help="planner model key (llama3_1_8b, mixtral_8x7b, flux_schnell ...): model FLOPs from the planner's formulas",
    )
    flops.add_argument("--flops-per-token", type=float, help="model training FLOPs per logged token")
    d.add_argument(
        "--seq-len", type=int, help="training sequence length for --model's FLOPs (default: the planner's, 2048)"
    )
    d.add_argument("--image-size", type=int, help="FLUX image side in pixels (default: the planner's, 256)")
    d.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPUs in the job: FSDP samples/sec and tokens_seen are totals over them (default 1)",
    )
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


def _check_flops_inputs(args: argparse.Namespace) -> None:
    """The numbers the derived FLOPs and MFU are computed from, each finite and positive (UserError naming the
    flag): a negative one would print negative FLOPs."""
    at_least(args.flops_per_token, 1, "--flops-per-token", "model training FLOPs per logged token")
    at_least(args.seq_len, 1, "--seq-len", "tokens per sample")
    at_least(args.image_size, 16, "--image-size", "FLUX image side in pixels")
    at_least(args.gpus, 1, "--gpus", "GPUs in the job")


def _metrics(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from cookbook.metrics import best_source, parse_log

    path = given_path(args.log, "metrics", "log or folder")
    if not path.exists():
        raise UserError(f"{path} does not exist")
    known_gpu(args.gpu)
    at_least(args.tail, 0, "--tail", "rows to print, 0 = all")
    _check_flops_inputs(args)
    csv = None if args.csv is None else output_file(args.csv, "--csv", example="metrics.csv")
    plot = None if args.plot is None else output_file(args.plot, "--plot", plot=True)
    pool = ThreadPoolExecutor(1)  # diagnose's scan (pyarrow's RE2) releases the GIL: it reads the log beside the parse
    try:
        if path.is_dir():
            kind, path = best_source(path)
            print(f"reading {path} ({'TensorBoard event files' if kind == 'tensorboard' else 'training log'})")
        if path.is_file():
            training_log(path)
        diagnosis = pool.submit(log_diagnosis, path) if path.is_file() else None
        df = parse_log(path, ranks="all" if args.all_ranks else "first")
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    finally:
        pool.shutdown(wait=False)
    if not df.empty and (args.gpu or args.model or args.flops_per_token):
        df = _derive(df, args)
    if not df.empty and args.telemetry and path.is_file():
        from cookbook.metrics.telemetry import join_telemetry, telemetry_from_log

        df = join_telemetry(df, telemetry_from_log(path))
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
    if diagnosis is not None:
        print_log_diagnosis(path, diagnosis.result())
    if csv:
        df.to_csv(csv, index=False)
        print(f"wrote {csv}")
    if plot:
        from cookbook.metrics import plot_runs  # matplotlib: only when a plot is asked for

        plot_runs({path.name: df}, out=plot)
        print(f"wrote {plot}")
    return 0


def _derive(df: pd.DataFrame, args: argparse.Namespace) -> pd.DataFrame:
    """``add_derived`` with FLOPs from ``--model`` (the planner) or ``--flops-per-token``; prints what it assumed."""
    from cookbook.metrics.derived import add_derived, peak_tflops
    from cookbook.planner.estimate import planner_flops

    per_token, per_sample = args.flops_per_token, None
    try:
        if args.model:
            per_token, per_sample = planner_flops(args.model, seq_len=args.seq_len, image_size=args.image_size)
        elif per_token and args.seq_len:
            per_sample = per_token * args.seq_len
        peak = peak_tflops(args.gpu) if args.gpu else None
    except (KeyError, ValueError) as e:
        raise UserError(str(e.args[0] if e.args else e)) from e
    if args.gpus < 1:
        raise UserError("--gpus must be >= 1")
    source = (
        f"{args.model}: {per_sample:.4g} FLOPs/sample, {per_token:.4g} per logged token"
        if args.model
        else f"{per_token:.4g} FLOPs/token"
        if per_token
        else "the log's tflops"
    )
    print(f"derived: {source}" + (f", peak {peak:g} TFLOPs/GPU ({args.gpu})" if peak else "") + f", {args.gpus} GPU(s)")
    out = add_derived(df, flops_per_token=per_token, flops_per_sample=per_sample, gpu=args.gpu, n_gpus=args.gpus)
    if "mfu_pct" not in out or "tflops" not in out:
        print("tflops/mfu_pct need model FLOPs (--model or --flops-per-token) and --gpu", file=sys.stderr)
    return out


def log_diagnosis(log: Path) -> tuple[list[Finding], list[tuple[int, str]]]:
    """``diagnose(log)`` and the log's ``cookbook: `` lines, from one read (what :func:`print_log_diagnosis` prints)."""
    from cookbook.metrics import diagnose

    lines: list[tuple[int, str]] = []
    return diagnose(log, lines_with=lines), lines


def print_log_diagnosis(log: Path, read: tuple[list[Finding], list[tuple[int, str]]] | None = None) -> int:
    """The known failures in ``log`` (``cookbook.metrics.diagnose``), then the pre-flight gate's result and the node
    exclusions it records (``cookbook.analysis.node_health``, from the ``cookbook: `` lines of the same read), each
    as a ``nodes: `` line; a NODE_FAIL the job already excluded says so instead of advising it. ``metrics``,
    ``watch`` and ``diagnose`` print this (``read``: what :func:`log_diagnosis` returned, else read now); returns the
    number of findings and node lines printed."""
    from cookbook.analysis.node_health import node_events, node_report, settled

    findings, lines = read or log_diagnosis(log)
    for finding in settled(findings, node_events(log, lines)):
        print(finding)
    report = node_report(log, lines)
    for line in report:
        print(f"nodes: {line}")
    return len(findings) + len(report)


def _watch(args: argparse.Namespace) -> int:
    from cookbook.metrics import LogFollower
    from cookbook.slurm.client import SlurmClient, SlurmError
    from cookbook.slurm.jobs import check_job_id

    try:
        check_job_id(args.job_id)
    except ValueError as e:
        raise UserError(str(e)) from None
    at_least(args.interval, 0.1, "--interval", "seconds between polls")
    at_least(args.timeout, 0, "--timeout", "seconds to watch; leave it out to watch until the job ends")
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
    nodes_seen: tuple[float, list[str]] = (time.monotonic(), [])
    while True:
        new = follower.poll()
        if len(new):
            print(format_rows(new, header=header), flush=True)
            header = False
            left = follower.eta()
            if left is not None:
                print(f"  ETA {str(left).split('.')[0]}", flush=True)
            if time.monotonic() - nodes_seen[0] > NODE_LINES_EVERY_S:  # the GPUs of each node, now and then
                nodes_seen = (time.monotonic(), _node_lines(out, nodes_seen[1]))
        if info.done:
            break
        if end is not None and time.monotonic() > end:
            print(f"stopped watching; job {args.job_id} is {info.state}")
            return 0
        time.sleep(args.interval)
        try:
            info = client.state(args.job_id)
        except SlurmError as e:  # the controller went away while watching
            raise UserError(e.line) from e
        if info.state != state:
            print(f"job {args.job_id}: {state} -> {info.state}", flush=True)
            state = info.state
    follower.poll()
    print(f"job {args.job_id} ended {info.state} (exit {info.exit_code or '?'}), {len(follower.df)} steps logged")
    if Path(out).exists():
        _ended_report(out, args.job_id, client, info.nodes or None)
    return 0 if info.state == "COMPLETED" else 1


def _ended_report(out: str | Path, job_id: str, client: SlurmClient, nodelist: str | None) -> None:
    """What an ended job's log says: the diagnosis, a hang's culprit, the stragglers, each node's GPUs."""
    from cookbook.analysis.hang import hang_report
    from cookbook.analysis.stragglers import job_hosts, straggler_lines

    print_log_diagnosis(Path(out))
    for line in hang_report(out):  # a hang: which rank and host never joined the collective, its stack
        print(line)
    hosts = job_hosts(out, job_id, client, nodelist=nodelist)
    for line in straggler_lines(str(out), hosts):
        print(line)
    _node_lines(out, [])


NODE_LINES_EVERY_S = 60.0


def _node_lines(log: Path | str, before: list[str]) -> list[str]:
    """Print each node's GPU line (its telemetry: clocks, temperature, a throttle, XID, ECC or NIC error) when
    they changed since ``before``; the lines."""
    from cookbook.metrics.telemetry import node_lines, telemetry_from_log

    lines = node_lines(telemetry_from_log(log))
    if lines != before:
        for line in lines:
            print(f"node {line}", flush=True)
    return lines
