"""``cookbook plan RECIPE``: will it fit, how fast, how long -- before the job waits in the queue."""

from __future__ import annotations

import argparse
from typing import Any

from cookbook.cli import UserError
from cookbook.cli.files import at_least
from cookbook.planner import GPUS, RECIPES, plan, suggest
from cookbook.planner.recovery import recovery_text
from cookbook.spec import GPU_DEFAULTS, SpecError, parse_overrides, time_seconds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="estimate per-GPU memory, throughput and time for a recipe",
        description="Exit 0 when the plan fits in GPU memory, 1 when it does not, 2 on bad input.",
    )
    p.add_argument("recipe", help=f"one of: {', '.join(sorted(RECIPES))}")
    p.add_argument("--nodes", type=int, default=None, help="nodes (default: the recipe's)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the recipe's)")
    p.add_argument("--gpu", choices=sorted(GPUS), default=None, help="GPU kind (default: the recipe's)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting (micro_batch=4, seq_len=4096, checkpointing=selective, tp=8, lora_rank=16,"
        " fsdp_cpu_offload=true ...) or a recipe config key (batch_size=4, ...); repeatable",
    )
    p.add_argument("--dataset-tokens", type=float, default=None, help="tokens per epoch, for epoch time")
    p.add_argument("--dataset-samples", type=float, default=None, help="samples (images) per epoch")
    p.add_argument("--suggest", action="store_true", help="also list job shapes that fit with 10%% free")
    p.add_argument("--max-nodes", type=int, default=32, help="largest node count --suggest tries")
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        help="hours the job runs, for the spare nodes suggested (default: a GPU profile's time limit, "
        f"{GPU_DEFAULTS.time})",
    )
    p.set_defaults(func=_plan)


def _check_numbers(args: argparse.Namespace) -> None:
    """The plan's own numbers, each finite: hours >= 0, dataset sizes >= 1, --max-nodes >= 1 (UserError naming
    the flag)."""
    at_least(args.hours, 0, "--hours", "hours the job runs; leave it out for the time limit")
    at_least(args.dataset_tokens, 1, "--dataset-tokens", "tokens per epoch")
    at_least(args.dataset_samples, 1, "--dataset-samples", "samples per epoch")
    at_least(args.max_nodes, 1, "--max-nodes", "the largest node count --suggest tries")


def _plan(args: argparse.Namespace) -> int:
    if args.recipe not in RECIPES:
        raise UserError(f"unknown recipe {args.recipe!r}; known: {', '.join(sorted(RECIPES))}")
    _check_numbers(args)
    try:
        overrides: dict[str, Any] = parse_overrides(args.overrides)  # planner settings: str or number
    except SpecError as e:
        raise UserError(e.problems[0]) from e
    try:
        result = plan(
            args.recipe,
            args.nodes,
            args.gpus_per_node,
            args.gpu,
            dataset_tokens=args.dataset_tokens,
            dataset_samples=args.dataset_samples,
            **overrides,
        )
        print(result.render())
        hours = time_seconds(GPU_DEFAULTS.time) / 3600 if args.hours is None else args.hours
        print()
        print(recovery_text(result, hours, overrides))
        if args.suggest:
            print("\nsuggestions (fewest nodes, then fastest):")
            found = suggest(
                args.recipe,
                args.gpus_per_node,
                args.gpu,
                max_nodes=args.max_nodes,
                **{k: v for k, v in overrides.items() if k not in ("micro_batch", "tp", "checkpointing")},
            )
            print("\n".join(f"  {s.describe()}" for s in found) or "  nothing fits within --max-nodes")
    except (KeyError, ValueError) as e:
        raise UserError(str(e.args[0]) if e.args else str(e)) from e
    return 0 if result.fits else 1
