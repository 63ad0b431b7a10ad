"""``cookbook profiles``: the cluster profiles this machine knows (built in, yours, the project's), and
``cookbook profiles show NAME``: one profile resolved (``extends`` applied) in the format of a profile file."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from cookbook.cli import UserError
from cookbook.profiles import ProfileError, get_profile, origins, profile_files, profiles, to_data, user_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profiles",
        help="list the cluster profiles (built in, ~/.config/cookbook/profiles/*.yaml, ./cookbook-profiles.yaml)",
    )
    p.set_defaults(func=_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="one profile, resolved, as a profile file writes it")
    show.add_argument("name", metavar="NAME")
    show.set_defaults(func=_show)


def _where(path: Path, builtin: bool) -> str:
    if builtin:
        return "built in"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path).replace(str(Path.home()), "~", 1)


def _list(args: argparse.Namespace) -> int:
    try:
        known, where = profiles(), origins()
    except ProfileError as e:
        raise UserError(str(e)) from e
    rows = [("NAME", "GPU", "FABRIC", "FROM", "DESCRIPTION")]
    for name, prof in known.items():
        origin = where[name]
        source = _where(origin.file, origin.builtin) + (f" (extends {origin.extends})" if origin.extends else "")
        rows.append((name, prof.gpu or "-", prof.fabric or "-", source, prof.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
    read = [_where(p, b) for p, b in profile_files() if not b]
    mine = ", ".join(read) if read else "none of yours"
    print(f"\nfiles read: {mine}; yours go in {user_dir()}/*.yaml or ./cookbook-profiles.yaml")
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        prof = get_profile(args.name)
        origin = origins()[args.name]
    except ProfileError as e:
        raise UserError(str(e)) from e
    ext = f", extends {origin.extends}" if origin.extends else ""
    print(f"# {_where(origin.file, origin.builtin)}: {origin.file}:{origin.line}{ext} (shown resolved)")
    print(yaml.safe_dump({prof.name: to_data(prof)}, sort_keys=False, width=120, allow_unicode=True), end="")
    return 0
