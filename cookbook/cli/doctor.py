"""``cookbook doctor``: check Python, packages, Slurm, every node and the HF token before a first job."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.cli.files import at_least, given_path, output_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the environment: Python, torch/torchtune/torchao/torchtitan, Slurm, nodes (--probe), HF token",
    )
    p.add_argument("--partition", default=None, help="partition to check (default: Slurm's default)")
    p.add_argument(
        "--probe",
        action="store_true",
        help="submit a tiny job to every node: GPUs, NCCL/EFA, shared filesystem, free disk",
    )
    p.add_argument("--model-dir", default=None, help="where the model is / will be downloaded (disk checks)")
    p.add_argument(
        "--shared-dir", default=None, help="folder on the shared filesystem for the probe's files (default: out/doctor)"
    )
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for the probe job")
    p.set_defaults(func=_doctor)


def _check_options(args: argparse.Namespace) -> None:
    """The options' values before any check runs: no empty name or path, a finite timeout (UserError)."""
    if args.partition is not None and not args.partition.strip():
        raise UserError(
            f"--partition {args.partition!r}: an empty name names no partition; leave it out for Slurm's default"
        )
    if args.model_dir is not None:
        given_path(args.model_dir, "--model-dir", "folder")
    if args.shared_dir is not None:
        output_folder(args.shared_dir, "--shared-dir")
    at_least(args.timeout, 1, "--timeout", "seconds to wait for the probe job")


def _doctor(args: argparse.Namespace) -> int:
    from cookbook import doctor  # here, not at module level: fast `cookbook --help` (no huggingface_hub)

    _check_options(args)

    checks = doctor.run_checks(
        args.partition,
        probe=args.probe,
        model_dir=args.model_dir,
        shared_dir=args.shared_dir,
        probe_timeout=args.timeout,
    )
    print(doctor.render(checks))
    return 0 if all(c.ok for c in checks) else 1
