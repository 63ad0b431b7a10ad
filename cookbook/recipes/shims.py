"""What the recipes' launch lines share on a profile without GPUs (``local-cpu``, the embedded cluster): the
frameworks run through the profile's shims (:attr:`cookbook.profiles.Profile.shims`, named once, in
``profiles/builtin.yaml``) and read the small models' assets from ``$TINY_DIR``."""

from __future__ import annotations

from cookbook.recipes.base import Launch
from cookbook.spec import LOCAL_CPU, JobSpec, profiles

ASSETS_VARIABLE = "TINY_DIR"


def assets_variables(spec: JobSpec) -> dict[str, str]:
    """``{"TINY_DIR": root}`` of the small models' assets (``spec.assets_dir``, else the cache's) for a job on a
    profile without GPUs; {} for a GPU job (its paths are the recipe's start-up paths)."""
    if not spec.local_cpu:
        return {}
    from cookbook.paths import cache_dir

    return {ASSETS_VARIABLE: spec.assets_dir or str(cache_dir() / "tiny")}


def shims_module(spec: JobSpec) -> str:
    """The module the job's frameworks run through: its profile's ``shims``, else (a profile without GPUs that
    does not extend ``local-cpu``) the built-in ``local-cpu`` profile's."""
    shims = spec.profile_info.shims or profiles(builtin_only=True)[LOCAL_CPU].shims
    if shims is None:
        raise ValueError(f"profiles/builtin.yaml: profile {LOCAL_CPU} names no shims")
    return shims


def shim_launch(spec: JobSpec, entry: str, args: tuple[str, ...], check: str = "", **variables: str) -> Launch:
    """``torchrun -m SHIMS ENTRY ARGS``: ``entry`` (e.g. ``torchtune``) run through the profile's shims, with
    the assets' variable before ``variables``."""
    return Launch(
        "torchrun", ("-m", shims_module(spec), entry, *args), {**assets_variables(spec), **variables}, check=check
    )
