"""Slurm training cookbook: job specs -> validated sbatch scripts -> Slurm jobs -> metrics and plots."""

from cookbook.noise import quiet

__version__ = "0.1.0"

quiet()  # known third-party import noise (torchao, triton) filtered before any of them is imported


def __getattr__(name: str) -> object:
    """``cookbook.Executor`` / ``cookbook.Job`` (the submitit-shaped API), loaded on first use so that the
    command line starts without pandas or Jinja."""
    if name in ("Executor", "Job", "load_job"):
        from cookbook import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'cookbook' has no attribute {name!r}")
