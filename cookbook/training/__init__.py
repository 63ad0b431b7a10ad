"""Training programs the recipes launch.

``fsdp_train`` is a single self-contained file (it imports nothing from ``cookbook``), so the
rendered ``slurm-recipes/fsdp/train.py`` is an exact copy that runs anywhere torch, transformers
and datasets are installed.
"""
