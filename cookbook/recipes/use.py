"""Jobs that use what a training recipe produced, rendered and submitted like training (no second launcher).

- ``llama3_3_70b_full_use`` / ``llama3_3_70b_lora_use``: :mod:`cookbook.use.lm_job` (written next to the script as
  ``use_lm.py``) on one node: the base and the fine-tuned model side by side on held-out prompts with the
  training's chat template, held-out loss/perplexity before vs after, and for LoRA ``--set merge=DIR`` writes the
  merged model in HF layout. Overrides are the program's flags, checked by its own parser. ``TRAINED_DIR`` is the
  training run folder (default: where the ``slurm-recipes/torchtune`` script of the same profile writes it),
  ``MODEL_DIR`` the base model.
- ``flux_schnell_use``: torchtitan's FLUX sampling (``torchtitan.models.flux.inference.infer``) on the newest
  checkpoint of the training run ``TRAINED_DIR``, with the training's own config; images in ``$RUN_DIR/images``.
  Overrides are torchtitan keys (``inference.img_size``...), checked by torchtitan's parser.
"""

from __future__ import annotations

import contextlib
import difflib
import io
from pathlib import Path
from typing import ClassVar

from cookbook.recipes.base import Launch, Recipe, StartPath, register_recipe
from cookbook.recipes.torchtitan import FluxSchnell, cli_args
from cookbook.spec import JobSpec

PROGRAM_FILE = Path(__file__).resolve().parent.parent / "use" / "lm_job.py"
PROGRAM = "use_lm.py"
FLUX_INFER = "torchtitan.models.flux.inference.infer"
FLUX_PROMPTS = "flux_prompts.txt"
# eight captions: torchtitan's sampling gives every rank at least one prompt (a node of 8 GPUs)
CAPTIONS = (
    "a red circle on a white background",
    "a photo of a lighthouse on a cliff at sunset",
    "a bowl of ramen, studio lighting",
    "a watercolor painting of a fox in the snow",
    "a city street at night in the rain",
    "a macro photo of a honeybee on a flower",
    "an isometric drawing of a small wooden house",
    "a sailing boat on a calm lake, morning mist",
)
# the program's flags the recipe sets (a start path's key changes its variable's default instead). The flags
# must not be prefixes of torchrun's own options (torchrun's argparse takes `--run=` for its --run-path).
_FIXED = {"out": "the job writes into its run folder ($RUN_DIR); set run_dir on the job instead"}


def program_text() -> str:
    return PROGRAM_FILE.read_text()


def _trained_default(train: str, spec: JobSpec) -> str:
    """Where the ``slurm-recipes`` training script of this profile writes its run (``RUN_DIR``); the FLUX
    scripts share ``slurm-recipes/torchtitan/`` with the training's, the others live in ``slurm-recipes/use/``."""
    run = f"runs/{train}-{spec.profile}".replace("_", "-")
    return f"$RECIPE_DIR/{run}" if train == "flux_schnell" else f"$RECIPE_DIR/../torchtune/{run}"


class TorchtuneUse(Recipe):
    """``<training recipe>_use``: generate and evaluate with the base and the fine-tuned model."""

    framework = "use"
    script_nodes: ClassVar[int] = 1
    trained_key: ClassVar[str] = "trained"  # the override naming the training run folder

    def __init__(self, train: str, kind: str, model_folder: str):
        self.train, self.kind, self.model_folder = train, kind, model_folder
        self.name = f"{train}_use"
        self.description = f"use the {train} output: base vs fine-tuned generations, held-out loss before/after" + (
            ", optional merge into an HF folder" if kind == "lora" else ""
        )

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        base = (
            StartPath("base", None, "$TINY_DIR/llama3", "dir", "the base model")
            if spec.local_cpu
            else StartPath(
                "base",
                "MODEL_DIR",
                f"$RECIPE_DIR/../torchtune/models/{self.model_folder}",
                "dir",
                f"the base model the training started from (the {self.model_folder} download)",
                ("config.json",),
            )
        )
        return [
            StartPath(
                "trained",
                "TRAINED_DIR",
                _trained_default(self.train, spec),
                "dir",
                f"the {self.train} run folder (its RUN_DIR: torchtune_config.yaml, epoch_N/)",
                ("torchtune_config.yaml",),
            ),
            base,
        ]

    def program_args(self, spec: JobSpec) -> dict[str, str]:
        user = {k: v for k, v in spec.overrides.items() if k not in ("trained", "base")}
        return {**self.start_args(spec), "out": "$RUN_DIR", **user}

    def validate(self, spec: JobSpec) -> list[str]:
        import argparse

        from cookbook.use.lm_job import build_parser

        parser = build_parser()
        known = [a.dest for a in parser._actions if a.dest != "help"]
        problems = []
        for key in spec.overrides:
            if key in _FIXED:
                problems.append(f"override {key!r} is set by the recipe: {_FIXED[key]}")
            elif key not in known:
                hint = difflib.get_close_matches(key, known, 3)
                problems.append(
                    f"override key {key!r} is not a flag of {PROGRAM}"
                    + (f": did you mean {' or '.join(hint)}?" if hint else f" (flags: {', '.join(known)})")
                )
        if self.kind == "full" and "merge" in spec.overrides:
            problems.append("merge: a full fine-tune is already a whole model in HF layout (merge is for LoRA)")
        if problems:
            return problems
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns: argparse.Namespace = parser.parse_args([f"--{k}={v}" for k, v in self.program_args(spec).items()])
        except SystemExit:
            return [f"{PROGRAM} rejects the overrides: {(err.getvalue().strip().splitlines() or ['?'])[-1]}"]
        for flag in ("rows", "max_new_tokens", "eval_rows"):
            if getattr(ns, flag) < 1:
                problems.append(f"{flag}={getattr(ns, flag)}: use a positive integer")
        return problems

    def files(self, spec: JobSpec) -> dict[str, str]:
        return {PROGRAM: program_text()}

    def command(self, spec: JobSpec) -> Launch:
        variables = {}
        if spec.local_cpu:
            from cookbook.paths import cache_dir

            variables["TINY_DIR"] = spec.assets_dir or str(cache_dir() / "tiny")
        variables.update(self.start_variables(spec))
        args = tuple(f"--{k}={v}" for k, v in self.program_args(spec).items())
        return Launch("torchrun", (f"$RECIPE_DIR/{PROGRAM}", *args), variables)


class FluxSchnellUse(FluxSchnell):
    """``flux_schnell_use``: images sampled from the newest checkpoint of a ``flux_schnell`` run."""

    name = "flux_schnell_use"
    description = "use the flux_schnell output: images sampled from its newest checkpoint (torchtitan's FLUX sampling)"
    script_nodes: ClassVar[int] = 1
    trained_key: ClassVar[str] = "dump_folder"  # torchtitan finds the checkpoints under it
    model_folder = "FLUX.1-schnell"

    def start_paths(self, spec: JobSpec) -> list[StartPath]:
        trained = StartPath(
            "dump_folder",
            "TRAINED_DIR",
            _trained_default("flux_schnell", spec),
            "dir",
            "the flux_schnell run folder (its RUN_DIR: checkpoint/step-N/)",
            ("checkpoint",),
        )
        return [trained, *super().start_paths(spec)]

    def launch_overrides(self, spec: JobSpec) -> dict[str, str]:
        return {
            **super().launch_overrides(spec),
            "inference.save_img_folder": "$RUN_DIR/images",
            "inference.prompts_path": f"$RECIPE_DIR/{FLUX_PROMPTS}",
            "inference.local_batch_size": "1",
            # the model's weights only: the dataloader's state is per data-parallel rank of the training
            "checkpoint.exclude_from_loading": "dataloader,optimizer,lr_scheduler",
            **({"inference.img_size": "32"} if spec.local_cpu else {}),
        }

    def expected_config(self, spec: JobSpec) -> dict[str, tuple[object, str]]:
        return {}

    def planner_defaults(self) -> None:
        return None  # sampling: nothing for the training planner to plan

    def files(self, spec: JobSpec) -> dict[str, str]:
        return {**super().files(spec), FLUX_PROMPTS: "\n".join(CAPTIONS) + "\n"}

    def command(self, spec: JobSpec) -> Launch:
        args: list[str] = ["--module", "cookbook_titan", "--config", self.config_name(spec)]
        user = {k: v for k, v in spec.overrides.items() if k not in self.start_args(spec)}
        args += cli_args({**self.start_args(spec), **self.launch_overrides(spec), **user})
        variables = {}
        if spec.local_cpu:
            from cookbook.paths import cache_dir

            variables["TINY_DIR"] = spec.assets_dir or str(cache_dir() / "tiny")
            variables.update(self.start_variables(spec))
            return Launch("torchrun", ("-m", "cookbook.local.compat.cpu", "torchtitan-flux-infer", *args), variables)
        return Launch("torchrun", ("-m", FLUX_INFER, *args), self.start_variables(spec))

    def resume(self, spec: JobSpec) -> str:
        return ""


register_recipe(TorchtuneUse("llama3_3_70b_full", "full", "Llama-3.3-70B-Instruct"))
register_recipe(TorchtuneUse("llama3_3_70b_lora", "lora", "Llama-3.3-70B-Instruct"))
register_recipe(FluxSchnellUse())
