"""``cookbook outputs RUN``: where a run's weights are, their format and size, and how to serve them."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.cli.files import given_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "outputs", help="a run's weights: where, format, size (LoRA: the adapter's), vLLM/TGI/transformers lines"
    )
    p.add_argument("run", help="the folder `submit` made (with job.json) or the run folder (RUN_DIR)")
    p.set_defaults(func=_outputs)


def _outputs(args: argparse.Namespace) -> int:
    from cookbook.use.outputs import NoOutputs, describe

    given_path(args.run, "outputs", "folder")

    try:
        print(describe(args.run).render())
    except NoOutputs as e:
        raise UserError(str(e)) from None
    return 0
