"""A :class:`DatasetSpec` as a recipe's overrides (asked of the recipe: :meth:`Recipe.dataset_overrides`),
or as the YAML ``dataset:`` block of a torchtune config, or quoted for a shell command line."""

from __future__ import annotations

import shlex
from typing import Any

from cookbook.data.formats import DatasetSpec
from cookbook.recipes import get_recipe
from cookbook.recipes.torchtune import dataset_block

# the recipe a dataset is plugged into unless the caller names one (the torchtune recipes share the block)
DEFAULT_RECIPE = "llama3_3_70b_lora"


def dataset_overrides(
    spec: DatasetSpec, *, packed: bool = False, max_seq_len: int | None = None, recipe: str = DEFAULT_RECIPE
) -> dict[str, str]:
    """``{key: value}`` overrides that plug ``spec`` into ``recipe`` (ValueError: the recipe takes none)."""
    return get_recipe(recipe).dataset_overrides(spec, packed=packed, max_seq_len=max_seq_len)


def dataset_yaml(spec: DatasetSpec, *, packed: bool = False, max_seq_len: int | None = None) -> str:
    """YAML text of the ``dataset:`` block (plus ``tokenizer.max_seq_len``, which packing needs)."""
    from omegaconf import OmegaConf

    cfg: dict[str, Any] = {"dataset": dataset_block(spec, packed=packed)}
    if max_seq_len is not None:
        cfg["tokenizer"] = {"max_seq_len": max_seq_len}
    return OmegaConf.to_yaml(OmegaConf.create(cfg))


def overrides_text(overrides: dict[str, str]) -> str:
    """Overrides as ``key=value`` words quoted for a shell command line."""
    return " ".join(shlex.quote(f"{k}={v}") for k, v in overrides.items())
