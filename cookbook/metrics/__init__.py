"""Training metrics: every log becomes a DataFrame (live too), with MFU, ETA, diagnosis and plots.

df = parse_log("slurm-12.out")            # one row per step; df.attrs["skipped"] lists odd lines
LogFollower("slurm-12.out").poll()        # new rows of a growing log
add_derived(df, flops_per_token=planner_flops("llama3_1_8b", seq_len=8192)[0], gpu="H100"); eta(df)
diagnose("slurm-12.out")                  # known failures with a hint
plot_runs({"a": "a.log", "b": "b.log"}, out="cmp.png")
"""

import importlib
from typing import Any

from cookbook.gpus import peak_tflops
from cookbook.metrics.derived import add_derived, eta, tokens_seen
from cookbook.metrics.diagnose import Finding, diagnose, diagnose_text
from cookbook.metrics.follow import LogFollower
from cookbook.metrics.parse import best_source, parse_log, parse_text, read_tensorboard

# fmt: off
__all__ = [
    "Finding", "LogFollower", "add_derived", "best_source", "diagnose", "diagnose_text", "eta",
    "hf_config_flops_per_token", "parse_log", "parse_text", "peak_tflops", "planner_flops", "plot_runs", "plots",
    "read_tensorboard", "tokens_seen",
]
# fmt: on


# loaded on first use only (start-up speed and memory): matplotlib; the planner (its recipes table)
_LAZY = {"plots": ("cookbook.metrics.plots", None), "plot_runs": ("cookbook.metrics.plots", "plot_runs")} | {
    name: ("cookbook.planner.estimate", name) for name in ("planner_flops", "hf_config_flops_per_token")
}


def __getattr__(name: str) -> Any:
    """The names of ``_LAZY``, imported when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name][0])
    return getattr(module, attr) if (attr := _LAZY[name][1]) else module
