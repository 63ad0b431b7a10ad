"""``cookbook recipes|render|submit|generate-recipes``: the recipe engine from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cookbook.cli import UserError
from cookbook.planner import GPUS
from cookbook.spec import (
    MAX_GPUS_PER_NODE,
    MAX_JOB_NAME,
    MAX_NODES,
    TRACKERS,
    JobSpec,
    SpecError,
    make_spec,
    parse_overrides,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``recipes``, ``render``, ``submit`` and ``generate-recipes`` verbs."""
    sub.add_parser("recipes", help="list the recipes").set_defaults(func=_list)
    _add_render(sub)
    s = sub.add_parser("submit", help="sbatch a rendered script; prints the job id")
    s.add_argument("script")
    s.set_defaults(func=_submit)
    g = sub.add_parser("generate-recipes", help="(re)write slurm-recipes/: every recipe x profile")
    g.add_argument("dir", nargs="?", default="slurm-recipes")
    g.set_defaults(func=_generate)


def _add_render(sub: argparse._SubParsersAction) -> None:
    """The ``render`` verb: its flags in the order ``--help`` lists them."""
    r = sub.add_parser("render", help="validate a job and write its sbatch script + configs")
    _add_recipe_arguments(r)
    _add_shape_arguments(r)
    _add_slurm_arguments(r)
    _add_job_arguments(r)
    _add_config_arguments(r)
    r.set_defaults(func=_render)


def _add_recipe_arguments(r: argparse.ArgumentParser) -> None:
    """The recipe and, for ``script``, the program (with its arguments after ``--``)."""
    r.add_argument(
        "recipe",
        help="a recipe of `cookbook recipes`; or bring your own: tune:CONFIG (a torchtune built-in, `tune ls`), "
        "tune:RECIPE:FILE.yaml, titan:MODULE:CONFIG (MODULE a torchtitan module or a .py file), "
        "script PROGRAM.py [-- ARGS] (your own torchrun script)",
    )
    r.add_argument(
        "program", nargs="?", default=None, help="script only: the program torchrun starts on every node (no default)"
    )
    r.set_defaults(program_args=[])


def _add_shape_arguments(r: argparse.ArgumentParser) -> None:
    """The job's size, profile, name and folders."""
    r.add_argument("--nodes", type=int, default=None, help=f"nodes that train, 1 to {MAX_NODES} (default 2)")
    r.add_argument(
        "--spare-nodes",
        type=int,
        default=None,
        metavar="K",
        help="also ask Slurm for K spare nodes that stand by: the job swaps a node at fault for one and trains on "
        "(default 0; `cookbook plan` suggests K)",
    )
    r.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help=f"GPUs per node, 0 to {MAX_GPUS_PER_NODE} (default 8; 0 on local-cpu: one CPU process per node)",
    )
    r.add_argument(
        "--cpus-per-task", type=int, default=None, help="CPUs of each node's launcher (default: Slurm's, unset)"
    )
    r.add_argument(
        "--profile", default="generic", help="a cluster profile: `cookbook profiles` lists them (default generic)"
    )
    for opt, help in (
        (
            "job-name",
            f"Slurm's job name, also the run folder's: letters, digits, . _ + -, at most {MAX_JOB_NAME} "
            "(default: the recipe's name with - for _)",
        ),
        ("log-dir", "folder of the job's log NAME-JOBID.out (default '.': where sbatch runs)"),
        ("run-dir", "checkpoints and metrics (default $RECIPE_DIR/runs/JOB-NAME, beside the script)"),
        ("container-image", "pyxis/enroot image every node runs in (default: none, the venv)"),
        ("venv", "the Python environment on the nodes, a venv or conda prefix (default: this one, if active)"),
    ):
        r.add_argument(f"--{opt}", default=None, help=help)


def _add_slurm_arguments(r: argparse.ArgumentParser) -> None:
    """The options written as ``#SBATCH`` lines, in their own help group."""
    slurm = r.add_argument_group("Slurm options", "each written as an #SBATCH line, shell-quoted")
    for opt, help in (
        ("account", "account to charge (default: your Slurm default)"),
        ("qos", "quality of service (default: the account's)"),
        ("partition", "partition (default: the cluster's)"),
        ("time", "time limit, e.g. 04:00:00 or 1-12:00:00 (default 04:00:00; 00:10:00 on local-cpu)"),
        ("exclude", "nodes never to use, e.g. n7,gpu[12-13] (default: none)"),
        ("constraint", "node features, e.g. h100&ib (default: none)"),
        ("reservation", "reservation to run in (default: none)"),
        ("mem", "memory per node: 64G, 500000M, 0 (all of it) (default: the partition's)"),
        ("gres", "generic resources, e.g. gpu:h100:8 (GPUs: prefer --gpus-per-node) (default: none)"),
        (
            "dependency",
            "start after other jobs, e.g. afterok:1234 (the data job `cookbook data ... --submit` printed) "
            "(default: none)",
        ),
    ):
        slurm.add_argument(f"--{opt}", default=None, help=help)
    slurm.add_argument(
        "--sbatch-arg",
        dest="sbatch_extra",
        action="append",
        default=[],
        metavar="ARG",
        help="any other sbatch option, repeatable, written with '=': --sbatch-arg=--mail-type=END (default: none)",
    )
    slurm.add_argument(
        "--test-only",
        action="store_true",
        help="ask Slurm too (sbatch --test-only): nothing is written if it refuses, with its own message "
        "(default: off, no Slurm needed)",
    )


def _add_job_arguments(r: argparse.ArgumentParser) -> None:
    """Container mounts, sharing, requeue, the warning signal, tracking and the job's environment."""
    r.add_argument(
        "--container-mount",
        action="append",
        default=[],
        metavar="SRC:DST[:ro]",
        help="a folder mounted into the container, repeatable (default: none)",
    )
    r.add_argument(
        "--no-exclusive",
        action="store_true",
        help="share nodes with other jobs (default: whole nodes on GPU profiles, shared on local-cpu)",
    )
    r.add_argument(
        "--no-requeue",
        action="store_true",
        help="end the job at a preemption or node fault instead of saving and requeueing (default: requeue)",
    )
    r.add_argument(
        "--signal-seconds",
        type=int,
        default=None,
        help="USR1 this long before the time limit (default: what the recipe's stop-save needs, from its model's "
        "size and --nodes, at least 120; 30 on local-cpu)",
    )
    r.add_argument(
        "--tracker",
        default=None,
        choices=TRACKERS,
        help="experiment tracking (default none: the framework's own logs); run name <job name>-<first job id>",
    )
    r.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the job, repeatable; never a secret (default: the profile's only)",
    )


def _add_config_arguments(r: argparse.ArgumentParser) -> None:
    """The recipe's config overrides, the planner's GPU kind and the output path."""
    r.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe config key, repeatable, e.g. --set optimizer.lr=2e-5 (`cookbook plan RECIPE --suggest` prints "
        "them for a shape that fits; default: the recipe's config)",
    )
    r.add_argument(
        "--gpu",
        default="h100",
        choices=sorted(GPUS),
        help="GPU kind for the planner's will-it-fit check (default h100; ignored for local-cpu)",
    )
    r.add_argument(
        "-o", "--output", required=True, help="script path, required; its folder is made, configs are written in it"
    )


def _list(args: argparse.Namespace) -> int:
    from cookbook.recipes import list_recipes

    for r in list_recipes():
        print(f"{r.name:22} {r.framework:11} {r.description}")
    return 0


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """The JobSpec the ``render`` flags describe (the profile's defaults where a flag is not given)."""
    recipe = args.recipe
    if recipe == "script":
        if not args.program:
            raise UserError("script: name the program, e.g. `cookbook render script train.py --nodes 2 -- --lr 0.1`")
        recipe = f"script:{args.program}"
    elif args.program:
        raise UserError(f"{args.program!r}: only the script recipe takes a program (`cookbook render script PROGRAM`)")
    try:
        return make_spec(
            recipe,
            args.profile,
            nodes=args.nodes,
            spare_nodes=args.spare_nodes,
            gpus_per_node=args.gpus_per_node,
            cpus_per_task=args.cpus_per_task,
            partition=args.partition,
            account=args.account,
            qos=args.qos,
            exclude=args.exclude,
            constraint=args.constraint,
            reservation=args.reservation,
            mem=args.mem,
            gres=args.gres,
            dependency=args.dependency,
            sbatch_extra=args.sbatch_extra,
            time=args.time,
            job_name=args.job_name,
            log_dir=args.log_dir,
            run_dir=args.run_dir,
            container_image=args.container_image,
            container_mounts=args.container_mount,
            exclusive=False if args.no_exclusive else None,
            requeue=not args.no_requeue,
            signal_seconds=args.signal_seconds,
            venv=args.venv,
            env=parse_overrides(args.env),
            overrides=parse_overrides(args.overrides),
            tracker=args.tracker,
            program_args=args.program_args or None,
        )
    except SpecError as e:
        raise UserError(str(e)) from e


def _render(args: argparse.Namespace) -> int:
    from cookbook.cli.files import output_file
    from cookbook.render import render, test_only, write_job
    from cookbook.resolve import placed, resolve

    # checked before any work: a folder, a file above it, no write access; its folder is made, configs go beside it
    output = output_file(args.output, "-o", make_folder=True, example="job.sbatch")
    spec = placed(spec_from_args(args), output)  # the folder known: start-up paths resolve against it, and warn
    try:
        job = resolve(spec)  # once: validated and sized; rendered once, for the warnings, Slurm's test and the file
        rendered = render(job)
    except SpecError as e:
        raise UserError(str(e)) from e
    from cookbook.planner import job_fit_warning

    warnings: list[str | None] = [*rendered.warnings, job_fit_warning(spec, args.gpu)]
    for w in filter(None, warnings):
        print(f"warning: {w}", file=sys.stderr)
    try:
        if args.test_only:
            print(f"sbatch --test-only: {test_only(job, rendered=rendered)}", file=sys.stderr)
        path = write_job(job, output, rendered)
    except SpecError as e:
        raise UserError(str(e)) from e
    print(path)
    return 0


def _submit(args: argparse.Namespace) -> int:
    from cookbook.render import log_dir_of
    from cookbook.slurm.client import SlurmClient, SlurmError

    script = Path(args.script).resolve()
    if not script.is_file():
        raise UserError(f"{args.script}: no such script (render one with `cookbook render RECIPE -o FILE`)")
    log_dir = log_dir_of(script)
    if log_dir is not None:
        (log_dir if log_dir.is_absolute() else script.parent / log_dir).mkdir(parents=True, exist_ok=True)
    client = SlurmClient({**os.environ, "RECIPE_DIR": str(script.parent)})
    try:
        print(client.submit(script, cwd=script.parent))
    except SlurmError as e:
        raise UserError(e.stderr or str(e)) from e
    return 0


def _generate(args: argparse.Namespace) -> int:
    from cookbook.render import generate_recipes

    for path in generate_recipes(Path(args.dir)):
        print(path)
    return 0
