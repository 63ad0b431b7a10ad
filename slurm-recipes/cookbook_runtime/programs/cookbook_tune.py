"""torchtune 0.6.1's full_finetune_distributed and lora_finetune_distributed, saving on preemption and
resuming mid-epoch: the cookbook's one change to torchtune (a subclass, not a fork).

Part of the job runtime (``cookbook_runtime.programs``; the script puts ``$RUNTIME_DIR`` on ``PYTHONPATH``);
needs torchtune, torch and nothing of the cookbook::

    tune run [torchrun flags] cookbook_runtime.programs.cookbook_tune RECIPE --config FILE key=value ...  # GPUs
    python -m cookbook.local.compat.cpu torchtune cookbook_runtime.programs.cookbook_tune RECIPE ...      # local-cpu

It loads torchtune's own recipe file (``recipes/RECIPE.py``) with runpy, subclasses its recipe class, puts the
subclass in the class's place and runs the file's own ``recipe_main``. What the subclass changes:

- Step boundary: the recipe calls ``self._profiler.step()`` once per optimizer step; the subclass wraps the
  profiler so that every rank then asks ``StopRequest.should_stop()`` (a collective: all ranks agree).
- Stop: it writes a complete checkpoint at that step (model or LoRA adapter, optimizer, LR scheduler, data
  position, global step; with the recipe state even in the last epoch, which torchtune's own save drops:
  ``intermediate_checkpoint = epoch + 1 < total_epochs``), logs ``cookbook: saved at step N for preemption:
  PATH`` and exits 0; the batch script requeues the job. A stop on an epoch's last step lets torchtune's own
  epoch-end save run (made complete) and stops after it.
- ``save_every_n_steps: N`` (config key, default off) writes the same checkpoint every N steps.
- ``throttle_seconds: S`` (config key, default 0) sleeps S at each step boundary (tests: a tiny model's
  steps take ~0.3 s, too fast for a signal to land mid-run), like the FSDP script's ``--throttle_seconds``.
- Resume: torchtune 0.6.1 restarts at the saved epoch's beginning (it saves the dataloader state but never
  loads it); the subclass restores the data position, the global step and the LR scheduler, and ends the
  resumed epoch after its remaining steps. A full finetune stopped in its first epoch (no ``epoch_N/`` yet)
  resumes too: torchtune's adapter lookup would fail on it (:func:`_resume_before_any_epoch_folder`).

Checkpoint layout: ``$output_dir/step_N/{epoch_E/..., recipe_state/recipe_state.pt}``, written by torchtune's
checkpointer under ``.step_N.partial`` and renamed when complete (older ``step_*`` folders are then removed).
``cookbook_runtime.resume`` resumes from the newest ``step_N`` whose recipe state is newer than torchtune's own
``recipe_state/recipe_state.pt`` with ``resume_from_checkpoint=True checkpointer.recipe_checkpoint=...`` and
the weights (full: ``checkpointer.checkpoint_files.filename_format``) or the adapter
(LoRA: ``checkpointer.adapter_checkpoint``) in that folder. Not restored: random-number state (dropout).
"""

from __future__ import annotations

import datetime
import functools
import importlib.util
import logging
import os
import runpy
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cookbook_runtime.files import SAVE_ENV
from cookbook_runtime.rank import StopRequest, hang_step  # the job puts the runtime on PYTHONPATH

TESTED_TORCHTUNE = "0.6.1"
RECIPES = {
    "full_finetune_distributed": "FullFinetuneRecipeDistributed",
    "lora_finetune_distributed": "LoRAFinetuneRecipeDistributed",
}
STATE_KEY = "cookbook_step"  # our part of recipe_state.pt: global step, steps done in the epoch, LR scheduler
log = logging.getLogger("cookbook_tune")


class Stopped(Exception):
    """Raised at a step boundary after the stop checkpoint is complete: leaves the training loop."""


class _StepHook:
    """The recipe's profiler, with a call after each ``step()``: the recipe's once-per-optimizer-step boundary."""

    def __init__(self, profiler: Any, after_step: Callable[[], None]) -> None:
        self._profiler, self._after_step = profiler, after_step

    def step(self) -> None:
        self._profiler.step()
        self._after_step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._profiler, name)


def _rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _say(line: str) -> None:
    if _rank0():
        print(f"cookbook: {line}", flush=True)


class StopAndResume:
    """Mixin put before torchtune's recipe class (see the module docstring)."""

    _cookbook_instance: StopAndResume | None = None
    # what the mixin uses of torchtune's recipe classes (annotations only: the recipe sets them)
    epochs_run: int
    global_step: int
    total_epochs: int
    seed: int
    _steps_per_epoch: int
    _cookbook_max_steps: int | None
    _cookbook_resume: dict[str, Any] | None
    _save_adapter_weights_only: bool
    _optimizer_in_bwd: bool
    _model: Any
    _optimizer: Any
    _optim_ckpt_wrapper: Any
    _checkpointer: Any
    _dataloader: Any
    _lr_scheduler: Any
    _profiler: Any
    _setup_lr_scheduler: Callable[..., Any]
    cleanup: Callable[[], None]

    # -------------------------------------------------------------- state read from the checkpoint
    def _update_recipe_state(self, ckpt_dict: dict[str, Any]) -> None:
        from torchtune import training

        self._cookbook_resume = ckpt_dict.get(STATE_KEY)
        self._cookbook_loader_state = ckpt_dict.get(training.DATALOADER_KEY)
        super()._update_recipe_state(ckpt_dict)  # type: ignore[misc]

    @property
    def max_steps_per_epoch(self) -> int | None:
        """The config's value, less the steps already done in a resumed epoch while that epoch runs (the recipe
        breaks out of an epoch when its batch index, which restarts at 0 on resume, reaches this)."""
        steps = self._cookbook_max_steps
        skip = getattr(self, "_cookbook_skip", None)
        if steps is not None and skip is not None and self.epochs_run == skip[0]:
            return int(steps - skip[1])
        return steps

    @max_steps_per_epoch.setter
    def max_steps_per_epoch(self, value: int | None) -> None:
        self._cookbook_max_steps = value

    # -------------------------------------------------------------- setup
    def setup(self, cfg: Any) -> None:
        StopAndResume._cookbook_instance = self
        self._cookbook_resume = getattr(self, "_cookbook_resume", None)
        self._cookbook_every = int(cfg.get("save_every_n_steps") or 0)
        self._cookbook_throttle = float(cfg.get("throttle_seconds") or 0)
        self._cookbook_out = str(cfg.output_dir)
        self._cookbook_stop = StopRequest()
        self._cookbook_pending = False  # a stop asked on an epoch's last step: stop after the epoch-end save
        self._cookbook_force_state = False  # write the recipe state with the next save even in the last epoch
        super().setup(cfg)  # type: ignore[misc]
        self._cookbook_epoch_start = self.global_step
        resume = self._cookbook_resume
        if resume and int(resume["steps_in_epoch"]) > 0:
            done = int(resume["steps_in_epoch"])
            self.global_step = int(resume["global_step"])
            self._cookbook_epoch_start = self.global_step - done
            self._cookbook_skip = (self.epochs_run, done)
            self._dataloader.load_state_dict(self._cookbook_loader_state)
            self._lr_scheduler = self._setup_lr_scheduler(
                cfg_lr_scheduler=cfg.get("lr_scheduler", None),
                num_training_steps=self.total_epochs * self._steps_per_epoch,
                last_epoch=self.global_step - 1,
            )
            if self._lr_scheduler is not None and resume.get("lr_scheduler") is not None:
                self._lr_scheduler.load_state_dict(resume["lr_scheduler"])
            _say(
                f"resumed at step {self.global_step} (epoch {self.epochs_run + 1}, {done} of "
                f"{self._steps_per_epoch} steps done in it)"
            )
        self._cookbook_wrap_saves()
        self._profiler = _StepHook(self._profiler, self._cookbook_step_boundary)

    def _cookbook_checkpointer(self) -> Any:
        client = getattr(self, "_checkpoint_client", None)
        return client._get_checkpointer() if client is not None else self._checkpointer

    def _cookbook_wrap_saves(self) -> None:
        """Every save: our state in recipe_state.pt (rank 0 writes it); an epoch-end save: epoch bookkeeping."""
        from torchtune import training

        checkpointer = self._cookbook_checkpointer()
        write = checkpointer.save_checkpoint

        def save_checkpoint(state_dict: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            if training.TOTAL_EPOCHS_KEY in state_dict:  # a save with the recipe state
                state_dict[training.TOTAL_EPOCHS_KEY] = self.total_epochs
                state_dict[training.MAX_STEPS_KEY] = self._cookbook_max_steps
                state_dict[STATE_KEY] = self._cookbook_state()
            write(state_dict, *args, **kwargs)

        checkpointer.save_checkpoint = save_checkpoint
        client = getattr(self, "_checkpoint_client", None)
        if client is not None:  # full: the recipe saves at epoch ends through its CheckpointClient
            epoch_end = client.save_checkpoint

            def client_save(model: Any, optimizer: Any, training_progress: Any, epoch: int) -> None:
                def save() -> None:
                    if self._cookbook_force_state:  # CheckpointClient decides `epoch + 1 < total_epochs`
                        training_progress.total_epochs = max(self.total_epochs, epoch + 2)
                    epoch_end(model, optimizer, training_progress, epoch)

                self._cookbook_epoch_end(save, epoch)

            client.save_checkpoint = client_save

    def save_checkpoint(self, epoch: int) -> None:
        """LoRA's epoch-end save (the full recipe has none of its own: see :meth:`_cookbook_wrap_saves`)."""
        parent = super().save_checkpoint  # type: ignore[misc]
        self._cookbook_epoch_end(lambda: self._cookbook_lora_save(parent, epoch), epoch)

    def _cookbook_lora_save(self, parent: Callable[..., None], epoch: int, adapter_only: bool | None = None) -> None:
        total, only = self.total_epochs, self._save_adapter_weights_only
        if self._cookbook_force_state:
            self.total_epochs = max(total, epoch + 2)  # LoRA decides `epoch + 1 < self.total_epochs`
        if adapter_only is not None:
            self._save_adapter_weights_only = adapter_only
        try:
            parent(epoch=epoch)
        finally:
            self.total_epochs, self._save_adapter_weights_only = total, only

    def _cookbook_state(self) -> dict[str, Any]:
        scheduler = getattr(self, "_lr_scheduler", None)
        return {
            "global_step": self.global_step,
            "steps_in_epoch": self.global_step - self._cookbook_epoch_start,
            "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
        }

    # -------------------------------------------------------------- epoch end
    def _cookbook_epoch_end(self, save: Callable[[], None], epoch: int) -> None:
        self._cookbook_epoch_start = self.global_step  # the state written now: 0 steps into epoch epochs_run
        self._cookbook_force_state = self._cookbook_pending
        try:
            save()
        finally:
            self._cookbook_force_state = False
        self._cookbook_remove_steps(keep=None)  # superseded by this epoch's checkpoint
        if self._cookbook_pending and self.epochs_run < self.total_epochs:
            self._cookbook_stop.saved(self.global_step, os.path.join(self._cookbook_out, f"epoch_{epoch}"))
            raise Stopped
        if self._cookbook_pending:
            _say(f"stop asked on the last step: the run is complete (epoch_{epoch}, with its recipe state)")

    # -------------------------------------------------------------- step boundary
    def _cookbook_step_boundary(self) -> None:
        time.sleep(self._cookbook_throttle)
        hang_step(self.global_step)
        stop = self._cookbook_stop.should_stop()  # collective: every rank, every step
        if self.global_step - self._cookbook_epoch_start >= self._steps_per_epoch:
            self._cookbook_pending = stop  # the epoch-end save comes next; stop after it
            return
        if stop or (self._cookbook_every and self.global_step % self._cookbook_every == 0):
            path = self._cookbook_save_step()
            if stop:
                self._cookbook_stop.saved(self.global_step, path)
                raise Stopped

    def _cookbook_save_step(self) -> str:
        """A complete checkpoint at this step: ``step_N/`` (written as ``.step_N.partial``, renamed when done)."""
        from torchtune.training.checkpointing._checkpoint_client import TrainingProgress

        step, epoch = self.global_step, self.epochs_run
        final = os.path.join(self._cookbook_out, f"step_{step}")
        partial = os.path.join(self._cookbook_out, f".step_{step}.partial")
        if _rank0():
            shutil.rmtree(partial, ignore_errors=True)
        checkpointer = self._cookbook_checkpointer()
        out_dir = checkpointer._output_dir
        checkpointer._output_dir = Path(partial)
        self._cookbook_force_state = True
        try:
            client = getattr(self, "_checkpoint_client", None)
            if client is not None:
                optimizer = self._optimizer if not self._optimizer_in_bwd else self._optim_ckpt_wrapper
                progress = TrainingProgress(
                    seed=self.seed,
                    epochs_run=epoch,
                    total_epochs=max(self.total_epochs, epoch + 2),  # with optimizer and recipe state
                    max_steps_per_epoch=self._cookbook_max_steps,
                    dataloader_state_dict=self._dataloader.state_dict(),
                )
                client._save_checkpoint_sync(self._model, optimizer, progress, epoch)  # synchronous on purpose
            else:
                base = super().save_checkpoint  # type: ignore[misc]
                self._cookbook_lora_save(base, epoch, adapter_only=True)  # the adapter: the base is unchanged
        finally:
            checkpointer._output_dir = out_dir
            self._cookbook_force_state = False
        if _rank0():
            shutil.rmtree(final, ignore_errors=True)
            os.rename(partial, final)
            self._cookbook_remove_steps(keep=final)
        _barrier()
        _say(f"checkpoint at step {step} (epoch {epoch + 1}): {final}")
        return final

    def _cookbook_remove_steps(self, keep: str | None) -> None:
        if not _rank0():
            return
        for path in Path(self._cookbook_out).glob("step_*"):
            if str(path) != keep and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)


def _recipe_file(name: str) -> str:
    spec = importlib.util.find_spec("recipes")  # torchtune ships its recipes as `recipes` (not importable)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("cookbook_tune: torchtune's recipes are not installed (pip install torchtune)")
    return os.path.join(list(spec.submodule_search_locations)[0], f"{name}.py")


def _resume_before_any_epoch_folder() -> None:
    """torchtune 0.6.1's HF checkpointers, resuming, look for an adapter in the newest ``epoch_N/`` of the output
    folder even for a full finetune, and fail (``os.path.join(output_dir, None)``) when there is none yet: a stop
    in the first epoch. There is then no adapter to find: the lookup answers None."""
    from torchtune.training.checkpointing import _checkpointer
    from torchtune.training.checkpointing._utils import get_largest_iter_folder

    lookup = _checkpointer.get_adapter_checkpoint_path

    def adapter_path(output_dir: Any, adapter_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        pattern = kwargs.get("pattern", r"^epoch_(\d+)")
        if not adapter_checkpoint and get_largest_iter_folder(output_dir, pattern=pattern) is None:
            return None
        return lookup(output_dir, adapter_checkpoint, *args, **kwargs)

    _checkpointer.get_adapter_checkpoint_path = adapter_path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in RECIPES:
        print(f"usage: cookbook_tune {{{','.join(RECIPES)}}} --config FILE [key=value ...]", file=sys.stderr)
        return 2
    import torchtune

    if torchtune.__version__.split("+")[0] != TESTED_TORCHTUNE:
        log.warning("cookbook_tune was tested with torchtune %s, not %s", TESTED_TORCHTUNE, torchtune.__version__)
    _resume_before_any_epoch_folder()
    name, path = args[0], _recipe_file(args[0])
    sys.argv = [path, *args[1:]]
    module = runpy.run_path(path, run_name=f"cookbook_tune_{name}")  # torchtune's file, not as __main__
    entry = module["recipe_main"]
    namespace = entry.__wrapped__.__globals__  # recipe_main looks its class up here when it runs
    base = namespace[RECIPES[name]]
    namespace[RECIPES[name]] = type(RECIPES[name], (StopAndResume, base), {"__doc__": base.__doc__})
    save_s = float(os.environ.get(SAVE_ENV) or 0)  # the model's stop-save time (cookbook_runtime.run --save-seconds)
    if save_s and "init_process_group" in namespace:
        # while rank 0 writes a stop-save the others wait in a collective: torch's 10-minute default would call a
        # 70B full save (~850 s) a timeout and kill the job; the hang watch has the same floor
        timeout = datetime.timedelta(seconds=max(600.0, 1.5 * save_s))
        namespace["init_process_group"] = functools.partial(namespace["init_process_group"], timeout=timeout)
    try:
        entry()  # torchtune's @config.parse wrapper parses sys.argv and calls sys.exit itself
    except Stopped:
        recipe = StopAndResume._cookbook_instance
        if recipe is not None:
            recipe._profiler.stop()
            recipe.cleanup()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
