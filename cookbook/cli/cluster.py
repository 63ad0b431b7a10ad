"""``cookbook cluster up|down|status|env``: the embedded local Slurm cluster.

``up`` with no flags starts the shared CPU cluster ``cookbook``; ``up --gpus-per-node 8`` starts the preset
``gpu`` (fake GPUs, 192 claimed CPUs per node, its own subnet and ports: see ``cookbook.local.cluster``)
beside it. ``--name`` picks the instance for every verb.
"""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.local.cluster import ClusterConfig, ClusterError, LocalCluster


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="start/stop the embedded local Slurm cluster")
    verbs = p.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="start it (idempotent)")
    up.add_argument("--nodes", type=int, default=None, help="compute nodes (default 2)")
    up.add_argument("--cpus-per-node", type=int, default=None, help="CPUs each node claims")
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="fake GPUs per node (gres/gpu); alone it starts the preset `gpu` beside `cookbook`",
    )
    up.add_argument(
        "--name",
        default=None,
        help="instance name (state under .cluster/NAME); default cookbook, or gpu with --gpus-per-node",
    )
    up.set_defaults(func=_up)
    down = verbs.add_parser("down", help="stop every daemon and job it started")
    down.add_argument("--name", default="cookbook")
    down.add_argument("--purge", action="store_true", help="also delete its state folder")
    down.set_defaults(func=_down)
    for verb, fn, text in (
        ("status", _status, "daemons and node states"),
        ("env", _env, "print the `export SLURM_CONF=...` line"),
    ):
        q = verbs.add_parser(verb, help=text)
        q.add_argument("--name", default="cookbook")
        q.set_defaults(func=fn)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    gpus = getattr(args, "gpus_per_node", None)
    name = args.name or ("gpu" if gpus else "cookbook")
    counts = {
        "nodes": getattr(args, "nodes", None),
        "cpus_per_node": getattr(args, "cpus_per_node", None),
        "gpus_per_node": gpus,
    }
    for flag, value in counts.items():
        if value is not None and (value < 0 or (value == 0 and flag != "gpus_per_node")):
            raise UserError(f"--{flag.replace('_', '-')} must be a positive number, not {value}")
    return LocalCluster(ClusterConfig.named(name, **counts))


def _up(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    try:
        status = cluster.up()
    except ClusterError as e:
        raise UserError(str(e)) from e
    print(status.render())
    name = "" if cluster.cfg.name == "cookbook" else f" --name {cluster.cfg.name}"
    print(f"\nready. Use:  {cluster.env_line()}    (or: eval $(cookbook cluster env{name}))")
    return 0


def _down(args: argparse.Namespace) -> int:
    _cluster(args).down(purge=args.purge)
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _cluster(args).status()
    print(status.render())
    return 0 if status.up else 1


def _env(args: argparse.Namespace) -> int:
    print(_cluster(args).env_line())
    return 0
