"""``cookbook goodput RUN|JOBID``: where a run's allocated GPU-hours went, across its requeues."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.cli.files import at_least, given_path, known_gpu, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "goodput",
        help="goodput ledger of a run: queue, start-up, productive, redone, checkpoints, lost time; GPU-hours and cost",
    )
    p.add_argument("run", help="run folder (with job.json), the job's log, or a Slurm job id")
    p.add_argument("--log", help="the job's log when Slurm no longer knows it")
    p.add_argument(
        "--gpu", help="GPU kind, for the price and the planner's forecast (default: the run's profile's, e.g. h100)"
    )
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        default=None,
        help="price used for the cost (default: the run's profile's price, else a rough list price for --gpu)",
    )
    p.add_argument("--csv", help="write the ledger table to this CSV file")
    p.add_argument("--plot", help="write the ledger bar chart to this PNG")
    p.set_defaults(func=_goodput)


def _goodput(args: argparse.Namespace) -> int:
    from cookbook.analysis.goodput import resolve_run, run_ledger
    from cookbook.slurm.client import SlurmError

    given_path(args.run, "goodput", "log or folder")
    at_least(args.price_per_gpu_hour, 0, "--price-per-gpu-hour", "the price of one GPU-hour")
    known_gpu(args.gpu)
    csv = None if args.csv is None else output_file(args.csv, "--csv", example="goodput.csv")
    plot = None if args.plot is None else output_file(args.plot, "--plot", plot=True)
    try:
        ref = resolve_run(args.run, args.log)
        ledger = run_ledger(ref, gpu=args.gpu, price=args.price_per_gpu_hour)
    except (FileNotFoundError, ValueError, SlurmError) as e:
        raise UserError(str(e)) from e
    print(ledger.render())
    if csv:
        ledger.table().to_csv(csv, index=False)
        print(f"table: {csv}")
    if plot:
        ledger.plot().savefig(plot, dpi=100)
        print(f"plot: {plot}")
    return 0
