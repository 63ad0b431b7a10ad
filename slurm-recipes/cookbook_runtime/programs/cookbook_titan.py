"""torchtitan 0.3.0 config functions for the cookbook's recipes
(``--module cookbook_runtime.programs.cookbook_titan --config NAME``).

torchtitan 0.3.0 has no TOML: a config is a Python function returning its Trainer.Config. These
start from torchtitan's own registry functions and change only what the recipe needs; everything
else stays overridable on the command line (``--section.key value``). Paths come from the
environment the sbatch script sets (TINY_DIR for the local-cpu variants).
"""

import os
from typing import Any  # torchtitan's Trainer.Config (the module loads without torchtitan for the check)


def checkpointed(cfg: Any) -> Any:
    """Checkpoints on, and the trainer that saves a full step-N on a stop request (the local bench's tiny configs
    use it too)."""
    from cookbook_runtime.programs.cookbook_titan_trainer import stoppable

    cfg.checkpoint.enable = True  # resume from the newest step-N after a requeue
    return stoppable(cfg)  # and save a full step-N on a stop request (preemption, time limit)


def _for_clusters(cfg: Any) -> Any:
    """What every GPU recipe changes from torchtitan's defaults, each for a reason a real run hits."""
    cfg.profiler.enable_profiling = False  # profile on request only (cookbook profiling overrides), not every 100 steps
    # 100 s (the default) is shorter than a checkpoint save to a shared filesystem: the collective after it
    # times out and kills the job; 300 s is torchtitan's own init timeout
    cfg.comm.train_timeout_seconds = 300
    return checkpointed(cfg)


def llama3_8b_c4() -> Any:
    """Llama-3.1-8B pretraining on C4 (the job of Crusoe's torchtitan guide, https://github.com/crusoecloud/distributed-torchrun-on-slurm/tree/main/torchtitan)."""
    from torchtitan.models.llama3.config_registry import llama3_8b

    cfg = llama3_8b()
    cfg.dataloader.dataset = "c4"
    return _for_clusters(cfg)


def llama3_8b_c4_tiny() -> Any:
    """local-cpu: torchtitan's debug Llama on the tiny C4-like folder, a few steps."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    tiny = os.environ.get("TINY_DIR", ".cache/tiny")
    cfg = llama3_debugmodel()
    cfg.hf_assets_path = f"{tiny}/hf_tokenizer"
    cfg.dataloader.dataset = "c4"
    cfg.dataloader.dataset_path = f"{tiny}/c4"
    cfg.training.local_batch_size = 2
    cfg.training.seq_len = 128
    cfg.training.steps = 4
    cfg.validator.enable = False
    cfg.checkpoint.interval = 2
    cfg.debug.seed = 0  # a fixed seed: a resumed run and an uninterrupted one are comparable step by step
    return checkpointed(cfg)


def flux_schnell() -> Any:
    """FLUX.1-schnell training on cc12m as the Nebius guide runs it (github.com/nebius/ml-cookbook,
    slurm/torchtitan/flux_schnell_model.toml): 32 images per GPU (torchtitan's default is 64), HSDP with
    one replica per node (the sbatch script passes data_parallel_replicate_degree=$SLURM_JOB_NUM_NODES;
    the shard degree fills the GPUs of a node)."""
    from torchtitan.models.flux.config_registry import flux_schnell as base

    cfg = base()
    cfg.training.local_batch_size = 32
    return _for_clusters(cfg)
