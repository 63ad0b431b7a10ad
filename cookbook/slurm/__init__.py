"""Slurm: a client for any cluster, and the embedded local cluster."""

from cookbook.slurm.client import JobInfo, JobTimeout, SlurmClient, SlurmError, read_output

__all__ = ["JobInfo", "JobTimeout", "SlurmClient", "SlurmError", "read_output"]
