"""Save on preemption for torchtitan 0.3.0: its Trainer (llama3) or FluxTrainer, stoppable at any step.

The cookbook's one change to torchtitan's training, in the job runtime beside ``cookbook_titan.py``
(whose config functions pass their config through :func:`stoppable`) and used by the GPU and the
``local-cpu`` scripts alike: ``config.build()`` then makes a subclass of the config's own trainer that

- asks the stop protocol (``cookbook_runtime.rank.StopRequest``) at every step
  boundary (torchtitan calls ``should_continue_training()`` after each step's periodic save); when the
  ranks agree on a stop it writes a FULL checkpoint at the current step through torchtitan's own
  checkpointer (model, optimizer, LR schedulers, dataloader position, train state: torchtitan's
  ``last_save_model_only`` would write the model alone, so it is switched off for this save), logs
  ``cookbook: saved at step N for preemption: PATH`` and ends training; the job exits 0 and requeues,
  and torchtitan loads that ``step-N`` on restart (``checkpoint.enable``);
- checkpoints each rank's random number generator state (``cookbook_rng``: CPU, and CUDA where there is
  one), so a resumed run draws the same numbers an uninterrupted one would (FLUX samples timesteps and
  noise every step). Loading a checkpoint written without it: ``--checkpoint.exclude_from_loading
  cookbook_rng``.

A stop is checked only after this run's first step (a run stopped before it has nothing new to save).

With ``--tracker mlflow`` (``COOKBOOK_TRACKER=mlflow`` in the job's environment) the trainer also logs
torchtitan's metrics to MLflow (:class:`MLflowLogger`): torchtitan 0.3.0 has TensorBoard and W&B loggers only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from typing import Any

from cookbook_runtime.rank import StopRequest, hang_step  # the job puts the runtime on PYTHONPATH

RNG_STATE = "cookbook_rng"  # the checkpoint key of the RNG states


def stoppable(cfg: Any) -> Any:
    """``cfg`` (a ``Trainer.Config`` or a subclass such as ``FluxTrainer.Config``) as the same values in the
    config of :func:`stoppable_trainer` of its trainer."""
    owner = type(cfg)._owner
    if getattr(owner, "cookbook_stoppable", False):
        return cfg
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    return stoppable_trainer(owner).Config(**values)


class RngState:
    """This rank's RNG states, under a per-rank key (DCP keeps one copy of a key all ranks share).

    A loaded state is applied once the data iterator exists: creating it draws a number from the RNG
    (the DataLoader's base seed), which the uninterrupted run did before its first step."""

    def __init__(self, rank: int) -> None:
        self.key = f"rank{rank}"
        self.pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The CPU (and CUDA) generator states under this rank's key."""
        import torch

        out = {f"{self.key}_cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            out[f"{self.key}_cuda"] = torch.cuda.get_rng_state()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a loaded state until :meth:`apply_pending`."""
        self.pending = {k: v.clone() for k, v in state.items()}

    def apply_pending(self) -> None:
        """Set the loaded state, once."""
        import torch

        if self.pending is None:
            return
        torch.set_rng_state(self.pending[f"{self.key}_cpu"])
        if f"{self.key}_cuda" in self.pending:
            torch.cuda.set_rng_state(self.pending[f"{self.key}_cuda"])
        self.pending = None


class IterThenRestore:
    """``data_iterable`` whose ``iter()`` applies the loaded RNG state right after creating the iterator."""

    def __init__(self, data_iterable: Any, rng: RngState | None) -> None:
        self.data_iterable, self.rng = data_iterable, rng

    def __iter__(self) -> Any:
        iterator = iter(self.data_iterable)
        if self.rng is not None:
            self.rng.apply_pending()
        return iterator


@functools.cache
def stoppable_trainer(owner: Any) -> Any:
    """A subclass of torchtitan's trainer class ``owner`` that saves and stops on a stop request."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(owner.Config):  # type: ignore[misc]  # torchtitan's class, untyped here; same fields: only build() makes the subclass
        pass

    def __init__(self: Any, config: Any) -> None:
        owner.__init__(self, config)
        self._cookbook_stop = StopRequest()
        self._cookbook_first_step = None  # the step this run starts from, set before its first step
        self._cookbook_rng = None
        ckpt = self.checkpointer
        if getattr(ckpt, "enable", False):
            self._cookbook_rng = ckpt.states[RNG_STATE] = RngState(_rank())
        elif _rank() == 0:
            print("cookbook: checkpoint.enable is off: a stop request cannot save; training goes on", flush=True)
        if os.environ.get("COOKBOOK_TRACKER") == "mlflow":
            log_to_mlflow(self, config)

    def should_continue_training(self: Any) -> bool:
        hang_step(self.step)
        if not owner.should_continue_training(self):
            return False  # the last step: torchtitan has saved it (interval or last step)
        if self._cookbook_first_step is None:
            self._cookbook_first_step = self.step  # before this run's first step: nothing new to save
            return True
        if self.step == self._cookbook_first_step or not getattr(self.checkpointer, "enable", False):
            return True
        # collective every N steps (N from the step time and the lead time): no host sync at every step
        if not self._cookbook_stop.should_stop(self.step):
            return True
        self._cookbook_stop.saved(self.step, save_full(self.checkpointer, self.step))
        return False

    def batch_generator(self: Any, data_iterable: Any) -> Any:
        return owner.batch_generator(self, IterThenRestore(data_iterable, self._cookbook_rng))

    name = f"Stoppable{owner.__name__}"
    cls = type(
        name,
        (owner,),
        {
            "__doc__": f"torchtitan's {owner.__name__}, saving a full checkpoint and stopping on a stop request.",
            "__module__": __name__,
            "__qualname__": name,
            "Config": Config,
            "cookbook_stoppable": True,
            "__init__": __init__,
            "should_continue_training": should_continue_training,
            "batch_generator": batch_generator,
        },
    )
    Config.__qualname__ = f"{name}.Config"
    return cls


def save_full(checkpointer: Any, step: int) -> str:
    """A complete, resumable checkpoint at ``step`` (unless this step's periodic one is it); its folder."""
    periodic = step % checkpointer.interval == 0 or (step == 1 and checkpointer.enable_first_step_checkpoint)
    if not periodic:
        # last_step=True forces a save at any step; with last_save_model_only off it holds every state
        model_only, in_hf = checkpointer.last_save_model_only, checkpointer.last_save_in_hf
        checkpointer.last_save_model_only = checkpointer.last_save_in_hf = False
        try:
            checkpointer.save(step, last_step=True)
        finally:
            checkpointer.last_save_model_only, checkpointer.last_save_in_hf = model_only, in_hf
    checkpointer.maybe_wait_for_saving()  # an async periodic save of this step must be on disk first
    return str(checkpointer._create_checkpoint_id(step))


class MLflowLogger:
    """torchtitan's metrics logger interface (``log(metrics, step)``, ``close()``, as its ``BaseLogger``) writing
    to the MLflow run the job script created for this training run (``MLFLOW_RUN_ID``, named
    ``<job name>-<first job id>``: a requeued job logs into the same run). The tracking URI, experiment and
    credentials (``MLFLOW_TRACKING_URI``, ``MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN``) are MLflow's own
    environment at run time."""

    def __init__(self, run_id: str | None = None) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient()
        self.run_id = run_id or os.environ["MLFLOW_RUN_ID"]
        self.client.update_run(self.run_id, status="RUNNING")  # a requeue's start reopens the finished run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue  # torchtitan logs numbers; anything else is not a metric
            batch.append(Metric(key=metric_name(key), value=number, timestamp=now, step=step))
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def metric_name(key: str) -> str:
    """torchtitan's metric key as an MLflow metric name (``memory/max_active(GiB)`` -> ``memory/max_active_GiB_``):
    MLflow takes letters, digits, ``_ - . /`` and spaces."""
    return re.sub(r"[^\w\-. /]", "_", key)


def log_to_mlflow(trainer: Any, config: Any) -> None:
    """Add :class:`MLflowLogger` to the trainer's metrics loggers on the rank torchtitan logs metrics from
    (rank 0, or the last pipeline stage's first rank), beside whatever torchtitan built."""
    import torch
    from torchtitan.components.metrics import LoggerContainer, _get_metrics_rank

    pp_schedule = config.parallelism.pipeline_parallel_schedule
    rank = _get_metrics_rank(parallel_dims=trainer.parallel_dims, pp_schedule=pp_schedule)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != rank:
        return
    loggers = LoggerContainer()
    loggers.add_logger(trainer.metrics_processor.logger)
    loggers.add_logger(MLflowLogger())
    trainer.metrics_processor.logger = loggers


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))  # torchrun's global rank
