"""Load a dataset sample through torchtune's real builder and tokenizer, and measure it.

Reports token lengths (untruncated), the share longer than ``max_seq_len``, how many packed sequences
torchtune's :class:`~torchtune.datasets.PackedDataset` makes, and whether the tokenizer matches the
model (vocabulary size, special-token ids against ``config.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cookbook.data.formats import DataError, DatasetSpec, RowProblem, read_rows, validate_rows

DEFAULT_TOKENIZER = "torchtune.models.llama3.llama3_tokenizer"


@dataclass(frozen=True)
class TokenizerSpec:
    """A torchtune tokenizer, as the recipe's ``tokenizer:`` block names it."""

    path: str
    special_tokens_path: str | None = None
    component: str = DEFAULT_TOKENIZER

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, component: str = DEFAULT_TOKENIZER) -> TokenizerSpec:
        """Meta's layout: ``original/tokenizer.model`` + ``tokenizer.json`` (special tokens)."""
        d = Path(model_dir)
        special = d / "tokenizer.json"
        return cls(str(d / "original" / "tokenizer.model"), str(special) if special.exists() else None, component)

    def config(self, max_seq_len: int | None = None) -> dict[str, Any]:
        cfg: dict[str, Any] = {"_component_": self.component, "path": self.path}
        if self.special_tokens_path:
            cfg["special_tokens_path"] = self.special_tokens_path
        if max_seq_len is not None:
            cfg["max_seq_len"] = max_seq_len
        return cfg

    def build(self, max_seq_len: int | None = None) -> Any:
        """Instantiate it with torchtune's own config machinery."""
        from omegaconf import OmegaConf
        from torchtune import config

        for p in (self.path, self.special_tokens_path):
            if p and not Path(p).exists():
                raise DataError(p, [RowProblem(None, None, "tokenizer file not found")])
        return config.instantiate(OmegaConf.create(self.config(max_seq_len)))


@dataclass(frozen=True)
class VocabCheck:
    """Tokenizer vs model ``config.json``."""

    tokenizer_vocab: int
    model_vocab: int | None
    max_special_id: int
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def check_vocab(tokenizer: Any, model_dir: str | Path) -> VocabCheck:
    """Vocabulary size and special-token ids of ``tokenizer`` against the model's config files."""
    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
    model_vocab = cfg.get("vocab_size")
    special: Mapping[str, int] = getattr(tokenizer, "special_tokens", {}) or {}
    max_special = max(special.values(), default=-1)
    tok_vocab = int(getattr(tokenizer, "vocab_size", max_special + 1))
    problems: list[str] = []
    if model_vocab is None:
        problems.append(f"{d / 'config.json'} has no vocab_size")
    else:
        if tok_vocab > model_vocab:
            problems.append(
                f"tokenizer has {tok_vocab} tokens but the model embeds only {model_vocab}: "
                "ids beyond that crash the embedding (wrong tokenizer for this model?)"
            )
        if max_special >= model_vocab:
            bad = [f"{k}={v}" for k, v in special.items() if v >= model_vocab]
            problems.append(f"special token ids >= vocab_size {model_vocab}: {', '.join(bad[:5])}")
    for key, attr in (("bos_token_id", "bos_id"), ("eos_token_id", "eos_id")):
        want, have = cfg.get(key), getattr(tokenizer, attr, None)
        if want is None or have is None:
            continue
        allowed = want if isinstance(want, list) else [want]
        stop = set(getattr(tokenizer, "stop_tokens", []) or [have])
        if key == "bos_token_id" and have not in allowed:
            problems.append(f"config.json {key}={want} but the tokenizer's {attr} is {have}")
        if key == "eos_token_id" and not (set(allowed) & (stop | {have})):
            problems.append(f"config.json {key}={want} shares no id with the tokenizer's stop tokens {sorted(stop)}")
    added = d / "tokenizer.json"
    if added.exists() and special:
        try:
            hf = {t["content"]: t["id"] for t in json.loads(added.read_text()).get("added_tokens", [])}
        except (ValueError, KeyError, TypeError):
            hf = {}
        if diff := [f"{k}: tokenizer {v}, {added.name} {hf[k]}" for k, v in special.items() if k in hf and hf[k] != v]:
            problems.append("special-token ids differ from the model's tokenizer.json: " + "; ".join(diff[:5]))
    return VocabCheck(tok_vocab, model_vocab, max_special, problems)


@dataclass
class DataReport:
    """What :func:`check_dataset` found."""

    spec: DatasetSpec
    rows_total: int | None
    rows_checked: int
    lengths: list[int]
    max_seq_len: int
    packed_sequences: int | None
    vocab: VocabCheck | None

    @property
    def truncated_share(self) -> float:
        return sum(n > self.max_seq_len for n in self.lengths) / max(len(self.lengths), 1)

    @property
    def packed_estimate(self) -> int | None:
        """Packed sequences for the whole dataset, extrapolated from the sample."""
        if self.packed_sequences is None:
            return None
        if not self.rows_total or not self.rows_checked:
            return self.packed_sequences
        return math.ceil(self.packed_sequences * self.rows_total / self.rows_checked)

    def summary(self) -> dict[str, Any]:
        import pandas as pd

        s = pd.Series(self.lengths, dtype="int64")
        return {
            "rows": self.rows_total if self.rows_total is not None else f">= {self.rows_checked} (streamed)",
            "rows checked": self.rows_checked,
            "tokens min/median/p95/max": f"{s.min()}/{int(s.median())}/{int(s.quantile(0.95))}/{s.max()}",
            "tokens total (sample)": int(s.sum()),
            f"truncated at max_seq_len={self.max_seq_len}": f"{self.truncated_share:.1%}",
            "packed sequences (estimate)": self.packed_estimate,
            "vocab": ("ok" if self.vocab.ok else "MISMATCH") + f" (tokenizer {self.vocab.tokenizer_vocab}, model "
            f"{self.vocab.model_vocab})"
            if self.vocab
            else "not checked (no --model-dir)",
        }

    def render(self) -> str:
        rows = [f"{k:<34} {v}" for k, v in self.summary().items()]
        if self.vocab and not self.vocab.ok:
            rows += [f"  ! {m}" for m in self.vocab.mismatches]
        return "\n".join(rows)

    def plot(self, ax: Any = None) -> Any:
        """Histogram of token lengths with the ``max_seq_len`` cut; returns the matplotlib Figure."""
        from matplotlib.figure import Figure

        fig = ax.figure if ax is not None else Figure(figsize=(6, 3.2))
        ax = ax or fig.add_subplot()
        ax.hist(self.lengths, bins=min(50, max(5, len(set(self.lengths)))), color="#4c72b0")
        ax.axvline(
            self.max_seq_len,
            color="#c44e52",
            linestyle="--",
            label=f"max_seq_len={self.max_seq_len} ({self.truncated_share:.1%} truncated)",
        )
        ax.set(
            xlabel="tokens per sample",
            ylabel="samples",
            title=f"{Path(self.spec.source).name} ({self.spec.style}, {self.rows_checked} rows)",
        )
        ax.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
        return fig


def build_dataset(spec: DatasetSpec, tokenizer: Any, packed: bool = False) -> Any:
    """The torchtune dataset exactly as the recipe's ``dataset:`` block would build it."""
    from omegaconf import OmegaConf
    from torchtune import config

    cfg = OmegaConf.create({"_component_": spec.component, **spec.builder_kwargs(), "packed": packed})
    return config.instantiate(cfg, tokenizer=tokenizer)


def check_dataset(
    spec: DatasetSpec,
    tokenizer: TokenizerSpec,
    *,
    max_seq_len: int = 2048,
    model_dir: str | Path | None = None,
    sample: int = 512,
) -> DataReport:
    """Validate rows, then tokenize a sample with torchtune's builder; raises :class:`DataError`."""
    from torch.utils.data import Subset
    from torchtune.datasets import PackedDataset

    rows = read_rows(spec, limit=None if spec.is_local else sample)
    validate_rows(spec, rows)
    tok = tokenizer.build(max_seq_len=None)
    ds = build_dataset(spec, tok)
    lengths = []
    for i in range(min(len(ds), sample)):  # the first ``sample`` rows: dataset index i is row i
        try:
            lengths.append(len(ds[i]["tokens"]))
        except Exception as e:  # noqa: BLE001 - name the row torchtune choked on
            line = rows.lines[i] if i < len(rows.lines) else None
            raise DataError(spec.source, [RowProblem(i, None, f"torchtune: {type(e).__name__}: {e}", line)]) from None
    sampled = Subset(build_dataset(spec, tokenizer.build(max_seq_len=max_seq_len)), list(range(len(lengths))))
    packed = len(PackedDataset(sampled, max_seq_len=max_seq_len, split_across_pack=spec.style == "text"))
    vocab = check_vocab(tok, model_dir) if model_dir else None
    return DataReport(spec, rows.total, len(lengths), lengths, max_seq_len, packed, vocab)
