"""Memory, throughput and time estimates for a recipe before it is submitted.

``plan(recipe, nodes, gpus_per_node, gpu, **settings) -> Plan``; ``suggest(...)``;
``fit_warning(...)`` / ``job_fit_warning(spec)``.
Model shapes (exact parameter counts) in :mod:`.models`, GPU kinds and MFU anchors in :mod:`.hardware`,
the memory/FLOPs formulas in :mod:`.estimate`, recipe defaults in :mod:`.recipes`.
"""

from cookbook.planner.core import Plan, Suggestion, fit_warning, job_fit_warning, plan, suggest
from cookbook.planner.estimate import MemoryBreakdown, Settings, estimate_memory, flops_per_token
from cookbook.planner.hardware import GPUS, GpuSpec, get_gpu
from cookbook.planner.models import MODELS, FluxShape, ModelShape, count_parameters, get_model, shape_from_config
from cookbook.planner.recipes import RECIPES, recipe_defaults, settings_overrides

__all__ = [
    "GPUS",
    "MODELS",
    "RECIPES",
    "FluxShape",
    "GpuSpec",
    "MemoryBreakdown",
    "ModelShape",
    "Plan",
    "Settings",
    "Suggestion",
    "count_parameters",
    "estimate_memory",
    "fit_warning",
    "flops_per_token",
    "job_fit_warning",
    "get_gpu",
    "get_model",
    "recipe_defaults",
    "plan",
    "settings_overrides",
    "shape_from_config",
    "suggest",
]
