"""``cookbook`` command line: one sub-command per verb, each a thin call into a module.

Every module in this package that defines ``register(subparsers)`` adds its verbs; a verb's
handler is stored as ``func`` and returns the exit code. Errors meant for the user are raised as
:class:`UserError` (exit 2, message only, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import typing


class UserError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage mistake said in one line (the value, the rule, where to read more)
    instead of the usage text and the error; sub-command parsers are of this class too."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="cookbook", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = None  # after `--`: the program's own arguments (`cookbook render script train.py -- ARGS`)
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if passthrough is not None:
        if not hasattr(args, "program_args"):
            parser.error(f"unrecognized arguments: -- {' '.join(passthrough)}")
        args.program_args = passthrough
    # the command line as given (`cookbook data ... --submit` runs it again as a job)
    args.argv = argv if passthrough is None else [*argv, "--", *passthrough]
    from cookbook.profiles import ProfileError  # a profile file with a mistake, wherever profiles are read

    try:
        return int(args.func(args) or 0)
    except (UserError, ProfileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cookbook ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
