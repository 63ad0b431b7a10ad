"""Slurm training cookbook: job specs -> validated sbatch scripts -> Slurm jobs -> metrics and plots."""

__version__ = "0.1.0"
