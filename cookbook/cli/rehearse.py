"""``cookbook rehearse SCRIPT``: run a rendered script with its launcher swapped for a check on every node."""

from __future__ import annotations

import argparse
import json
import os

from cookbook.cli import UserError
from cookbook.cli.files import output_file


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "rehearse",
        help="run a script's allocation with a check in the launcher's place; "
        "per-node table, exit 0 only when every node passes",
    )
    r.add_argument("script", help="an sbatch script written by `cookbook render` (or from slurm-recipes/)")
    r.add_argument("--timeout", type=float, default=900, help="seconds to wait for the job (queue included)")
    r.add_argument("--time-limit", default="00:05:00", help="the rehearsal job's time limit")
    r.add_argument("--json", metavar="FILE", help="also write every node's report as JSON")
    r.set_defaults(func=_rehearse)


def _rehearse(args: argparse.Namespace) -> int:
    # imported here: the CLI starts fast for every other verb
    from cookbook.rehearsal import RehearsalError, rehearse
    from cookbook.slurm.client import JobTimeout, SlurmClient, SlurmError

    if args.json is not None:
        output_file(args.json, "--json", example="rehearsal.json")
    try:
        report = rehearse(args.script, SlurmClient(dict(os.environ)), timeout=args.timeout, time_limit=args.time_limit)
    except RehearsalError as e:
        raise UserError(str(e)) from None
    except JobTimeout as e:
        raise UserError(
            f"the rehearsal job did not end within {args.timeout:.0f} s ({e}); is the queue busy?"
        ) from None
    except SlurmError as e:
        raise UserError(" ".join((e.stderr or str(e)).split())) from None
    except OSError as e:  # the script's folder (where the rehearsal writes its reports) not writable
        raise UserError(f"cannot write the rehearsal's files: {e.strerror}: {e.filename}") from None
    print(report.table())
    if args.json:
        data = {"ok": report.ok, "job_id": report.job_id, "problems": report.problems}
        try:
            with open(args.json, "w") as f:
                json.dump({**data, "nodes": [dict(n.facts) for n in report.nodes]}, f, indent=1)
        except OSError as e:
            raise UserError(f"--json {args.json}: cannot write it ({e.strerror})") from None
    return 0 if report.ok else 1
