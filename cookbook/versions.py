"""The versions this cookbook is tested with, read from its own package metadata.

They are written once, in ``pyproject.toml``'s ``dependencies`` (``requirements/constraints.txt`` pins the
rest, ``environment.yml`` is checked against it by a test); ``cookbook doctor`` and the CPU shims read
them here. Without installed metadata (the package copied, not installed) the pyproject file is read.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from cookbook.paths import project_root

#: The packages whose versions decide whether a recipe runs as tested.
FRAMEWORKS: tuple[str, ...] = ("torch", "torchtune", "torchao", "torchtitan")


@functools.cache
def pinned() -> dict[str, SpecifierSet]:
    """Each runtime dependency's accepted versions (extras such as ``dev`` left out)."""
    try:
        lines = metadata.requires("cookbook") or []
    except metadata.PackageNotFoundError:
        lines = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r.specifier for r in requirements if r.marker is None}


def specifier(package: str) -> SpecifierSet:
    """The accepted versions of ``package`` (``KeyError`` for a package the cookbook does not pin)."""
    return pinned()[canonicalize_name(package)]


def exact_version(package: str) -> str | None:
    """The one version ``package`` is pinned to (``==X``), or None when a range is accepted."""
    specs = list(specifier(package))
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


def requirement(package: str) -> str:
    """``package`` with its pin, ready for ``pip install`` (``torch==2.13.0``, ``torchao<0.16,>=0.13``)."""
    return f"{package}{specifier(package)}"


def accepts(package: str, version: str) -> bool:
    """Whether an installed ``version`` (local tags such as ``+cpu`` allowed) is one the cookbook pins."""
    return specifier(package).contains(version.split("+", 1)[0], prereleases=True)


def tested_version(package: str) -> str:
    """The version messages name: the exact pin (``0.6.1``), or the accepted range when there is none."""
    return exact_version(package) or str(specifier(package))
