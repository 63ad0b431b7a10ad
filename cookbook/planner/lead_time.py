"""How early Slurm must signal a job (``--signal=B:USR1@N``) for its stop-save to finish before the time limit:
the step in flight, the checkpoint written on the stop, the requeue. A recipe's GPU scripts get this lead time
unless the user sets ``--signal-seconds``; benchmarks/README.md ("Lead time") shows the figures it gives.

    N = max(MIN_SIGNAL_SECONDS, ceil_to_minute(STEP_SECONDS + REQUEUE_SECONDS + SAFETY * bytes / (writers * rate)))

What a stop writes, per framework (sizes from the planner's exact parameter counts):
- torchtune (``cookbook_tune.py``): bf16 weights + bf16 AdamW moments, 6 bytes per trained parameter (a LoRA
  stop saves the adapter and its optimizer only), gathered on rank 0's CPU and written by rank 0 alone;
- torchtitan and our FSDP script: DCP, fp32 weights + fp32 AdamW moments, 12 bytes per parameter, every node
  writing its shards in parallel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from cookbook.planner.estimate import lora_params
from cookbook.planner.models import MODELS, ModelShape
from cookbook.planner.recipes import ignorable_overrides, recipe_defaults
from cookbook_runtime.decide import MIN_SIGNAL_SECONDS as MIN_SIGNAL_SECONDS  # render.py reads it here
from cookbook_runtime.decide import stop_lead_seconds

# The assumptions, each with its reason (unmeasured on GPUs: replace WRITE_BYTES_PER_S with the site's rate); the
# step, requeue and minimum seconds are the runtime's (it sizes a stop for the model picked at run time the same way)
WRITE_BYTES_PER_S = 1e9  # one writer (a node's DCP shards, torchtune's rank 0) to the shared filesystem: 1 GB/s
SAFETY = 2.0  # the write rate is an assumption: twice the save it gives
BYTES_PER_PARAM = {"torchtune": 6, "torchtitan": 12, "fsdp": 12}


def stop_save_bytes(recipe: str, overrides: Mapping[str, str] | None = None) -> tuple[int, bool] | None:
    """``(bytes a stop writes, whether every node writes its share)`` for ``recipe`` with ``overrides`` (a
    ``lora_rank`` counts); None when the planner has no model for the recipe (a job using a trained model, a
    script of your own)."""
    try:
        defaults = recipe_defaults(recipe)
    except KeyError:
        return None
    per_param = BYTES_PER_PARAM.get(defaults.framework)
    if per_param is None:
        return None
    model = MODELS[defaults.model]
    try:
        settings = replace(defaults.settings, **ignorable_overrides(dict(overrides or {})))
    except (TypeError, ValueError):  # a bad override: the recipe's own checks report it
        settings = defaults.settings
    trained = model.total_params
    if settings.lora_rank > 0 and isinstance(model, ModelShape):
        trained = lora_params(model, settings)
    return per_param * trained, defaults.framework != "torchtune"


def largest_save_bytes(recipes: Sequence[str], overrides: Mapping[str, str] | None = None) -> int:
    """Bytes of the largest save a run of ``recipes`` writes at once: the stop-save, or torchtune's end-of-epoch
    weights (bf16, the whole model; a LoRA run whose config saves the adapter only -- our recipes' yaml,
    ``save_adapter_weights_only: true`` -- writes just the adapter). 0: no model to size. The runtime's
    ``--checkpoint-gb``, an estimate: the runtime warns when the run folder cannot hold it."""
    adapter_only = str((overrides or {}).get("save_adapter_weights_only", "true")).lower() not in ("false", "0", "no")
    largest = 0
    for name in recipes:
        save = stop_save_bytes(name, overrides)
        if save is None:
            continue
        defaults = recipe_defaults(name)
        lora = defaults.settings.lora_rank > 0
        whole = defaults.framework == "torchtune" and not (lora and adapter_only)
        weights = 2 * MODELS[defaults.model].total_params if whole else 0
        largest = max(largest, save[0], weights)
    return largest


def save_seconds(recipes: Sequence[str], nodes: int, overrides: Mapping[str, str] | None = None) -> float:
    """Seconds the stop-save of the largest of ``recipes`` takes on ``nodes`` nodes, with the safety factor
    (0: no model to size)."""
    longest = 0.0
    for name in recipes:
        save = stop_save_bytes(name, overrides)
        if save is not None:
            size, per_node = save
            longest = max(longest, SAFETY * size / ((max(nodes, 1) if per_node else 1) * WRITE_BYTES_PER_S))
    return longest


def signal_seconds(recipes: Sequence[str], nodes: int, overrides: Mapping[str, str] | None = None) -> int:
    """The lead time covering the stop-save of the largest of ``recipes`` (a script that runs any of several
    models names them all) on ``nodes`` nodes: see the module's formula."""
    return stop_lead_seconds(save_seconds(recipes, nodes, overrides))
