"""Careless inputs (issue #42): every wrong value is refused before anything is written, with exit 2 and ONE line
naming the value, the rule and the fix (the Python API: :class:`cookbook.spec.SpecError`, or the planner's
ValueError, with the same text); a path the job reads that is missing here is a warning naming it.

The command line runs in-process (``cookbook.cli.main``) in an empty folder, so "nothing written" is that the folder
stays empty. Output paths and file inputs have their own table (another file)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cookbook.cli import build_parser, main
from cookbook.executor import Executor
from cookbook.planner import RECIPES, plan, suggest
from cookbook.render import validate, write_job
from cookbook.spec import JobSpec, SpecError, check_spec, make_spec

FSDP = "fsdp_llama3_1_8b"  # a recipe whose own checks are quick (no framework config parser)
LORA = "llama3_3_70b_lora"
OUT = "out/job.sbatch"


def render(*args: str) -> list[str]:
    return ["render", FSDP, *args, "-o", OUT]


# (id, argv, text the one stderr line holds)
CLI_ROWS: list[tuple[str, list[str], str]] = [
    # render: the job's size
    ("nodes zero", render("--nodes", "0"), "nodes=0: need at least 1 node"),
    ("nodes negative", render("--nodes=-3"), "nodes=-3"),
    ("nodes a word", render("--nodes", "two"), "invalid int value: 'two'"),
    ("nodes a fraction", render("--nodes", "1.5"), "invalid int value: '1.5'"),
    ("nodes beyond any partition", render("--nodes", "100000"), "no Slurm partition holds more than"),
    ("spares beyond any partition", render("--nodes", "16384", "--spare-nodes", "1"), "no Slurm partition"),
    ("spare nodes negative", render("--spare-nodes=-1"), "spare_nodes=-1: cannot be negative"),
    ("more spares than nodes", render("--nodes", "1", "--spare-nodes", "2"), "at most one spare per training node"),
    ("gpus per node 1000", render("--gpus-per-node", "1000"), "no node offers more than 16 GPUs"),
    ("gpus per node negative", render("--gpus-per-node=-1"), "gpus_per_node=-1: cannot be negative"),
    ("gpus per node zero on a GPU profile", render("--gpus-per-node", "0"), "trains on GPUs"),
    ("gpus on local-cpu", render("--profile", "local-cpu", "--gpus-per-node", "8"), "has no GPUs"),
    ("gpus per node a word", render("--gpus-per-node", "eight"), "invalid int value: 'eight'"),
    ("cpus per task zero", render("--cpus-per-task", "0"), "cpus_per_task=0"),
    # render: names and paths
    ("job name climbs out", render("--job-name", "../../evil"), "job_name='../../evil': a job name is one folder"),
    ("job name absolute", render("--job-name", "/etc/x"), "job_name='/etc/x'"),
    ("job name 300 characters", render("--job-name", "a" * 300), "at most 100 characters"),
    ("job name with a space", render("--job-name", "my job"), "job_name='my job'"),
    ("job name starting with a dash", render("--job-name=-x"), "not starting with . or -"),
    ("job name a dot", render("--job-name", "."), "job_name='.'"),
    ("job name with a newline", render("--job-name", "a\nb"), "newline or control character"),
    ("run dir empty", render("--run-dir", ""), "run_dir='' is empty"),
    ("run dir blank", render("--run-dir", "  "), "run_dir='  ' is empty"),
    ("log dir empty", render("--log-dir", ""), "log_dir='' is empty"),
    ("log dir with a pattern", render("--log-dir", "logs/%j"), "give a folder"),
    ("venv empty", render("--venv", ""), "venv='' is empty"),
    ("container image empty", render("--container-image", ""), "container_image='' is empty"),
    ("mount without image", render("--container-mount", "/a:/a"), "without container_image"),
    ("mount without destination", render("--container-image", "x.sqsh", "--container-mount", "/a"), "SRC:DST"),
    # render: Slurm options
    ("time a word", render("--time", "soon"), "time='soon'"),
    ("time empty", render("--time", ""), "time=''"),
    ("time with seconds over 59", render("--time", "1:2:345"), "time='1:2:345'"),
    ("signal after the time limit", render("--time", "1", "--signal-seconds", "120"), "not shorter than time"),
    ("signal negative", render("--signal-seconds=-5"), "Slurm accepts 0..65535"),
    ("memory unit unknown", render("--mem", "64GB"), "mem='64GB'"),
    ("gres malformed", render("--gres", "gpu::8"), "gres='gpu::8'"),
    ("dependency malformed", render("--dependency", "after 12"), "dependency='after 12'"),
    ("exclude empty", render("--exclude", " "), "exclude=' ' is empty"),
    ("partition with a backslash", render("--partition", "gp\\u"), "drops backslashes"),
    ("sbatch arg without dashes", render("--sbatch-arg", "mail-type=END"), "write one sbatch option"),
    ("sbatch arg the cookbook writes", render("--sbatch-arg=--nodes=4"), "the cookbook writes --nodes itself"),
    ("sbatch arg abbreviated", render("--sbatch-arg=--part=gpu"), "the cookbook writes --partition itself"),
    ("profile unknown", render("--profile", "nope"), "unknown profile 'nope'"),
    ("tracker unknown", render("--tracker", "tb"), "invalid choice: 'tb'"),
    ("gpu kind unknown", render("--gpu", "h1000"), "invalid choice: 'h1000'"),
    ("EFA profile shared", render("--profile", "aws-efa", "--no-exclusive"), "set exclusive=True"),
    # render: the environment and the recipe's settings
    ("env without a value", render("--env", "FOO"), "override 'FOO' is not KEY=VALUE"),
    ("env name invalid", render("--env", "1X=a"), "env name '1X' is not a valid variable name"),
    ("env a secret", render("--env", "HF_TOKEN=hf_x"), "secrets are never written"),
    ("set without a value", render("--set", "lr"), "override 'lr' is not KEY=VALUE"),
    ("set an empty key", render("--set", "=3"), "override '=3' is not KEY=VALUE"),
    ("learning rate negative", render("--set", "lr=-1"), "lr='-1': the learning rate must be a finite number > 0"),
    ("learning rate zero", render("--set", "lr=0"), "the learning rate must be a finite number > 0"),
    ("learning rate a word", render("--set", "lr=fast"), "--lr: invalid float value: 'fast'"),
    ("sequence length zero", render("--set", "seq_len=0"), "the sequence length must be a finite number > 0"),
    ("steps negative", render("--set", "max_steps=-10"), "the training steps must be a finite number > 0"),
    ("unknown flag of the script", render("--set", "learning_rate=1"), "not a flag of the FSDP train.py"),
    ("LoRA rank negative", ["render", LORA, "--set", "model.lora_rank=-4", "-o", OUT], "the LoRA rank must be"),
    ("LoRA rank zero", ["render", LORA, "--set", "model.lora_rank=0", "-o", OUT], "model.lora_rank='0'"),
    ("LoRA learning rate", ["render", LORA, "--set", "optimizer.lr=-3e-4", "-o", OUT], "the learning rate must"),
    ("LoRA learning rate a word", ["render", LORA, "--set", "optimizer.lr=fast", "-o", OUT], "optimizer.lr='fast'"),
    ("LoRA alpha zero", ["render", LORA, "--set", "model.lora_alpha=0", "-o", OUT], "LoRA's alpha must be"),
    # render: inf and nan parse as numbers, and are none of these
    ("learning rate infinite", render("--set", "lr=inf"), "lr='inf': the learning rate must be a finite number > 0"),
    ("learning rate nan", render("--set", "lr=nan"), "lr='nan': the learning rate must be a finite number"),
    ("sequence length infinite", render("--set", "seq_len=inf"), "seq_len='inf'"),
    ("LoRA learning rate infinite", ["render", LORA, "--set", "optimizer.lr=inf", "-o", OUT], "optimizer.lr='inf'"),
    ("LoRA alpha nan", ["render", LORA, "--set", "model.lora_alpha=nan", "-o", OUT], "model.lora_alpha='nan'"),
    ("LoRA rank infinite", ["render", LORA, "--set", "model.lora_rank=inf", "-o", OUT], "model.lora_rank='inf'"),
    (
        "LoRA rank above the hidden size",
        ["render", LORA, "--set", "model.lora_rank=1000000000", "-o", OUT],
        "model.lora_rank=1000000000: a LoRA rank cannot exceed the hidden size of Llama 3.3 70B (8192)",
    ),
    ("titan learning rate infinite", ["render", "llama3_8b_c4", "--set", "optimizer.lr=inf", "-o", OUT], "'inf'"),
    ("titan learning rate", ["render", "llama3_8b_c4", "--set", "optimizer.lr=-1", "-o", OUT], "optimizer.lr='-1'"),
    ("titan steps", ["render", "llama3_8b_c4", "--set", "training.steps=0", "-o", OUT], "training steps"),
    ("recipe unknown", ["render", "llama3_8b_lora", "-o", OUT], "unknown recipe 'llama3_8b_lora'"),
    ("program for a recipe", ["render", FSDP, "train.py", "-o", OUT], "only the script recipe takes a program"),
    ("script without program", ["render", "script", "-o", OUT], "script: name the program"),
    ("render without -o", ["render", FSDP], "required: -o/--output"),
    ("unknown option", [*render(), "--port", "80"], "unrecognized arguments: --port 80"),
    # plan
    ("plan LoRA rank negative", ["plan", LORA, "--set", "lora_rank=-4"], "lora_rank=-4: must be > 0"),
    ("plan LoRA rank zero", ["plan", LORA, "--set", "model.lora_rank=0"], "is a LoRA recipe; its rank must be > 0"),
    ("plan nodes beyond", ["plan", LORA, "--nodes", "100000"], "no Slurm partition holds more than"),
    ("plan nodes zero", ["plan", LORA, "--nodes", "0"], "nodes=0: need at least 1 node"),
    ("plan gpus 1000", ["plan", LORA, "--gpus-per-node", "1000"], "no node offers more than 16 GPUs"),
    ("plan gpus zero", ["plan", LORA, "--gpus-per-node", "0"], "the planner plans GPU jobs"),
    ("plan micro-batch negative", ["plan", LORA, "--set", "micro_batch=-1"], "micro_batch=-1: must be >= 1"),
    ("plan micro-batch a word", ["plan", LORA, "--set", "micro_batch=x"], "expected a whole number, got 'x'"),
    ("plan set without value", ["plan", LORA, "--set", "micro_batch"], "is not KEY=VALUE"),
    ("plan setting unknown", ["plan", LORA, "--set", "batchsize=4"], "unknown setting 'batchsize'"),
    ("plan checkpointing unknown", ["plan", LORA, "--set", "checkpointing=some"], "checkpointing must be one of"),
    ("plan tp not dividing", ["plan", LORA, "--set", "tp=3"], "does not divide"),
    ("plan hours negative", ["plan", LORA, "--hours=-1"], "--hours -1: must be >= 0"),
    ("plan dataset tokens negative", ["plan", LORA, "--dataset-tokens=-5"], "--dataset-tokens -5"),
    ("plan hours nan", ["plan", LORA, "--hours", "nan"], "--hours nan: not a finite number"),
    ("plan hours infinite", ["plan", LORA, "--hours", "inf"], "--hours inf: not a finite number"),
    ("plan dataset tokens infinite", ["plan", LORA, "--dataset-tokens", "inf"], "--dataset-tokens inf: not a finite"),
    ("plan dataset samples nan", ["plan", LORA, "--dataset-samples", "nan"], "--dataset-samples nan: not a finite"),
    ("plan LoRA rank above the hidden size", ["plan", LORA, "--set", "lora_rank=100000"], "cannot exceed the hidden"),
    ("plan LoRA rank infinite", ["plan", LORA, "--set", "lora_rank=inf"], "expected a whole number, got 'inf'"),
    ("plan a setting nan", ["plan", LORA, "--set", "fragmentation=nan"], "expected a finite number, got 'nan'"),
    ("plan max nodes zero", ["plan", LORA, "--suggest", "--max-nodes", "0"], "--max-nodes 0"),
    ("plan recipe unknown", ["plan", "llama3_70b"], "unknown recipe 'llama3_70b'"),
    ("plan gpu unknown", ["plan", LORA, "--gpu", "h1000"], "invalid choice: 'h1000'"),
    # other verbs
    ("status of a word", ["status", "abc"], "'abc' is not a Slurm job id"),
    ("cancel a negative id", ["cancel", "-5"], "'-5' is not a Slurm job id"),
    ("logs of a path", ["logs", "../x"], "'../x' is not a Slurm job id"),
    ("logs tail negative", ["logs", "5", "--tail=-3"], "--tail -3: must be >= 0"),
    ("logs rank negative", ["logs", "5", "--rank=-1"], "--rank -1: must be >= 0"),
    ("logs interval zero", ["logs", "5", "-f", "--interval", "0"], "--interval 0: must be >= 0.1"),
    ("logs rank a word", ["logs", "5", "--rank", "first"], "invalid int value: 'first'"),
    ("watch a word", ["watch", "5x"], "'5x' is not a Slurm job id"),
    ("watch interval zero", ["watch", "5", "--interval", "0"], "--interval 0: must be >= 0.1"),
    ("watch timeout nan", ["watch", "5", "--timeout", "nan"], "--timeout nan: not a finite number"),
    ("list with an argument", ["list", "5"], "unrecognized arguments: 5"),
    ("outputs of an empty path", ["outputs", ""], "outputs '': an empty path names no folder"),
    ("metrics of an empty path", ["metrics", ""], "metrics '': an empty path names no log or folder"),
    ("diagnose an empty path", ["diagnose", " "], "diagnose ' ': an empty path"),
    ("goodput of an empty path", ["goodput", ""], "goodput '': an empty path"),
    ("explain an empty path", ["explain", ""], "explain '': an empty path names no log or folder"),
    ("outputs of a missing folder", ["outputs", "runs/nope"], "runs/nope: no such folder"),
    ("doctor partition empty", ["doctor", "--partition", ""], "--partition '': an empty name names no partition"),
    ("doctor timeout nan", ["doctor", "--timeout", "nan"], "--timeout nan: not a finite number"),
    ("doctor model dir empty", ["doctor", "--model-dir", " "], "--model-dir ' ': an empty path names no folder"),
    ("doctor shared dir empty", ["doctor", "--shared-dir", ""], "--shared-dir '': an empty path"),
    ("profile shown unknown", ["profiles", "show", "nope"], "unknown profile 'nope'"),
    ("submit a missing script", ["submit", "nope.sbatch"], "no such script"),
    ("stage an unknown recipe", ["stage", "nope", "--root", "shared"], "unknown recipe 'nope'"),
    ("verb unknown", ["rendr"], "invalid choice: 'rendr'"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``cookbook ARGV`` in-process: its exit status (argparse's too) and its stderr."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's usage errors
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_careless_command_line_is_one_line_and_exit_2(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no verb may reach a real Slurm
    rc, err = _run(argv, capsys)
    lines = err.splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert expected in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing written, not even the output folder


def _executor_spec(tmp: Path, **parameters: Any) -> Callable[[], object]:
    ex = Executor(tmp / "runs")
    ex.update_parameters(**parameters)
    return lambda: ex.spec(FSDP)


# (id, a call that must raise, text of its one line); the Python API's own error type, never a TypeError
API_ROWS: list[tuple[str, Callable[[Path], Callable[[], object]], str]] = [
    ("nodes a word", lambda t: lambda: validate(JobSpec(FSDP, nodes="two")), "nodes='two': give a whole number"),
    ("nodes a float", lambda t: lambda: validate(JobSpec(FSDP, nodes=2.0)), "nodes=2.0: give a whole number"),
    ("nodes True", lambda t: lambda: validate(JobSpec(FSDP, nodes=True)), "nodes=True: give a whole number"),
    ("gpus None", lambda t: lambda: validate(JobSpec(FSDP, gpus_per_node=None)), "gpus_per_node=None"),
    (
        "sbatch_extra one string",
        lambda t: lambda: validate(JobSpec(FSDP, sbatch_extra="--mail-type=END")),
        "sbatch_extra='--mail-type=END' is one string: give a list of strings",
    ),
    (
        "container_mounts one string",
        lambda t: lambda: validate(JobSpec(FSDP, container_mounts="/a:/a")),
        "container_mounts='/a:/a' is one string",
    ),
    ("overrides a list", lambda t: lambda: validate(JobSpec(FSDP, overrides=["lr=1"])), "overrides=['lr=1']"),
    ("override a number", lambda t: lambda: validate(JobSpec(FSDP, overrides={"lr": 0.1})), "numbers as strings"),
    ("env a number", lambda t: lambda: validate(JobSpec(FSDP, env={"X": 1})), "env={'X': 1}"),
    ("exclusive a word", lambda t: lambda: validate(JobSpec(FSDP, exclusive="no")), "give True or False"),
    ("time a number", lambda t: lambda: validate(JobSpec(FSDP, time=60)), "time=60: give text"),
    ("recipe None", lambda t: lambda: validate(JobSpec(None)), "recipe=None: give text"),
    ("job name climbs out", lambda t: lambda: validate(JobSpec(FSDP, job_name="../../evil")), "job_name='../../"),
    ("job name too long", lambda t: lambda: validate(JobSpec(FSDP, job_name="j" * 101)), "at most 100 characters"),
    ("run dir empty", lambda t: lambda: validate(JobSpec(FSDP, run_dir="")), "run_dir='' is empty"),
    ("venv empty", lambda t: lambda: validate(JobSpec(FSDP, venv="")), "venv='' is empty"),
    ("gpus 1000", lambda t: lambda: validate(JobSpec(FSDP, gpus_per_node=1000)), "no node offers more than 16"),
    ("nodes 100000", lambda t: lambda: validate(JobSpec(FSDP, nodes=100_000)), "no Slurm partition holds"),
    ("lr negative", lambda t: lambda: validate(JobSpec(FSDP, overrides={"lr": "-1"})), "the learning rate must"),
    (
        "LoRA rank negative",
        lambda t: lambda: validate(JobSpec(LORA, overrides={"model.lora_rank": "-4"})),
        "the LoRA rank must be a finite number > 0",
    ),
    ("make_spec nodes a word", lambda t: lambda: validate(make_spec(FSDP, nodes="2")), "nodes='2'"),
    ("Executor nodes a word", lambda t: _executor_spec(t, nodes="two"), "nodes='two': give a whole number"),
    (
        "Executor sbatch_extra one string",
        lambda t: _executor_spec(t, sbatch_extra="--mail-type=END"),
        "sbatch_extra='--mail-type=END' is one string",
    ),
    ("Executor job name", lambda t: _executor_spec(t, job_name="a/b"), "job_name='a/b'"),
    (
        "Executor unknown parameter",
        lambda t: lambda: Executor(t).update_parameters(gpus=8),
        "unknown parameter(s) gpus",
    ),
    (
        "write_job with a bad name",
        lambda t: lambda: write_job(JobSpec(FSDP, job_name="../x"), t / "out" / "job.sbatch"),
        "job_name='../x'",
    ),
    ("plan nodes beyond", lambda t: lambda: plan(LORA, nodes=100_000), "no Slurm partition holds more than"),
    ("plan LoRA rank zero", lambda t: lambda: plan(LORA, lora_rank=0), "its rank must be > 0"),
    ("plan LoRA rank too big", lambda t: lambda: plan(LORA, lora_rank=10**9), "cannot exceed the hidden size"),
    ("lr infinite", lambda t: lambda: validate(JobSpec(FSDP, overrides={"lr": "inf"})), "must be a finite number"),
    (
        "LoRA rank too big",
        lambda t: lambda: validate(JobSpec(LORA, overrides={"model.lora_rank": "9000"})),
        "model.lora_rank=9000: a LoRA rank cannot exceed",
    ),
]


@pytest.mark.parametrize(("make", "expected"), [r[1:] for r in API_ROWS], ids=[r[0] for r in API_ROWS])
def test_careless_python_api_raises_its_own_error_in_one_line(make, expected, tmp_path):
    call = make(tmp_path)
    with pytest.raises(ValueError) as info:  # SpecError (a ValueError), or the planner's ValueError
        call()
    assert expected in str(info.value)
    assert "\n" not in str(info.value), str(info.value)
    assert not isinstance(info.value, TypeError)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_spec_errors_are_the_package_error_type():
    with pytest.raises(SpecError):
        validate(JobSpec(FSDP, nodes="two"))
    assert check_spec(JobSpec(FSDP, sbatch_extra="--x")) == [
        "sbatch_extra='--x' is one string: give a list of strings, e.g. sbatch_extra=['--x']"
    ]


# (id, argv, the warning's text): the job renders (exit 0) and the warning names the missing path
WARN_ROWS: list[tuple[str, list[str], str]] = [
    ("tokenizer folder missing", render("--set", "tokenizer=./no-such-tokenizer"), "tokenizer = ./no-such-tokenizer"),
    ("dataset folder missing", render("--set", "dataset=/no/such/c4"), "dataset = /no/such/c4"),
    ("venv missing", render("--venv", "/no/such/venv"), "venv = /no/such/venv"),
    (
        "model folder missing under the script's folder",
        ["render", LORA, "-o", OUT],
        "checkpointer.checkpoint_dir = {tmp}/out/models/Llama-3.3-70B-Instruct",
    ),
    (
        "model folder with a typo in its top folder",
        ["render", LORA, "--set", "checkpointer.checkpoint_dir=/sharred/models/llama", "-o", OUT],
        "checkpointer.checkpoint_dir = /sharred/models/llama",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), [r[1:] for r in WARN_ROWS], ids=[r[0] for r in WARN_ROWS])
def test_a_missing_path_the_job_reads_is_a_warning_naming_it(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, err = _run(argv, capsys)
    assert rc == 0, err
    warned = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert any(expected.format(tmp=tmp_path) in ln and "does not exist on this machine" in ln for ln in warned), err
    assert (tmp_path / OUT).is_file()


def test_every_row_counted():
    assert len(CLI_ROWS) + len(API_ROWS) + len(WARN_ROWS) >= 70


def _render_options() -> list[argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["render"]._actions if a.dest != "help"]


def test_render_help_explains_every_option_with_its_default():
    missing = [a.dest for a in _render_options() if not a.help or ("default" not in a.help and a.required is False)]
    assert missing == []


def _suggestion_specs() -> list[tuple[str, JobSpec]]:
    out = []
    for recipe in sorted(RECIPES):
        for s in suggest(recipe, max_nodes=4):
            spec = JobSpec(recipe, nodes=s.nodes, gpus_per_node=s.plan.gpus_per_node, overrides=dict(s.sets))
            out.append((f"{recipe}: {s.render_args()}", spec))
    return out


def test_plan_suggestions_are_render_settings_render_accepts():
    """Every ``plan --suggest`` line, fed back into render as printed, validates: render's own keys."""
    specs = _suggestion_specs()
    assert len({label.split(":")[0] for label, _ in specs}) == len(RECIPES)
    refused = {}
    for label, spec in specs:
        assert all("micro_batch" not in k and k not in ("tp", "checkpointing") for k in spec.overrides), label
        try:
            validate(spec)
        except SpecError as e:
            refused[label] = str(e)
    assert refused == {}


def test_plan_suggest_prints_render_arguments(capsys):
    assert main(["plan", FSDP, "--suggest"]) in (0, 1)
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("--nodes")]
    assert lines and all("--set train_batch_size=" in ln and "micro_batch" not in ln for ln in lines)


def test_job_builder_takes_every_node_count_the_rules_allow():
    """The builder's boxes are bounded by the spec's own limit, not a smaller one of their own."""
    from cookbook.spec import MAX_NODES
    from cookbook.widgets.builder import JobBuilder

    b = JobBuilder(FSDP, profile="generic", nodes=2)
    assert b.nodes.max == b.spare_nodes.max == MAX_NODES
    b.nodes.value = MAX_NODES
    assert b.nodes.value == MAX_NODES
