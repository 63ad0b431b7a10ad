"""Compatibility shims, used only where a job needs them (``local-cpu``): see :mod:`cookbook.local.compat.cpu`."""

from cookbook.local.compat.cpu import VERIFIED_VERSIONS, CompatError, apply_shims, check_versions, cpu_launch_args

__all__ = ["VERIFIED_VERSIONS", "CompatError", "apply_shims", "check_versions", "cpu_launch_args"]
