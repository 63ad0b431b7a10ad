"""``cookbook data check|c4|cc12m|layout``: check a dataset with the model's tokenizer; torchtitan layouts."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookbook.cli import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="check a dataset with the model's real tokenizer; torchtitan data layouts")
    verbs = p.add_subparsers(dest="verb", required=True)

    c = verbs.add_parser(
        "check", help="validate rows, tokenize a sample via torchtune's builder, print the dataset block for the recipe"
    )
    c.add_argument("source", help="local .json/.jsonl/.parquet/.csv file or a Hub dataset name")
    c.add_argument("--style", required=True, choices=("sharegpt", "openai", "alpaca", "instruct", "text"))
    c.add_argument(
        "--column-map",
        nargs="*",
        default=[],
        metavar="KEY=COLUMN",
        help="torchtune name=your column, e.g. conversations=dialog or output=answer",
    )
    c.add_argument("--model-dir", help="model folder (original/tokenizer.model, tokenizer.json, config.json)")
    c.add_argument("--tokenizer", help="tokenizer file (default MODEL_DIR/original/tokenizer.model)")
    c.add_argument("--special-tokens", help="special_tokens_path (default MODEL_DIR/tokenizer.json)")
    c.add_argument("--tokenizer-component", default="torchtune.models.llama3.llama3_tokenizer")
    c.add_argument("--max-seq-len", type=int, default=2048)
    c.add_argument("--sample", type=int, default=512, help="rows to tokenize")
    c.add_argument("--split", default="train")
    c.add_argument("--name", default=None, help="Hub dataset config name")
    c.add_argument("--packed", action="store_true", help="write packed: true (and tokenizer.max_seq_len)")
    c.add_argument("--plot", type=Path, help="save the token-length histogram here (.png/.svg)")
    c.add_argument("--format", choices=("yaml", "overrides"), default="yaml")
    c.set_defaults(func=_check)

    w = verbs.add_parser("c4", help="lay out text/jsonl files as a local C4 `en` folder for torchtitan")
    w.add_argument("files", nargs="+", type=Path)
    w.add_argument("--output-dir", required=True, type=Path)
    w.add_argument("--column", default="text")
    w.set_defaults(func=_c4)

    cc = verbs.add_parser("cc12m", help="write image+caption pairs (IMG.jpg/png + IMG.txt) as webdataset shards")
    cc.add_argument("images", type=Path, help="folder with images and same-named .txt captions")
    cc.add_argument("--output-dir", required=True, type=Path)
    cc.add_argument("--shard-size", type=int, default=1000)
    cc.set_defaults(func=_cc12m)

    lay = verbs.add_parser("layout", help="check a torchtitan data folder as its loader reads it")
    lay.add_argument("kind", choices=("c4", "cc12m"))
    lay.add_argument("path", type=Path)
    lay.add_argument("--output-size", type=int, default=256, help="cc12m: training image size")
    lay.set_defaults(func=_layout)


def _column_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--column-map wants KEY=COLUMN, got {item!r}")
        out[key] = value
    return out


def _check(args: argparse.Namespace) -> int:
    from cookbook.data import DataError, DatasetSpec, TokenizerSpec, check_dataset, dataset_overrides, dataset_yaml
    from cookbook.data.recipe import overrides_text

    try:
        spec = DatasetSpec(args.source, args.style, _column_map(args.column_map), args.split, args.name)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.tokenizer:
        tok = TokenizerSpec(args.tokenizer, args.special_tokens, args.tokenizer_component)
    elif args.model_dir:
        tok = TokenizerSpec.from_model_dir(args.model_dir, args.tokenizer_component)
        if args.special_tokens:
            tok = TokenizerSpec(tok.path, args.special_tokens, tok.component)
    else:
        raise UserError("give --model-dir (or --tokenizer): the check tokenizes with the model's own tokenizer")
    try:
        report = check_dataset(spec, tok, max_seq_len=args.max_seq_len, model_dir=args.model_dir, sample=args.sample)
    except DataError as e:
        raise UserError(str(e)) from None
    print(report.render())
    if args.plot:
        report.plot().savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    msl = args.max_seq_len if args.packed else None
    print("\n# dataset block for the recipe:" if args.format == "yaml" else "\n# overrides:")
    if args.format == "yaml":
        print(dataset_yaml(spec, packed=args.packed, max_seq_len=msl), end="")
    else:
        print(overrides_text(dataset_overrides(spec, packed=args.packed, max_seq_len=msl)))
    return 0 if report.vocab is None or report.vocab.ok else 1


def _c4(args: argparse.Namespace) -> int:
    from cookbook.data import DataError
    from cookbook.data.titan import check_c4, texts_from_files, write_c4

    try:
        out = write_c4(texts_from_files(args.files, args.column), args.output_dir)
    except DataError as e:
        raise UserError(str(e)) from None
    report = check_c4(out)
    print(
        f"wrote {out} ({report.details})\n"
        f"torchtitan: --set dataloader.dataset=c4 --set dataloader.dataset_path={out.resolve()}"
    )
    return 0 if report.ok else 1


def _cc12m(args: argparse.Namespace) -> int:
    from cookbook.data.titan import check_cc12m, write_cc12m

    pairs = []
    for img in sorted(args.images.iterdir()):
        if img.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"):
            cap = img.with_suffix(".txt")
            if not cap.exists():
                raise UserError(f"{img}: no caption file {cap.name}")
            pairs.append((img, cap.read_text().strip()))
    if not pairs:
        raise UserError(f"{args.images}: no images (.jpg/.png/.webp with a same-named .txt)")
    out = write_cc12m(pairs, args.output_dir, shard_size=args.shard_size)
    report = check_cc12m(out)
    print(f"wrote {len(pairs)} samples to {out}; {report.details}")
    return 0 if report.ok else 1


def _layout(args: argparse.Namespace) -> int:
    from cookbook.data.titan import check_c4, check_cc12m

    report = check_c4(args.path) if args.kind == "c4" else check_cc12m(args.path, output_size=args.output_size)
    print(f"{args.kind} {report.path}: {report.samples} samples; {report.details}")
    for p in report.problems:
        print(f"  ! {p}")
    return 0 if report.ok else 1
