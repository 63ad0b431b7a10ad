"""The programs a recipe's ranks run (torch and their framework; from the runtime, ``rank``/``hang``/``gpus`` only).

Held once, here; a job reaches them through ``RUNTIME_DIR`` (on ``PYTHONPATH``), never through a copy beside its
script:

- ``fsdp_train.py``: our plain-PyTorch FSDP2 training
  (``torchrun "$RUNTIME_DIR"/cookbook_runtime/programs/fsdp_train.py``)
- ``use_lm.py``: using a torchtune run's output: generations, held-out loss, the LoRA merge (``*_use`` jobs)
- ``cookbook_tune``: torchtune's recipes + save on preemption, mid-epoch resume (``tune run
  cookbook_runtime.programs.cookbook_tune RECIPE ...``)
- ``cookbook_titan``: torchtitan's config functions (``--module cookbook_runtime.programs.cookbook_titan``), whose
  trainer is ``cookbook_titan_trainer`` (stop-save, MLflow)

Importing this package imports none of them (they import torch).
"""
