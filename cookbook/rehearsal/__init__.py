"""Rehearse a rendered sbatch script on the real cluster: the same allocation, the launcher swapped for a
check on every node (GPUs, CPUs, rendezvous, paths, config, interface, container mounts)."""

from cookbook.rehearsal.rehearse import (
    NodeReport,
    Rehearsal,
    RehearsalError,
    RehearsalReport,
    finish_rehearsal,
    manifest,
    rehearse,
    start_rehearsal,
    static_problems,
)

__all__ = [
    "NodeReport",
    "Rehearsal",
    "RehearsalError",
    "RehearsalReport",
    "finish_rehearsal",
    "manifest",
    "rehearse",
    "start_rehearsal",
    "static_problems",
]
