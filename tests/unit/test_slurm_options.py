"""Slurm options on JobSpec (exclude, constraint, reservation, mem, gres, sbatch_extra ...): each written as one
shell-quoted #SBATCH line, bad values refused with one line each, from Python, the CLI and the Executor."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook.render import render_job, write_job
from cookbook.spec import SBATCH_OWN, JobSpec, SpecError, check_spec, make_spec

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "a b;rm -rf / $(touch PWNED) `touch PWNED2` 'x\" #"


def shellcheck(path: Path) -> str:
    """shellcheck's findings on a script, as tests/unit/test_render.py runs it; "" when clean."""
    r = subprocess.run(
        ["shellcheck", "--shell=bash", "--severity=style", "--format=gcc", str(path)], capture_output=True, text=True
    )
    assert r.returncode in (0, 1), r.stderr
    return r.stdout


def sbatch_lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH ")]


def sbatch_value(script: str, option: str) -> str:
    """The value of ``#SBATCH --option=VALUE`` as Slurm's parser (and a shell) reads the quoted text."""
    (line,) = [ln for ln in sbatch_lines(script) if ln.startswith(f"#SBATCH --{option}=")]
    (value,) = shlex.split(line.split("=", 1)[1])
    return value


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("partition", "gpu"),
        ("account", "acct"),
        ("qos", "high"),
        ("time", "1-12:00:00"),
        ("exclude", "n1,gpu[12-13]"),
        ("constraint", "h100&ib"),
        ("reservation", "maint"),
        ("mem", "0"),
        ("mem", "64G"),
        ("mem", "500000M"),
        ("gres", "gpu:8"),
        ("gres", "gpu:h100:8"),
        ("gres", "gpu:h100:8,nvme:1"),
    ],
)
def test_each_option_is_one_quoted_sbatch_line(option, value):
    script = render_job(make_spec("llama3_3_70b_full", "generic", **{option: value})).script
    assert sbatch_value(script, option.replace("_", "-")) == value
    assert [ln for ln in sbatch_lines(script) if ln.startswith(f"#SBATCH --{option}=")] == [
        f"#SBATCH --{option}={shlex.quote(value)}"
    ]


def test_new_options_default_to_nothing_written():
    spec = JobSpec("llama3_3_70b_full")
    assert (spec.exclude, spec.constraint, spec.reservation, spec.mem, spec.gres, spec.sbatch_extra) == (
        None,
        None,
        None,
        None,
        None,
        [],
    )
    options = {ln.split("=", 1)[0].split()[1] for ln in sbatch_lines(render_job(spec).script)}
    assert not options & {"--exclude", "--constraint", "--reservation", "--mem", "--gres"}


def test_sbatch_extra_each_its_own_line_after_the_cookbooks_own(tmp_path):
    extra = ["--mail-type=END,FAIL", "--mail-user=me@example.org", "--comment=two words", "--hint=nomultithread"]
    script = render_job(make_spec("llama3_3_70b_lora", "local-cpu", sbatch_extra=extra)).script
    lines = sbatch_lines(script)
    assert lines[-len(extra) :] == [f"#SBATCH {shlex.quote(a)}" for a in extra]
    assert [shlex.split(ln[len("#SBATCH ") :]) for ln in lines[-len(extra) :]] == [[a] for a in extra]
    assert lines[-len(extra) - 1].startswith("#SBATCH --signal=")  # after every option the cookbook writes


def test_hostile_values_stay_quoted_and_harmless(tmp_path):
    fields = ("partition", "account", "qos", "exclude", "constraint", "reservation")
    spec = make_spec(
        "llama3_3_70b_lora",
        "local-cpu",
        **dict.fromkeys(fields, HOSTILE),
        sbatch_extra=[f"--comment={HOSTILE}"],
        run_dir=str(tmp_path / "run"),
    )
    script_path = write_job(spec, tmp_path / "job.sbatch")
    script = script_path.read_text()
    for name in fields:
        assert sbatch_value(script, name) == HOSTILE
    assert shlex.split(sbatch_lines(script)[-1][len("#SBATCH ") :]) == [f"--comment={HOSTILE}"]
    subprocess.run(["bash", "-n", str(script_path)], check=True, cwd=tmp_path)
    # the whole #SBATCH block, run by bash: comments, nothing executes
    header = script.split("set -euo pipefail")[0]
    subprocess.run(["bash", "-c", header + "\ntrue"], check=True, cwd=tmp_path)
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    assert shellcheck(script_path) == ""


BAD = [
    ({"mem": "64GB"}, "mem='64GB': give memory per node"),
    ({"mem": "lots"}, "mem='lots'"),
    ({"mem": "-1"}, "mem='-1'"),
    ({"mem": ""}, "mem=''"),
    ({"gres": "gpu 8"}, "gres='gpu 8': use NAME[:TYPE][:COUNT]"),
    ({"gres": "gpu:h100:8:x"}, "gres='gpu:h100:8:x'"),
    ({"gres": "gpu:8,"}, "gres='gpu:8,'"),
    ({"exclude": ""}, "exclude='' is empty"),
    ({"exclude": "  "}, "exclude='  ' is empty"),
    ({"constraint": ""}, "constraint='' is empty"),
    ({"reservation": ""}, "reservation='' is empty"),
    ({"exclude": "n1\n#SBATCH --nodes=64"}, "contains a newline"),
    ({"account": "a\\b"}, "drops backslashes"),
    ({"sbatch_extra": ["mail-type=END"]}, "write one sbatch option as --name or --name=value"),
    ({"sbatch_extra": ["-p gpu"]}, "write one sbatch option as --name"),
    ({"sbatch_extra": ["--mail-type END"]}, "write one sbatch option as --name"),
    ({"sbatch_extra": ["--comment=a\n#SBATCH --nodes=64"]}, "contains a newline"),
    ({"sbatch_extra": ["--comment=a\\b"]}, "drops backslashes"),
    ({"sbatch_extra": ["--nodes=64"]}, "the cookbook writes --nodes itself; set nodes (--nodes) instead"),
    ({"sbatch_extra": ["--output=x.log"]}, "writes --output itself; set log_dir (--log-dir)"),
    ({"sbatch_extra": ["--job-name=x"]}, "set job_name (--job-name)"),
    ({"sbatch_extra": ["--gpus-per-node=4"]}, "set gpus_per_node (--gpus-per-node)"),
    ({"sbatch_extra": ["--exclude=n1"]}, "set exclude (--exclude)"),
    ({"sbatch_extra": ["--mem=0"]}, "set mem (--mem)"),
    ({"sbatch_extra": ["--part=gpu"]}, "writes --partition itself; set partition (--partition)"),
    ({"sbatch_extra": ["--no-kill"]}, "writes --no-kill itself; set spare_nodes (--spare-nodes)"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[repr(f) for f, _ in BAD])
def test_bad_values_are_refused_with_one_line_each(fields, message):
    spec = make_spec("llama3_3_70b_full", "generic", **fields)
    problems = check_spec(spec)
    assert len(problems) == 1 and message in problems[0], problems
    with pytest.raises(SpecError) as e:
        render_job(spec)
    assert "\n" not in str(e.value) and message in str(e.value)


def test_every_option_the_cookbook_writes_is_refused_in_sbatch_extra():
    spec = JobSpec("llama3_3_70b_full", partition="p", account="a", qos="q", exclude="n1", constraint="c")
    written = {ln[len("#SBATCH ") :].split("=", 1)[0] for ln in sbatch_lines(render_job(spec).script)}
    assert written - {"--ntasks-per-node"} <= set(SBATCH_OWN)
    for option in SBATCH_OWN:
        (problem,) = check_spec(JobSpec("llama3_3_70b_full", sbatch_extra=[f"{option}=1"]))
        assert f"writes {option} itself" in problem


def test_executor_takes_the_options_as_parameters(tmp_path):
    from cookbook import Executor

    executor = Executor(tmp_path, profile="local-cpu")
    executor.update_parameters(nodes=1, exclude="n1", mem="0", gres="gpu:0", sbatch_extra=["--mail-type=END"])
    script = render_job(executor.spec("llama3_8b_c4")).script
    assert {"#SBATCH --exclude=n1", "#SBATCH --mem=0", "#SBATCH --gres=gpu:0", "#SBATCH --mail-type=END"} <= set(
        sbatch_lines(script)
    )
    executor.update_parameters(mem="64GB")
    with pytest.raises(SpecError, match="mem='64GB'"):
        executor.spec("llama3_8b_c4")


def test_executor_takes_spare_nodes_and_the_script_asks_slurm_for_them(tmp_path):
    from cookbook import Executor

    executor = Executor(tmp_path, profile="local-cpu")
    executor.update_parameters(nodes=2, spare_nodes=1)
    spec = executor.spec("llama3_8b_c4")
    assert (spec.nodes, spec.spare_nodes, spec.world_size) == (2, 1, 2)
    assert {"#SBATCH --nodes=3", "#SBATCH --no-kill"} <= set(sbatch_lines(render_job(spec).script))


def cookbook(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cookbook", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_cli_render_writes_the_options_and_refuses_a_bad_one_in_one_line(tmp_path):
    out = tmp_path / "job.sbatch"
    ok = ["render", "llama3_8b_c4", "--profile", "local-cpu", "--exclude", "n2", "--mem", "0"]
    r = cookbook(
        *ok,
        "--constraint",
        "x&y",
        "--sbatch-arg=--mail-type=END",
        "--sbatch-arg=--comment=a b",
        "-o",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    lines = sbatch_lines(out.read_text())
    assert {"#SBATCH --exclude=n2", "#SBATCH --mem=0", "#SBATCH --constraint='x&y'"} <= set(lines)
    assert lines[-2:] == ["#SBATCH --mail-type=END", "#SBATCH '--comment=a b'"]
    bad = tmp_path / "bad.sbatch"
    for args, message in (
        (["--mem", "64GB"], "mem='64GB'"),
        (["--sbatch-arg=--nodes=8"], "the cookbook writes --nodes itself; set nodes (--nodes) instead"),
        (["--gres", "gpu:x:y:z"], "gres='gpu:x:y:z'"),
    ):
        r = cookbook("render", "llama3_8b_c4", "--profile", "local-cpu", *args, "-o", str(bad), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [f"error: invalid job: {r.stderr.split('invalid job: ', 1)[1].strip()}"]
        assert message in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
        assert not bad.exists()
