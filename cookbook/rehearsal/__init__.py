"""Rehearse a rendered sbatch script on the real cluster: the same allocation, the launcher swapped for a
check on every node (GPUs, CPUs, rendezvous, paths, config, interface, container mounts)."""

from cookbook.rehearsal.rehearse import NodeReport, RehearsalError, RehearsalReport, manifest, rehearse, static_problems

__all__ = ["NodeReport", "RehearsalError", "RehearsalReport", "manifest", "rehearse", "static_problems"]
