"""``cookbook cluster up|down|status|env``: the embedded local Slurm cluster."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.slurm.local_cluster import ClusterConfig, ClusterError, LocalCluster


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="start/stop the embedded local Slurm cluster")
    verbs = p.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="start it (idempotent)")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--cpus-per-node", type=int, default=None)
    up.add_argument("--name", default="cookbook", help="instance name (state under .cluster/NAME)")
    up.set_defaults(func=_up)
    down = verbs.add_parser("down", help="stop every daemon and job it started")
    down.add_argument("--name", default="cookbook")
    down.add_argument("--purge", action="store_true", help="also delete its state folder")
    down.set_defaults(func=_down)
    for verb, fn, text in (("status", _status, "daemons and node states"),
                           ("env", _env, "print the `export SLURM_CONF=...` line")):
        q = verbs.add_parser(verb, help=text)
        q.add_argument("--name", default="cookbook")
        q.set_defaults(func=fn)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    kw = {"name": args.name}
    if getattr(args, "nodes", None):
        kw["nodes"] = args.nodes
    if getattr(args, "cpus_per_node", None):
        kw["cpus_per_node"] = args.cpus_per_node
    return LocalCluster(ClusterConfig(**kw))


def _up(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    try:
        status = cluster.up()
    except ClusterError as e:
        raise UserError(str(e)) from e
    print(status.render())
    print(f"\nready. Use:  {cluster.env_line()}    (or: eval $(cookbook cluster env))")
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
