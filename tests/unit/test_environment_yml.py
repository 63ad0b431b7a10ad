"""environment.yml (for conda users) is checked statically against pyproject.toml: conda is not
obtainable on the machines that run these tests, so py-rattler parses the conda specs offline."""

from __future__ import annotations

import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from cookbook.paths import project_root

ROOT = project_root()
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _conda_specs() -> list[str]:
    return [d for d in ENV["dependencies"] if isinstance(d, str)]


def _pip_specs() -> list[str]:
    sections = [d for d in ENV["dependencies"] if isinstance(d, dict)]
    assert len(sections) == 1 and set(sections[0]) == {"pip"}, sections
    return sections[0]["pip"]


def test_structure():
    assert set(ENV) <= {"name", "channels", "dependencies", "variables"}
    assert ENV["channels"][0] == "conda-forge"
    assert "pip" in _conda_specs(), "the pip section needs pip itself from conda"


def test_conda_specs_are_valid_matchspecs():
    rattler = pytest.importorskip("rattler")
    for spec in _conda_specs():
        rattler.MatchSpec(spec)


def test_python_version_is_supported():
    spec = next(s for s in _conda_specs() if s.startswith("python"))
    version = spec.split("=", 1)[1]
    assert Version(version) in SpecifierSet(PROJECT["requires-python"])


def test_pip_section_matches_pyproject_exactly():
    env = {canonicalize_name(r.name): r for r in map(Requirement, _pip_specs())}
    wanted = {canonicalize_name(r.name): r for r in map(Requirement, PROJECT["dependencies"])}
    assert sorted(env) == sorted(wanted), "same packages in both files"
    for name, req in wanted.items():
        assert env[name].specifier == req.specifier, (
            f"{name}: pyproject {req.specifier} vs environment.yml {env[name].specifier}"
        )


def test_pinned_versions_are_the_ones_installed_here():
    """The pins are not aspirational: the tested venv has exactly these versions."""
    from importlib.metadata import version

    for req in map(Requirement, PROJECT["dependencies"]):
        installed = Version(version(req.name))
        assert req.specifier.contains(installed, prereleases=True) or req.specifier.contains(
            Version(installed.base_version)
        ), f"{req.name} {installed} not in {req.specifier}"
