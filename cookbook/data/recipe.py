"""The recipe's ``dataset:`` block for a :class:`DatasetSpec`, as YAML or as override strings."""

from __future__ import annotations

import shlex
from typing import Any

from cookbook.data.formats import DatasetSpec


def dataset_block(spec: DatasetSpec, *, packed: bool = False, train_on_input: bool | None = None) -> dict[str, Any]:
    """The ``dataset:`` mapping a torchtune recipe config takes."""
    block: dict[str, Any] = {"_component_": spec.component, **spec.builder_kwargs(), "packed": packed}
    if train_on_input is not None and spec.style != "text":
        block["train_on_input"] = train_on_input
    return block


def dataset_yaml(spec: DatasetSpec, *, packed: bool = False, max_seq_len: int | None = None) -> str:
    """YAML text of the ``dataset:`` block (plus ``tokenizer.max_seq_len``, which packing needs)."""
    from omegaconf import OmegaConf

    cfg: dict[str, Any] = {"dataset": dataset_block(spec, packed=packed)}
    if max_seq_len is not None:
        cfg["tokenizer"] = {"max_seq_len": max_seq_len}
    return OmegaConf.to_yaml(OmegaConf.create(cfg))


def dataset_overrides(spec: DatasetSpec, *, packed: bool = False, max_seq_len: int | None = None) -> list[str]:
    """``key=value`` overrides for ``tune run`` (nested keys dotted; dicts as ``{a: b}``)."""
    out: list[str] = []
    for key, value in dataset_block(spec, packed=packed).items():
        if isinstance(value, dict):
            out += [f"dataset.{key}.{k}={v}" for k, v in value.items()]
        else:
            out.append(f"dataset.{key}={_scalar(value)}")
    if max_seq_len is not None:
        out.append(f"tokenizer.max_seq_len={max_seq_len}")
    return out


def overrides_text(overrides: list[str]) -> str:
    """Overrides quoted for a shell command line."""
    return " ".join(shlex.quote(o) for o in overrides)


def _scalar(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
