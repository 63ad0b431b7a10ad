"""``cookbook diagnose RUN``: known failures in a job's log, what the log says about its nodes (the pre-flight gate,
NODE_FAIL, what was excluded and how: the report ``metrics`` and ``watch`` print), and which rank and host hung,
where."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookbook.cli import UserError
from cookbook.cli.files import given_path, training_log


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="known failures in a job's log, its nodes (pre-flight gate, exclusions); on a hang, the rank and host "
        "that never joined a collective",
    )
    p.add_argument("run", help="the job's log, its run folder (RUN_DIR), a job folder (job.json) or a Slurm job id")
    p.set_defaults(func=_diagnose)


def _diagnose(args: argparse.Namespace) -> int:
    from cookbook.analysis.hang import hang_report
    from cookbook.cli.metrics import print_log_diagnosis

    target = given_path(args.run, "diagnose", "log or folder")
    log: Path | None = target if target.is_file() else None
    if target.is_dir() and (target / "job.json").is_file():
        from cookbook.slurm.record import JobRecord

        log = Path(JobRecord.load(target).log)
    elif not target.exists() and args.run.isdigit():
        from cookbook.slurm.client import SlurmClient, SlurmError

        try:
            out = SlurmClient().output_path(args.run)
        except SlurmError as e:
            raise UserError(str(e)) from e
        if out is None:
            raise UserError(f"Slurm no longer knows job {args.run}'s output file: pass the log or the run folder")
        log = Path(out)
    elif not target.exists():
        raise UserError(f"{args.run}: no such log, folder or job")
    if log is not None and log.is_file():
        training_log(log)
    printed = print_log_diagnosis(log) if log is not None and log.is_file() else 0
    source = target if target.exists() else log
    hang = hang_report(source) if source is not None else []
    for line in hang:
        print(line)
    if not printed and not hang:
        print(f"{args.run}: no known failure found")
    return 0
