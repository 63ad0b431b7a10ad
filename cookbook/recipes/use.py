"""Jobs that use what a training recipe produced, rendered and submitted like training (no second launcher).

- ``llama3_3_70b_full_use`` / ``llama3_3_70b_lora_use``: the runtime's :mod:`cookbook_runtime.programs.use_lm`
  on one node: the base and the fine-tuned model side by side on held-out prompts with the
  training's chat template, held-out loss/perplexity before vs after, and for LoRA ``--set merge=DIR`` writes the
  merged model in HF layout. Overrides are the program's flags, checked by its own parser. ``TRAINED_DIR`` is the
  training run folder (default: where the ``slurm-recipes/torchtune`` script of the same profile writes it),
  ``MODEL_DIR`` the base model.
- ``flux_schnell_use``: torchtitan's FLUX sampling (``torchtitan.models.flux.inference.infer``) on the newest
  checkpoint of the training run ``TRAINED_DIR``, with the training's own config; images in ``$RUN_DIR/images``.
  Overrides are torchtitan keys (``inference.img_size``...), checked by torchtitan's parser.

What the job will load is checked when it renders, on the login node, cheaply (file listings and safetensors
headers, never the weights): the run folder holds a checkpoint (torchtune's ``epoch_N/`` with its files, a LoRA
adapter whose shapes fit the base model; torchtitan's ``checkpoint/step-N/.metadata``), the prompt file is UTF-8.
Each problem is one line of :class:`cookbook.spec.SpecError` (``cookbook render`` exits 2; nothing is submitted).
A path this machine cannot see is left to the job (a warning); with ``--dependency`` the checks are warnings
(the training may still be writing the checkpoint). The FLUX script also refuses by itself, before torchrun, when
the run has no checkpoint (torchtitan would otherwise sample from random weights).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from cookbook.recipes.base import Launch, Recipe, StartPath, path_problem, program_file, register_recipe, resolve_here
from cookbook.recipes.shims import assets_variables, shim_launch
from cookbook.recipes.torchtitan import FluxSchnell, cli_args
from cookbook.spec import JobSpec

PROGRAM = "use_lm.py"  # in the runtime's programs
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
_MISSING = "give the folder or file the job should read, or leave the key out"
# the FLUX job without a checkpoint: the render-time problem and the script's own refusal say the same
FLUX_NO_CHECKPOINT = (
    "no checkpoint in {folder} (no step-N/ with .metadata): torchtitan would sample from random weights; "
    "point TRAINED_DIR (--set dump_folder=) at a flux_schnell run folder that saved one"
)


def here(recipe: Recipe, spec: JobSpec, value: str | None) -> Path | None:
    """``value`` (a start path or a program flag, ``$VARIABLES`` and all) as an absolute path on this machine; None
    when this machine cannot know it (an unknown variable, ``$RECIPE_DIR`` before the script has a folder)."""
    if not value or (spec.recipe_dir is None and "RECIPE_DIR" in value):
        return None
    path = resolve_here(value, spec, recipe.command(spec).variables)
    return Path(path) if path and path.startswith("/") else None


def as_warnings(spec: JobSpec, problems: list[str]) -> list[str]:
    """With ``--dependency`` the training may still be writing what the job reads: its problems only warn."""
    return [f"{p} (the job starts after {spec.dependency}: it may be there by then)" for p in problems]


def _trained_default(train: str, spec: JobSpec) -> str:
    """Where the ``slurm-recipes`` training script of this profile writes its run (``RUN_DIR``); the FLUX
    scripts share ``slurm-recipes/torchtitan/`` with the training's, the others live in ``slurm-recipes/use/``."""
    run = f"runs/{train}-{spec.profile}".replace("_", "-")
    return f"$RECIPE_DIR/{run}" if train == "flux_schnell" else f"$RECIPE_DIR/../torchtune/{run}"


class TorchtuneUse(Recipe):
    """``<training recipe>_use``: generate and evaluate with the base and the fine-tuned model."""

    framework = "use"
    packages = ("torch", "torchtune")
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
        from cookbook_runtime.programs.use_lm import build_parser

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
        ns = self.parsed(spec)
        if isinstance(ns, str):
            return [ns]
        for flag in ("rows", "max_new_tokens", "eval_rows"):
            if getattr(ns, flag) < 1:
                problems.append(f"{flag}={getattr(ns, flag)}: use a positive integer")
        for key in ("trained", "base", "checkpoint", "prompts", "config"):
            if key in spec.overrides and (found := path_problem(key, spec.overrides[key], _MISSING)):
                problems.append(found)
        if problems or spec.dependency:
            return problems
        return self.input_problems(spec, ns)

    def warnings(self, spec: JobSpec) -> list[str]:
        ns = self.parsed(spec)
        return as_warnings(spec, self.input_problems(spec, ns)) if spec.dependency and not isinstance(ns, str) else []

    def parsed(self, spec: JobSpec) -> argparse.Namespace | str:
        """The program's flags as its own parser reads them, or the one line it rejects them with."""
        from cookbook_runtime.programs.use_lm import build_parser

        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return build_parser().parse_args([f"--{k}={v}" for k, v in self.program_args(spec).items()])
        except SystemExit:
            return f"{PROGRAM} rejects the overrides: {(err.getvalue().strip().splitlines() or ['?'])[-1]}"

    def input_problems(self, spec: JobSpec, ns: argparse.Namespace) -> list[str]:
        """What the job would refuse, found here with the job's own checks (:mod:`cookbook_runtime.programs.use_lm`):
        the checkpoint it loads and its files, the training config, a LoRA adapter's shapes against the base model's
        (safetensors headers only), the prompt file's text. Paths this machine cannot see are skipped."""
        from cookbook_runtime.programs import use_lm as lm_job

        problems: list[str] = []

        def check(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(*args)
            except lm_job.UseError as e:
                problems.append(str(e))
                return None

        seen = {k: here(self, spec, getattr(ns, k)) for k in ("trained", "base", "checkpoint", "prompts", "config")}
        visible = {k: v for k, v in seen.items() if v is not None and v.exists()}
        if "prompts" in visible:
            check(lm_job.read_prompts, visible["prompts"])
        run = visible.get("trained")
        ckpt = None
        if "checkpoint" in visible:
            ckpt = check(lm_job.checkpoint_of, visible["checkpoint"].parent, visible["checkpoint"])
        elif run is not None and not ns.checkpoint:
            ckpt = check(lm_job.checkpoint_of, run)
        if run is not None and (visible.get("config") or not ns.config):
            check(lm_job.config_file, run, visible.get("config"))
        if ckpt is not None and lm_job.is_adapter(ckpt) and "base" in visible and visible["base"].is_dir():
            check(lm_job.check_lora, ckpt, visible["base"])
        return problems

    def command(self, spec: JobSpec) -> Launch:
        variables = {**assets_variables(spec), **self.start_variables(spec)}
        args = tuple(f"--{k}={v}" for k, v in self.program_args(spec).items())
        return Launch("torchrun", (program_file(PROGRAM), *args), variables)


class FluxSchnellUse(FluxSchnell):
    """``flux_schnell_use``: images sampled from the newest checkpoint of a ``flux_schnell`` run."""

    name = "flux_schnell_use"
    description = "use the flux_schnell output: images sampled from its newest checkpoint (torchtitan's FLUX sampling)"
    script_nodes: ClassVar[int] = 1
    trains: ClassVar[bool] = False  # sampling runs again whenever it is submitted
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

    def validate(self, spec: JobSpec) -> list[str]:
        problems = super().validate(spec)
        if "dump_folder" in spec.overrides and (
            found := path_problem("dump_folder", spec.overrides["dump_folder"], _MISSING)
        ):
            problems.append(found)
        if problems or spec.dependency:
            return problems
        return self.input_problems(spec)

    def warnings(self, spec: JobSpec) -> list[str]:
        return super().warnings(spec) + (as_warnings(spec, self.input_problems(spec)) if spec.dependency else [])

    def checkpoint_folder(self, spec: JobSpec) -> str:
        """The run's checkpoint folder, relative to the run folder (torchtitan's ``checkpoint.folder``)."""
        return spec.overrides.get("checkpoint.folder", "checkpoint").strip("/")

    def input_problems(self, spec: JobSpec) -> list[str]:
        """A run folder (seen here) without a complete checkpoint, a prompt file that is not UTF-8 text."""
        from cookbook_runtime.programs import use_lm as lm_job

        problems = []
        run = here(self, spec, self.start_path_values(spec)["dump_folder"])
        folder = run / self.checkpoint_folder(spec) if run else None
        if run is not None and run.is_dir() and folder is not None and not any(folder.glob("step-*/.metadata")):
            problems.append(FLUX_NO_CHECKPOINT.format(folder=folder))
        prompts = here(self, spec, spec.overrides.get("inference.prompts_path"))
        if prompts is not None and prompts.exists():
            try:
                lm_job.read_prompts(prompts)
            except lm_job.UseError as e:
                problems.append(str(e))
        return problems

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
        args: list[str] = ["--module", self.module_name(spec), "--config", self.config_name(spec)]
        user = {k: v for k, v in spec.overrides.items() if k not in self.start_args(spec)}
        args += cli_args({**self.start_args(spec), **self.launch_overrides(spec), **user})
        if spec.local_cpu:
            return shim_launch(
                spec, "torchtitan-flux-infer", tuple(args), self.check(spec), **self.start_variables(spec)
            )
        return Launch("torchrun", ("-m", FLUX_INFER, *args), self.start_variables(spec), check=self.check(spec))

    def check(self, spec: JobSpec) -> str:
        """The script's own refusal to sample without a checkpoint (for a script run without ``cookbook render``)."""
        folder = self.checkpoint_folder(spec)
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", folder):
            return ""  # a name bash would need quoting for: torchtitan alone decides
        message = FLUX_NO_CHECKPOINT.format(folder=f"$TRAINED_DIR/{folder}")
        return (
            "# --- the checkpoint to sample from (torchtitan alone would start from random weights)\n"
            f'if ! compgen -G "$TRAINED_DIR/{folder}/step-*/.metadata" > /dev/null; then\n'
            f'  echo "{self.name}: error: {message}" >&2\n'
            "  exit 2\n"
            "fi"
        )

    def resume(self, spec: JobSpec) -> list[str]:
        return []


register_recipe(TorchtuneUse("llama3_3_70b_full", "full", "Llama-3.3-70B-Instruct"))
register_recipe(TorchtuneUse("llama3_3_70b_lora", "lora", "Llama-3.3-70B-Instruct"))
register_recipe(FluxSchnellUse())
