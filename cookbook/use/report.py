"""What a "use" job left, as tables and figures for the notebooks: generations side by side, the held-out loss
before vs after, FLUX samples as a grid, and whether a merged folder loads with ``transformers``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

RESULT = "use.json"  # written by cookbook_runtime.programs.use_lm (its RESULT)
IMAGES = "images"  # the flux_schnell_use job's folder of samples, under its run folder


@dataclass
class UseResult:
    """The ``use.json`` of a ``*_use`` job (see :func:`cookbook_runtime.programs.use_lm.run`)."""

    data: dict[str, Any]
    path: Path

    @classmethod
    def load(cls, run_dir: str | Path) -> UseResult:
        path = Path(run_dir) / RESULT
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the use job wrote no results (its log says why)")
        return cls(json.loads(path.read_text()), path)

    @property
    def merged(self) -> Path | None:
        return Path(self.data["merged"]) if self.data.get("merged") else None

    def generations(self) -> pd.DataFrame:
        """One row per prompt: the prompt, the dataset's answer, the base model's and the fine-tuned model's."""
        import pandas as pd

        rows = [
            {"prompt": g["prompt"], "reference": g["reference"], "base": g["base"], "fine-tuned": g["tuned"]}
            for g in self.data["generations"]
        ]
        return pd.DataFrame(rows, columns=["prompt", "reference", "base", "fine-tuned"])

    def heldout(self) -> pd.DataFrame:
        """Held-out loss and perplexity, before (base) and after (fine-tuned)."""
        import pandas as pd

        h = self.data["heldout"]
        df = pd.DataFrame(
            {
                "model": ["base", "fine-tuned"],
                "held-out loss": [h["base_loss"], h["tuned_loss"]],
                "perplexity": [h["base_ppl"], h["tuned_ppl"]],
            }
        ).set_index("model")
        df.attrs["split"] = h["split"]
        return df

    def caption(self) -> str:
        h = self.data["heldout"]
        seen = (
            "; these rows were also trained on (train on dataset.split=train[:90%] for a true held-out set)"
            if h["trained_on"]
            else ""
        )
        return f"{self.data['kind']} fine-tune {self.data['checkpoint']}; held-out {h['split']}, {h['rows']} rows{seen}"

    def plot(self) -> Figure:
        """Bars: held-out loss and perplexity, base vs fine-tuned."""
        from matplotlib.figure import Figure

        df = self.heldout()
        fig = Figure(figsize=(8, 3), layout="constrained")  # no pyplot state: a cell shows it once
        axes = fig.subplots(1, 2)
        for ax, col in zip(axes, df.columns):
            ax.bar(df.index, df[col], color=["#999999", "#1f77b4"])
            ax.set_title(col)
            for i, v in enumerate(df[col]):
                ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom")
        fig.suptitle(f"held-out {df.attrs['split']}: before vs after")
        return fig

    def summary(self) -> str:
        h = self.data["heldout"]
        lines = [
            self.caption(),
            f"held-out loss {h['base_loss']:.4f} -> {h['tuned_loss']:.4f} "
            f"(perplexity {h['base_ppl']:.2f} -> {h['tuned_ppl']:.2f})",
        ]
        if self.merged:
            lines.append(f"merged model (HF layout): {self.merged}")
        return "\n".join(lines)


def loads_with_transformers(folder: str | Path) -> str:
    """Load ``folder`` with ``AutoModelForCausalLM`` (on CPU, its own dtype) and say what came back."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the notebook shows the answer, not a loading bar
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto")
    n = sum(p.numel() for p in model.parameters())
    return f"{folder}: transformers loads it as {type(model).__name__}, {n:,} parameters"


def sampled_images(run_dir: str | Path) -> list[Path]:
    """The images a ``flux_schnell_use`` job wrote (``image_prompt<N>_rank<R>.png``), in prompt order."""
    folder = Path(run_dir) / IMAGES
    found = list(folder.glob("image_prompt*_rank*.png")) if folder.is_dir() else []
    if not found:
        raise FileNotFoundError(f"{folder}: no sampled images (the use job's log says why)")
    return sorted(found, key=lambda p: int(re.search(r"prompt(\d+)", p.name).group(1)))  # type: ignore[union-attr]


def image_grid(run_dir: str | Path, captions: list[str] | None = None, columns: int = 4) -> Figure:
    """The sampled images as a grid, each titled with its caption (torchtitan writes the caption into the
    image's EXIF ImageDescription); the figure is also saved as ``images/grid.png``."""
    from matplotlib.figure import Figure
    from PIL import ExifTags, Image

    paths = sampled_images(run_dir)
    rows = (len(paths) + columns - 1) // columns
    fig = Figure(figsize=(3 * columns, 3 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, (ax, path) in enumerate(zip(axes.flat, paths)):
        with Image.open(path) as img:
            caption = (captions or [])[i] if captions and i < len(captions) else ""
            caption = caption or str(img.getexif().get(ExifTags.Base.ImageDescription, "")).strip()
            ax.imshow(img.convert("RGB"))
        ax.set_title(caption[:40], fontsize=8)
    fig.savefig(Path(run_dir) / IMAGES / "grid.png", dpi=80)
    return fig
