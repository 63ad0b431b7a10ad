"""``cookbook explain RUN``: why a run's MFU is what it is, evidence ranked by likely cost, each with a fix."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cookbook.cli import UserError
from cookbook.cli.files import given_path, known_gpu, output_file, training_log

if TYPE_CHECKING:
    from cookbook.analysis.goodput import Attempt


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="measured MFU vs the planner's, and the likely causes (NCCL on sockets, "
        "data-loader stalls, stragglers, AC, scaling) with their fixes",
    )
    p.add_argument("run", help="run folder (with job.json), the job's log, or a Slurm job id")
    p.add_argument("--log", help="the job's log when Slurm no longer knows it")
    p.add_argument("--recipe", help="recipe, for the planner's expectation (default: the run's)")
    p.add_argument("--gpu", help="GPU kind (h100, h100-500w, a100-80 ...): the planner's expectation")
    p.add_argument("--nodes", type=int, help="nodes in the job (default: the run's script)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node in the job (default: the run's script)")
    p.add_argument("--node-gpus", type=int, help="GPUs each node has (flags a job using fewer)")
    p.add_argument(
        "--checkpointing", choices=("none", "selective", "full"), help="the run's AC mode if the log does not say"
    )
    p.add_argument("--baseline", help="log of the 1-node run of the same recipe, for scaling efficiency")
    p.add_argument("--traces", nargs="+", help="profiler traces of the run's ranks (per-rank compute vs wait)")
    p.add_argument(
        "--hosts",
        help="the job's nodes in order, comma-separated, to name a straggler's host "
        "(default: the node list the job's log printed, or Slurm's record of the job)",
    )
    p.add_argument(
        "--no-fabric",
        action="store_true",
        help="the cluster has no InfiniBand/EFA (TCP is expected; default: from the run's profile)",
    )
    p.add_argument(
        "--run-dir", help="the job's RUN_DIR, for the nodes' GPU/NIC telemetry (default: job.json's, or the log's)"
    )
    p.add_argument("--plot", help="write the evidence chart to this PNG")
    p.set_defaults(func=_explain)


def _explain(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cookbook.analysis.explain import expects_fabric, explain_log, explain_plot
    from cookbook.analysis.goodput import read_incidents, resolve_run
    from cookbook.analysis.stragglers import job_hosts
    from cookbook.gpus import UnknownGpu
    from cookbook.metrics.telemetry import read_telemetry, telemetry_from_log
    from cookbook.slurm.client import SlurmError

    known_gpu(args.gpu)
    given_path(args.run, "explain", "log or folder")
    plot = None if args.plot is None else output_file(args.plot, "--plot", plot=True)
    try:
        ref = resolve_run(args.run, args.log)
    except (FileNotFoundError, ValueError, SlurmError) as e:
        raise UserError(str(e)) from e
    if not ref.log.exists():
        raise UserError(f"{ref.log} does not exist")
    training_log(ref.log)
    _check_options(args)
    script = Path(args.run) / "job.sbatch" if Path(args.run).is_dir() else None
    on_gpus = bool(ref.gpus_per_node or args.gpus_per_node or args.gpu)
    hosts = args.hosts.split(",") if args.hosts else job_hosts(ref.log, ref.job_id)
    run_dir = args.run_dir or ref.run_dir  # else the log names the telemetry folder
    incidents = read_incidents(run_dir, ref.job_id)
    attempts = _attempts(ref.job_id) if incidents else []  # a spare's standing-by time needs Slurm's starts
    try:
        report = explain_log(
            ref.log,
            recipe=args.recipe or ref.recipe,
            gpu=args.gpu,
            nodes=args.nodes or ref.nodes,
            gpus_per_node=args.gpus_per_node or ref.gpus_per_node,
            node_gpus=args.node_gpus,
            expects_fabric=not args.no_fabric and expects_fabric(ref.profile, on_gpus),
            script=script,
            procs_per_node=args.gpus_per_node or ref.gpus_per_node,
            checkpointing=args.checkpointing,
            baseline_log=args.baseline,
            hosts=hosts,
            traces=args.traces,
            telemetry=read_telemetry(run_dir)
            if (run_dir := args.run_dir or ref.run_dir)
            else telemetry_from_log(ref.log),
            incidents=incidents,
            attempts=attempts,
        )
    except (ValueError, UnknownGpu) as e:  # UnknownGpu: a kind the planner has no MFU for (l4, l40s ...)
        raise UserError(str(e)) from e
    print(report.render())
    if plot:
        explain_plot(report).savefig(plot, dpi=100)
        print(f"plot: {plot}")
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """The counts at least 1, the baseline log and the traces existing: one line each, else nothing."""
    from pathlib import Path

    for option in ("nodes", "gpus_per_node", "node_gpus"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UserError(f"--{option.replace('_', '-')} must be >= 1")
    for path in [args.baseline, *(args.traces or [])]:
        if path and not Path(path).exists():
            raise UserError(f"{path} does not exist")


def _attempts(job_id: str | None) -> list[Attempt]:
    """The job's starts from Slurm's accounting, or none where Slurm cannot say (a copied log, no controller)."""
    from cookbook.analysis.goodput import slurm_attempts
    from cookbook.slurm.client import SlurmClient, SlurmError

    try:
        return slurm_attempts(SlurmClient(), job_id) if job_id else []
    except SlurmError:
        return []
