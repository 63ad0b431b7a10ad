"""``cookbook data check|c4|cc12m|layout``: check a dataset with the model's tokenizer; torchtitan layouts."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from datetime import datetime
from pathlib import Path

from cookbook.cli import UserError
from cookbook.cli.files import at_least, output_file, output_folder

# `--submit` and the Slurm options of the CPU job it submits: (flag, takes a value, help)
_JOB_OPTIONS = (
    ("--submit", False, "run this as a CPU Slurm job instead (prints its id: train with --dependency afterok:ID)"),
    ("--partition", True, "the job's partition (default: the cluster's)"),
    ("--account", True, "account to charge"),
    ("--qos", True, "quality of service"),
    ("--time", True, "time limit (default 01:00:00)"),
    ("--cpus-per-task", True, "CPUs for the job"),
    ("--mem", True, "memory: 64G, 0 (all of the node's)"),
    ("--dependency", True, "start after other jobs, e.g. afterok:1234"),
    ("--log-dir", True, "folder of the job's script and log (default .cookbook-jobs)"),
)


def _job_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("as a Slurm job", "--submit: the same command as a CPU job, on one node")
    for flag, value, help in _JOB_OPTIONS:
        if value:
            g.add_argument(flag, default=None, help=help, dest=f"job_{flag[2:].replace('-', '_')}")
        else:
            g.add_argument(flag, action="store_true", help=help)


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
    c.add_argument("--plot", help="save the token-length histogram here (.png/.svg)")
    c.add_argument("--format", choices=("yaml", "overrides"), default="yaml")
    _job_options(c)
    c.set_defaults(func=_check)

    w = verbs.add_parser("c4", help="lay out text/jsonl files as a local C4 `en` folder for torchtitan")
    w.add_argument("files", nargs="+", type=Path)
    w.add_argument("--output-dir", required=True)
    w.add_argument("--column", default="text")
    _job_options(w)
    w.set_defaults(func=_c4)

    cc = verbs.add_parser("cc12m", help="write image+caption pairs (IMG.jpg/png + IMG.txt) as webdataset shards")
    cc.add_argument("images", type=Path, help="folder with images and same-named .txt captions")
    cc.add_argument("--output-dir", required=True)
    cc.add_argument("--shard-size", type=int, default=1000)
    _job_options(cc)
    cc.set_defaults(func=_cc12m)

    lay = verbs.add_parser("layout", help="check a torchtitan data folder as its loader reads it")
    lay.add_argument("kind", choices=("c4", "cc12m"))
    lay.add_argument("path", type=Path)
    lay.add_argument("--output-size", type=int, default=256, help="cc12m: training image size")
    _job_options(lay)
    lay.set_defaults(func=_layout)


def submitted(args: argparse.Namespace) -> bool:
    """With ``--submit``: render and sbatch this same command (without the job flags) as a CPU job; True."""
    if not args.submit:
        return False
    from cookbook.render import log_file, write_command_job
    from cookbook.slurm.client import SlurmClient, SlurmError
    from cookbook.spec import JobSpec, SpecError

    command, words = [], list(args.argv)
    while words:
        word = words.pop(0)
        flag = next((f for f, v, _ in _JOB_OPTIONS if word == f or (v and word.startswith(f + "="))), None)
        if flag is None:
            command.append(word)
        elif word == flag and flag != "--submit":
            words.pop(0)  # its value
    name = f"data-{args.verb}"
    output_folder(args.job_log_dir or ".cookbook-jobs", "--log-dir")
    folder = Path(args.job_log_dir or ".cookbook-jobs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    try:
        spec = JobSpec(
            recipe=name,
            nodes=1,
            gpus_per_node=0,
            cpus_per_task=int(args.job_cpus_per_task) if args.job_cpus_per_task else None,
            partition=args.job_partition,
            account=args.job_account,
            qos=args.job_qos,
            mem=args.job_mem,
            dependency=args.job_dependency,
            time=args.job_time or "01:00:00",
            exclusive=False,
            requeue=False,
            log_dir=str(folder.resolve()),
            venv=sys.prefix if sys.prefix != sys.base_prefix else None,
        )
        script = write_command_job(
            spec,
            [sys.executable, "-m", "cookbook", *command],
            folder / "job.sbatch",
            Path.cwd(),
            "cookbook " + " ".join(command),
        )
    except (SpecError, ValueError) as e:
        raise UserError(str(e)) from None
    try:
        job_id = SlurmClient().submit(script, cwd=folder)
    except SlurmError as e:  # nothing submitted: nothing left behind
        shutil.rmtree(folder, ignore_errors=True)
        if not args.job_log_dir:
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # the default folder, when this job's was its only one
        raise UserError(e.stderr or str(e)) from None
    log = log_file(spec).replace("%x", name).replace("%j", job_id)
    print(f"submitted {name} job {job_id} (script {script}, log {log})")
    print(f"train after it: cookbook render ... --dependency afterok:{job_id}  (Python: dependency='afterok:{job_id}')")
    return True


def _column_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--column-map wants KEY=COLUMN, got {item!r}")
        out[key] = value
    return out


def _check(args: argparse.Namespace) -> int:
    at_least(args.max_seq_len, 1, "--max-seq-len", "tokens per sample")
    at_least(args.sample, 1, "--sample", "rows to tokenize")
    plot = None if args.plot is None else output_file(args.plot, "--plot", plot=True)
    if submitted(args):
        return 0
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
    if plot:
        report.plot().savefig(plot, dpi=100)
        print(f"plot: {plot}")
    msl = args.max_seq_len if args.packed else None
    print("\n# dataset block for the recipe:" if args.format == "yaml" else "\n# overrides:")
    if args.format == "yaml":
        print(dataset_yaml(spec, packed=args.packed, max_seq_len=msl), end="")
    else:
        print(overrides_text(dataset_overrides(spec, packed=args.packed, max_seq_len=msl)))
    return 0 if report.vocab is None or report.vocab.ok else 1


def _c4(args: argparse.Namespace) -> int:
    output_dir = output_folder(args.output_dir, "--output-dir")
    if submitted(args):  # the inputs may be an earlier job's output (--dependency): looked at by the job
        return 0
    for path in args.files:
        if not path.is_file():
            raise UserError(f"{path}: no such file (give .txt files, or .json/.jsonl files with a --column of text)")
    from cookbook.data.titan import check_c4, texts_from_files, write_c4

    try:
        out = write_c4(texts_from_files(args.files, args.column), output_dir)
    except ValueError as e:  # DataError, a file of another type, a .txt that is not UTF-8
        raise UserError(str(e)) from None
    report = check_c4(out)
    print(
        f"wrote {out} ({report.details})\n"
        f"torchtitan: --set dataloader.dataset=c4 --set dataloader.dataset_path={out.resolve()}"
    )
    return 0 if report.ok else 1


def _cc12m(args: argparse.Namespace) -> int:
    at_least(args.shard_size, 1, "--shard-size", "samples per tar shard")
    output_dir = output_folder(args.output_dir, "--output-dir")
    if submitted(args):
        return 0
    if not args.images.is_dir():
        raise UserError(f"{args.images}: no such folder (give the folder of IMG.jpg/png + IMG.txt pairs)")
    from PIL import Image, UnidentifiedImageError

    from cookbook.data.titan import check_cc12m, write_cc12m

    pairs = []
    for img in sorted(args.images.iterdir()):
        if img.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"):
            cap = img.with_suffix(".txt")
            if not cap.exists():
                raise UserError(f"{img}: no caption file {cap.name}")
            try:
                with Image.open(img) as opened:
                    opened.verify()
            except (UnidentifiedImageError, OSError, SyntaxError) as e:  # verify() raises SyntaxError on a bad PNG
                raise UserError(f"{img}: not an image PIL can read ({e}); remove it or replace it") from None
            pairs.append((img, cap.read_text().strip()))
    if not pairs:
        raise UserError(f"{args.images}: no images (.jpg/.png/.webp with a same-named .txt)")
    out = write_cc12m(pairs, output_dir, shard_size=args.shard_size)
    report = check_cc12m(out)
    print(f"wrote {len(pairs)} samples to {out}; {report.details}")
    return 0 if report.ok else 1


def _layout(args: argparse.Namespace) -> int:
    if submitted(args):
        return 0
    if not args.path.is_dir():
        raise UserError(f"{args.path}: no such folder (give the {args.kind} folder the job reads)")
    from cookbook.data.titan import check_c4, check_cc12m

    report = check_c4(args.path) if args.kind == "c4" else check_cc12m(args.path, output_size=args.output_size)
    print(f"{args.kind} {report.path}: {report.samples} samples; {report.details}")
    for p in report.problems:
        print(f"  ! {p}")
    return 0 if report.ok else 1
