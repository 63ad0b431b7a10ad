"""``cookbook download REPO_ID --output-dir DIR``: token-safe, resumable model download; ``cookbook stage RECIPE
--root DIR``: every Hub repo a recipe's job reads (model, tokenizer, encoders, datasets), downloaded once to
shared storage, and the render settings that point the job at them (then the script sets ``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import argparse

from cookbook.cli import UserError
from cookbook.cli.files import output_folder


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
    s = sub.add_parser(
        "stage",
        help="download every Hub repo a recipe's job reads (model, tokenizer, encoders, datasets) to shared "
        "storage once, so no rank fetches them at start-up; prints the render settings that use them",
    )
    s.add_argument("recipe", help="a recipe of `cookbook recipes` (or tune:/titan: of your own)")
    s.add_argument("--root", required=True, help="a folder every node reads, e.g. /shared/hf")
    s.add_argument("--profile", default="generic", help="the cluster profile you render for")
    s.add_argument("--nodes", type=int, default=None)
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--dry-run", action="store_true", help="say what would be downloaded where; fetch nothing")
    s.set_defaults(func=_stage)


def _download(args: argparse.Namespace) -> int:
    from cookbook import hub  # here, not at module level: `cookbook --help` starts without huggingface_hub

    output_folder(args.output_dir, "--output-dir")
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


def _stage(args: argparse.Namespace) -> int:
    import shlex

    from cookbook.recipes import get_recipe
    from cookbook.spec import SpecError, make_spec, parse_overrides

    output_folder(args.root, "--root")
    try:
        spec = make_spec(args.recipe, args.profile, nodes=args.nodes, overrides=parse_overrides(args.overrides))
        fetches = get_recipe(spec.recipe).stage_fetches(spec)
    except (SpecError, KeyError, ValueError) as e:
        raise UserError(str(e).strip("'\"")) from None
    if not fetches:
        print(f"{spec.recipe} on {spec.profile} reads nothing from the Hub: nothing to stage")
        return 0
    if not args.dry_run:
        from cookbook import hub

        print(f"HF token: {hub.token_status()}")
    for i, f in enumerate(fetches, 1):
        print(f"[{i}/{len(fetches)}] {f.repo_type} {f.repo_id} -> {f.folder(args.root)}", flush=True)
        if args.dry_run:
            continue
        try:
            hub.download(f.repo_id, f.folder(args.root), repo_type=f.repo_type, allow_patterns=list(f.allow) or None)
        except hub.HubError as e:
            raise UserError(f"{f.repo_id}: {e}") from None
    sets = " ".join(f"--set {shlex.quote(f'{f.key}={f.local(args.root)}')}" for f in fetches)
    nodes = f" --nodes {spec.nodes}" if args.nodes else ""
    print(
        f"{'would stage' if args.dry_run else 'staged'} {len(fetches)} repos. Render with them (the script then sets "
        f"HF_HUB_OFFLINE=1):\n  cookbook render {spec.recipe} --profile {spec.profile}{nodes} {sets} -o JOB.sbatch"
    )
    return 0
