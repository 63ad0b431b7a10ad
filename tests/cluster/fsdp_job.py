"""The 2-node FSDP job (local-cpu, tiny model) the gate and runtime cluster tests render into their own folder."""

from __future__ import annotations

import sys
from pathlib import Path

from cookbook.spec import JobSpec


def fsdp_spec(
    job_dir: Path, tiny_assets, name: str, max_steps: int, throttle: float = 0.0, overrides=None, **fields
) -> JobSpec:
    """Logs in ``job_dir/logs`` (the caller makes it: Slurm does not), runs in ``job_dir/run``, no periodic
    checkpoint, each step slowed by ``throttle`` seconds; ``overrides`` and ``fields`` change the rest."""
    base = {"max_steps": str(max_steps), "checkpoint_freq": "100", "throttle_seconds": str(throttle)}
    spec = {
        "recipe": "fsdp_llama3_1_8b",
        "profile": "local-cpu",
        "nodes": 2,
        "gpus_per_node": 0,
        "exclusive": False,
        "time": "00:10:00",
        "signal_seconds": 30,
        "log_dir": str(job_dir / "logs"),
        "run_dir": str(job_dir / "run"),
        "assets_dir": str(tiny_assets.root),
        "job_name": name,
        "venv": sys.prefix,
        "overrides": {**base, **(overrides or {})},
    }
    return JobSpec(**{**spec, **fields})
