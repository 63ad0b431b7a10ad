"""The planner's view of each recipe: model, default job size and the settings its config ships with,
as each recipe states them (:meth:`cookbook.recipes.Recipe.planner_defaults`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cookbook.planner.estimate import Settings
from cookbook.planner.models import MODELS, ModelShape
from cookbook.recipes import list_recipes


@dataclass(frozen=True)
class RecipeDefaults:
    name: str
    model: str  # key into MODELS
    framework: str
    nodes: int
    gpus_per_node: int
    gpu: str
    settings: Settings
    source: str


def _defaults(name: str, framework: str, raw: Mapping[str, Any]) -> RecipeDefaults:
    """A recipe's :meth:`~cookbook.recipes.Recipe.planner_defaults` as the planner's record; an LLM recipe
    that names no ``seq_len`` trains at the model's full context."""
    settings = dict(raw["settings"])
    model = MODELS[raw["model"]]
    if "seq_len" not in settings and isinstance(model, ModelShape):  # an LLM (FLUX has no context)
        settings["seq_len"] = model.max_seq_len
    return RecipeDefaults(
        name,
        raw["model"],
        framework,
        raw["nodes"],
        raw["gpus_per_node"],
        raw["gpu"],
        replace(Settings(), **settings),
        raw["source"],
    )


# every registered recipe the planner has a model for (the numbers live on the recipe)
RECIPES: dict[str, RecipeDefaults] = {
    r.name: _defaults(r.name, r.framework, raw) for r in list_recipes() if (raw := r.planner_defaults()) is not None
}

# Shorthands for Settings fields that are no framework's config key.
_SHORTHANDS = {"local_batch_size": "micro_batch", "max_seq_len": "seq_len", "ac": "checkpointing", "rank": "lora_rank"}
# Config keys users pass as --set / recipe overrides (every framework's, from its recipe) -> Settings fields.
SETTING_KEYS: dict[str, str] = {**_SHORTHANDS, **{k: v for r in list_recipes() for k, v in r.planner_keys.items()}}

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _coerce(field: str, value: Any) -> Any:
    """Turn a config value (often a string from the command line) into the Settings field's type."""
    default = getattr(Settings(), field)
    text = str(value).lower()  # a bool too: "true" / "false"
    if field == "checkpointing":
        return ("full" if _BOOL_WORDS[text] else "none") if text in _BOOL_WORDS else text
    if field == "reshard_after_forward" and text in ("always", "never", "default"):
        return text != "never"
    if isinstance(default, bool):
        if text not in _BOOL_WORDS:
            raise ValueError(f"{field}: expected true/false, got {value!r}")
        return _BOOL_WORDS[text]
    if isinstance(default, int):
        if text in ("none", "null", "-1") and field == "tp":
            return 1
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{field}: expected a whole number, got {value!r}") from None
        if not math.isfinite(number) or number != int(number):  # int() of inf is an OverflowError
            raise ValueError(f"{field}: expected a whole number, got {value!r}")
        return max(int(number), 1) if field == "tp" else int(number)
    if isinstance(default, float):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(f"{field}: expected a finite number, got {value!r}")
        return number
    return str(value)


def settings_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``{config key or Settings field: value}`` to typed Settings fields; unknown keys raise."""
    known = set(Settings.__dataclass_fields__)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        field = key if key in known else SETTING_KEYS.get(key)
        if field is None:
            names = ", ".join(sorted(known | set(SETTING_KEYS)))
            raise ValueError(f"unknown setting {key!r}; use one of: {names}")
        out[field] = _coerce(field, value)
    return out


def ignorable_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Like :func:`settings_overrides` but silently drops keys that do not change memory or speed."""
    known = set(Settings.__dataclass_fields__) | set(SETTING_KEYS)
    return settings_overrides({k: v for k, v in raw.items() if k in known})


def lora_rank_problem(recipe: str, overrides: Mapping[str, Any]) -> str | None:
    """One line when ``overrides`` give ``recipe`` a LoRA rank (``lora_rank``, ``model.lora_rank`` ...) above its
    model's hidden size, the width of the smallest matrix an adapter factors; None otherwise (no rank, a rank
    that is no whole number, which the recipe's own checks report, or a recipe the planner does not know)."""
    model = MODELS.get(RECIPES[recipe].model) if recipe in RECIPES else None
    for key, value in overrides.items():
        if (key if key in Settings.__dataclass_fields__ else SETTING_KEYS.get(key)) != "lora_rank":
            continue
        try:
            rank = _coerce("lora_rank", value)
        except ValueError:
            return None
        if isinstance(model, ModelShape) and rank > model.hidden:
            return (
                f"{key}={value}: a LoRA rank cannot exceed the hidden size of {model.name} ({model.hidden}); "
                "give a smaller rank, e.g. 16"
            )
    return None


def recipe_defaults(name: str) -> RecipeDefaults:
    """The planner's defaults for recipe ``name`` (KeyError naming the known ones)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None
