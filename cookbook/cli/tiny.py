"""``cookbook tiny [--root DIR]``: build (or reuse) the deterministic tiny assets for local-cpu runs."""

from __future__ import annotations

import argparse
import time

from cookbook.cli import UserError
from cookbook.cli.files import output_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tiny", help="build the tiny model, tokenizers and datasets for local-cpu runs")
    p.add_argument(
        "--root",
        default=None,
        help="where to put them: a new or empty folder, or an earlier build (default: .cache/tiny)",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if a current copy exists")
    p.set_defaults(func=_tiny)


def _tiny(args: argparse.Namespace) -> int:
    from cookbook.local.assets.tiny import TinyRootTaken, default_root, ensure_tiny_assets

    root = output_folder(args.root, "--root") if args.root is not None else default_root()
    start = time.monotonic()
    try:
        assets = ensure_tiny_assets(root, force=args.force)
    except TinyRootTaken as e:
        raise UserError(f"--root {e}") from None
    except PermissionError as e:
        raise UserError(f"cannot write tiny assets under {root}: {e}") from e
    print(f"tiny assets in {assets.root} ({time.monotonic() - start:.1f} s)")
    for name in (
        "llama_dir",
        "tokenizer_model",
        "special_tokens",
        "chat_sharegpt",
        "chat_openai",
        "alpaca",
        "hf_tokenizer_dir",
        "c4_dir",
        "flux_dir",
        "flux_autoencoder",
        "flux_t5_dir",
        "flux_clip_dir",
        "cc12m_dir",
    ):
        print(f"  {name:17} {getattr(assets, name)}")
    return 0
