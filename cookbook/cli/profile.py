"""``cookbook profile collect|summary|view``: profiler traces of a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookbook.cli import UserError
from cookbook.cli.files import at_least, output_file, output_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="collect, summarize and view PyTorch profiler traces")
    verbs = p.add_subparsers(dest="verb", required=True)

    c = verbs.add_parser("collect", help="copy some ranks' traces of a run into a view folder")
    c.add_argument("run_dir", type=Path, help="torchtune output_dir / torchtitan dump folder (or above)")
    c.add_argument("--ranks", type=_int_list, default=None, help="e.g. 0,1,7 (default: all)")
    c.add_argument("--iterations", type=_int_list, default=None, help="iteration_N folders (default: latest)")
    c.add_argument("--out", default=None, help="view folder (default: RUN_DIR/profile_view)")
    c.set_defaults(func=_collect)

    s = verbs.add_parser("summary", help="step time, top operators, compute/comm/idle per rank")
    s.add_argument("path", type=Path, help="a trace file, or a folder of traces (latest iteration is used)")
    s.add_argument("--plot", default=None, help="write the summary plot here (PNG/SVG/PDF)")
    s.add_argument("--top", type=int, default=15, help="rows in the operator table")
    s.set_defaults(func=_summary)

    v = verbs.add_parser("view", help="TensorBoard only you can open + ssh tunnel line + Perfetto pointer")
    v.add_argument("dir", type=Path, help="view folder from `profile collect` (or any trace folder)")
    v.add_argument("--logdir", type=Path, default=None, help="TensorBoard logdir (default: DIR)")
    v.add_argument("--local-port", type=int, default=6006, help="port on your laptop in the ssh line")
    v.add_argument(
        "--open-to-all-users",
        action="store_true",
        help="serve TensorBoard on a TCP port of 127.0.0.1 instead of a private Unix socket: it has "
        "no authentication, so EVERY user of this machine can read your runs through it",
    )
    v.add_argument("--port", type=int, default=None, help="TCP port (only with --open-to-all-users)")
    v.add_argument("--login-node", default="LOGIN_NODE")
    v.add_argument("--user", default=None)
    v.add_argument("--no-tensorboard", action="store_true", help="only write the plot and print the pointers")
    v.set_defaults(func=_view)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0,1,7 (got {text!r})") from None


def _collect(args: argparse.Namespace) -> int:
    from cookbook.profiling.collect import collect, find_traces, traces_table

    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such folder (give the run's output_dir or dump folder)")
    out = output_folder(args.run_dir / "profile_view" if args.out is None else args.out, "--out")
    try:
        found = find_traces(args.run_dir)
        copied = collect(args.run_dir, out, ranks=args.ranks, iterations=args.iterations)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from e
    table = traces_table(found)
    print(f"Traces of {args.run_dir} ({len(found)} files, {table['size_mb'].sum():.1f} MB):")
    print(table.drop(columns="path").to_string(index=False))
    print(f"\nCopied {len(copied)} to {out} ({copied['size_mb'].sum():.2f} MB):")
    print(copied[["iteration", "rank", "size_mb", "dest"]].to_string(index=False))
    return 0


def _trace_paths(path: Path) -> list[Path]:
    from cookbook.profiling.collect import find_traces

    if path.is_file():
        return [path]
    try:
        traces = [t for t in find_traces(path) if t.has_steps]
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    if not traces:
        raise UserError(f"no profiler traces with steps under {path}")
    its = [t.iteration for t in traces if t.iteration is not None]
    latest = max(its) if its else None
    chosen = [t for t in traces if t.iteration == latest]
    seen: dict[int | None, Path] = {}
    for t in chosen:  # a copy of the run's traces in a folder of its own: each rank would count twice
        if t.rank in seen:
            raise UserError(
                f"{path}: two traces of rank {t.rank} at iteration {latest} ({seen[t.rank]}, {t.path}); "
                "summarize one run's folder, or collect the ranks first: `cookbook profile collect RUN_DIR`"
            )
        seen[t.rank] = t.path
    return [t.path for t in chosen]


def _summary(args: argparse.Namespace) -> int:
    from cookbook.profiling import memory
    from cookbook.profiling.collect import find_memory_snapshots
    from cookbook.profiling.summarize import plot_summary, summarize

    at_least(args.top, 1, "--top", "rows in the operator table")
    plot = None if args.plot is None else output_file(args.plot, "--plot", plot=True)
    paths = _trace_paths(args.path)
    try:
        summary = summarize(paths, n_top=args.top)
    except ValueError as e:
        raise UserError(str(e)) from e
    print(f"{len(paths)} trace(s): " + ", ".join(p.name for p in paths) + "\n")
    print(summary.render())
    if plot:
        plot_summary(summary).savefig(plot, dpi=110)
        print(f"\nplot: {plot}")
    snaps = find_memory_snapshots(args.path if args.path.is_dir() else args.path.parent)
    if not snaps:
        print("\n" + memory.CPU_NOTE)
    for snap in snaps:
        tl = memory.memory_timeline(memory.load_snapshot(snap))
        print(f"\nmemory snapshot {snap.name}: peak {tl['allocated_bytes'].max() / 2**30:.2f} GiB allocated")
        if plot:
            dest = plot.with_name(f"{plot.stem}_{snap.stem}{plot.suffix}")
            memory.plot_memory_timeline(tl, title=snap.name).savefig(dest, dpi=110)
            print(f"plot: {dest}")
    return 0


def _view(args: argparse.Namespace) -> int:
    from cookbook.profiling.summarize import plot_summary, summarize
    from cookbook.profiling.view import start_tensorboard, viewing_instructions
    from cookbook.sockethttp import stop_on_ctrl_c_or_term

    paths = _trace_paths(args.dir)
    plot = output_file((args.dir if args.dir.is_dir() else args.dir.parent) / "summary.png", "the summary plot")
    try:
        summary = summarize(paths)
    except ValueError as e:
        raise UserError(str(e)) from e
    plot_summary(summary).savefig(plot, dpi=110)
    print(f"summary plot: {plot}")
    if args.no_tensorboard:
        print(viewing_instructions(args.dir, login_node=args.login_node, user=args.user))
        return 0
    if args.port is not None and not args.open_to_all_users:
        raise UserError(
            "--port serves TensorBoard on a TCP port every user of this machine can open; "
            "add --open-to-all-users to mean it, or drop --port (private Unix socket)"
        )
    stop_on_ctrl_c_or_term()
    try:
        tb = start_tensorboard(args.logdir or args.dir, port=args.port, open_to_all_users=args.open_to_all_users)
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        raise UserError(str(e)) from e
    with tb:
        if tb.sock is not None:
            print(f"TensorBoard (scalars of --logdir) serving on the Unix socket {tb.sock} (only you can open it)")
        else:
            print(f"TensorBoard (scalars of --logdir) serving on port {tb.port}: OPEN TO EVERY USER of this machine")
        print(
            viewing_instructions(
                args.dir,
                port=tb.port,
                sock=tb.sock,
                local_port=args.local_port,
                login_node=args.login_node,
                user=args.user,
            ),
            flush=True,
        )
        print("Ctrl-C to stop.")
        try:
            tb.process.wait()
        except KeyboardInterrupt:
            pass
    return 0
