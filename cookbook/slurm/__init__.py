"""Slurm: a client for any cluster (the embedded local cluster is cookbook.local.cluster)."""

from cookbook.slurm.client import JobInfo, JobTimeout, SlurmClient, SlurmError, read_output

__all__ = ["JobInfo", "JobTimeout", "SlurmClient", "SlurmError", "read_output"]
