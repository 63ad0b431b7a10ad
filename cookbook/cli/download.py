"""``cookbook download REPO_ID --output-dir DIR``: token-safe, resumable model download."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "download",
        help="download a model from the Hugging Face Hub (token from HF_TOKEN "
        "or `hf auth login`, never on the command line)",
    )
    p.add_argument("repo_id", help="e.g. meta-llama/Llama-3.3-70B-Instruct")
    p.add_argument("--output-dir", required=True, help="target folder (on the shared filesystem)")
    p.add_argument(
        "--ignore-patterns",
        nargs="*",
        default=None,
        help="glob patterns to skip (default: cookbook.hub.DEFAULT_IGNORE; pass none to keep all)",
    )
    p.add_argument("--allow-patterns", nargs="*", default=None, help="only files matching these globs")
    p.add_argument("--revision", default=None, help="branch, tag or commit")
    p.add_argument("--repo-type", choices=("model", "dataset"), default=None)
    p.add_argument(
        "--etag-timeout",
        type=float,
        default=None,
        help="seconds to wait for file metadata (default HF_HUB_ETAG_TIMEOUT or 10)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be downloaded and its size")
    p.set_defaults(func=_download)


def _download(args: argparse.Namespace) -> int:
    from cookbook import hub  # here, not at module level: `cookbook --help` starts without huggingface_hub

    if args.ignore_patterns is None:
        args.ignore_patterns = list(hub.DEFAULT_IGNORE)
    print(f"HF token: {hub.token_status()}")
    kw = dict(
        revision=args.revision,
        repo_type=args.repo_type,
        allow_patterns=args.allow_patterns,
        ignore_patterns=args.ignore_patterns,
    )
    try:
        if args.dry_run:
            files = hub.plan(args.repo_id, args.output_dir, **kw)
            for f in files:
                print(f"{'get ' if f.will_download else 'have'}  {f.size / 2**20:12.1f} MiB  {f.path}")
            todo = sum(f.size for f in files if f.will_download)
            print(f"{len(files)} files, {todo / 2**30:.2f} GiB to download")
            return 0
        path = hub.download(args.repo_id, args.output_dir, etag_timeout=args.etag_timeout, **kw)
    except hub.HubError as e:
        raise UserError(str(e)) from None
    print(f"downloaded {args.repo_id} to {path} (wrote {hub.REPO_ID_FILE})")
    return 0
