"""Job lifecycle verbs: ``cookbook status``, ``list``, ``logs``, ``cancel``, ``requeue``.

Each takes Slurm job ids; an unknown id, a Slurm that does not answer or another user's job is one
line and exit 2. ``list`` shows this user's jobs started from cookbook scripts, with their progress.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cookbook.cli import UserError
from cookbook.cli.files import at_least
from cookbook.slurm.client import JobTimeout, SlurmClient, SlurmError
from cookbook.slurm.jobs import JobView, describe, require_own, user_jobs


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="state, nodes, recipe and progress of jobs (default: your cookbook jobs)")
    s.add_argument("job_ids", nargs="*", metavar="JOBID")
    s.set_defaults(func=_status)
    ls = sub.add_parser("list", help="your cookbook jobs Slurm still shows: recipe, state, step, loss, ETA")
    ls.add_argument("--all", action="store_true", help="every job of yours, not only cookbook scripts")
    ls.set_defaults(func=_list)
    lg = sub.add_parser("logs", help="print a job's log (-f: follow it until the job ends)")
    lg.add_argument("job_id", metavar="JOBID")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    lg.add_argument("--rank", type=int, default=None, help="only the lines of this (global) rank")
    lg.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    lg.add_argument("--interval", type=float, default=1.0, help="seconds between polls with -f")
    lg.set_defaults(func=_logs)
    c = sub.add_parser("cancel", help="cancel jobs of yours (scancel)")
    c.add_argument("job_ids", nargs="+", metavar="JOBID")
    c.add_argument("--signal", default=None, help="send this signal instead (e.g. USR1: save and requeue)")
    c.set_defaults(func=_cancel)
    r = sub.add_parser("requeue", help="put jobs of yours back in the queue (scontrol requeue); they resume")
    r.add_argument("job_ids", nargs="+", metavar="JOBID")
    r.add_argument("--now", action="store_true", help="start again at once (Slurm holds a requeued job ~2 min)")
    r.set_defaults(func=_requeue)


def _views(client: SlurmClient, job_ids: list[str]) -> list[JobView]:
    try:
        return [describe(client, j) for j in job_ids]
    except SlurmError as e:
        raise UserError(e.line) from e
    except ValueError as e:
        raise UserError(str(e)) from e


def progress(view: JobView) -> tuple[str, str, str]:
    """(last step, its loss, ETA) from the job's log; '-' where the log does not say."""
    if view.log is None or not view.log.is_file():
        return "-", "-", "-"
    from cookbook.metrics import eta, parse_log  # pandas: only when a log is read

    df = parse_log(view.log)
    train = df[df["split"].eq("train")] if "split" in df else df
    if train.empty:
        return "-", "-", "-"
    left = eta(train) if not view.done else None
    return str(int(train["step"].iloc[-1])), f"{train['loss'].iloc[-1]:.4g}", str(left).split(".")[0] if left else "-"


def _table(views: list[JobView]) -> str:
    rows = [("JOBID", "NAME", "RECIPE", "PROFILE", "STATE", "TIME", "NODES", "STEP", "LOSS", "ETA")]
    for v in views:
        rows.append(
            (v.job_id, v.name, v.recipe or "-", v.profile or "-", v.state, v.elapsed or "-", v.nodes or "-")
            + progress(v)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _status(args: argparse.Namespace) -> int:
    client = SlurmClient()
    if not args.job_ids:
        return _list(argparse.Namespace(all=False))
    print(_table(_views(client, args.job_ids)))
    return 0


def _list(args: argparse.Namespace) -> int:
    try:
        views = user_jobs(SlurmClient(), cookbook_only=not args.all)
    except SlurmError as e:
        raise UserError(e.line) from e
    print(_table(views) if views else "no cookbook jobs of yours in Slurm's queue (--all: every job of yours)")
    return 0


def _rank_lines(text: str, rank: int | None) -> str:
    if rank is None:
        return text
    from cookbook.metrics.formats import prefix

    return "".join(ln for ln in text.splitlines(keepends=True) if prefix(ln)[1] == rank)


def _logs(args: argparse.Namespace) -> int:
    at_least(args.tail, 0, "--tail", "the last N lines, 0 = all")
    at_least(args.rank, 0, "--rank", "a global rank, 0 for the first")
    at_least(args.interval, 0.1, "--interval", "seconds between polls with -f")
    client = SlurmClient()
    (view,) = _views(client, [args.job_id])
    if view.log is None:
        raise UserError(f"job {view.job_id}'s log is not known any more: look in the folder it ran from")
    if not view.log.exists() and view.done:
        raise UserError(f"job {view.job_id} ({view.state}) wrote no log at {view.log}")
    try:
        data = view.log.read_bytes()  # what is printed now; -f goes on from its end (no line lost between)
    except FileNotFoundError:
        data = b""
    cut = data.rfind(b"\n") + 1 if args.follow else len(data)  # -f: an unfinished last line waits
    lines = data[:cut].decode("utf-8", "replace").splitlines(keepends=True)
    sys.stdout.write(_rank_lines("".join(lines[-args.tail :] if args.tail else lines), args.rank))
    if not args.follow:
        return 0
    offset, partial = len(data), data[cut:]
    while True:
        try:
            done = client.state(view.job_id).done  # read before the bytes: nothing written after is missed
        except SlurmError as e:  # the controller went away while following
            raise UserError(e.line) from e
        offset, partial = _print_new(view.log, offset, partial, args.rank)
        if done:
            sys.stdout.write(_rank_lines(partial.decode("utf-8", "replace"), args.rank))
            return 0
        time.sleep(args.interval)


def _print_new(log: Path, offset: int, partial: bytes, rank: int | None) -> tuple[int, bytes]:
    """Print the whole lines written to ``log`` since ``offset``; (new offset, the unfinished last line)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return offset, partial
    data = partial + data
    cut = data.rfind(b"\n") + 1
    sys.stdout.write(_rank_lines(data[:cut].decode("utf-8", "replace"), rank))
    sys.stdout.flush()
    return offset + len(data) - len(partial), data[cut:]


def _change(args: argparse.Namespace, verb: str) -> int:
    client = SlurmClient()
    views = _views(client, args.job_ids)
    try:
        for v in views:
            require_own(v)
        for v in views:
            if verb == "cancel":
                client.cancel(v.job_id, signal=args.signal)
            else:
                client.requeue(v.job_id)
                if args.now:  # Slurm sets a requeued job's BeginTime a while ahead; bring it forward
                    client.release_requeued(v.job_id)
            done = f"sent {args.signal}" if args.signal else {"cancel": "cancelled", "requeue": "requeued"}[verb]
            print(f"job {v.job_id} ({v.name}): {done}")
    except SlurmError as e:
        raise UserError(e.line) from e
    except JobTimeout as e:
        raise UserError(str(e)) from e
    return 0


def _cancel(args: argparse.Namespace) -> int:
    return _change(args, "cancel")


def _requeue(args: argparse.Namespace) -> int:
    args.signal = None
    code = _change(args, "requeue")
    if not args.now:
        print("Slurm holds a requeued job about 2 minutes before it may start (--now: at once)")
    return code
