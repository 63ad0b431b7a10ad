"""Jobs as the lifecycle verbs see them: Slurm's view of a job joined with what the cookbook knows of it.

``describe`` answers for one job id (squeue/scontrol while Slurm keeps it, then sacct or the job-completion
log); ``user_jobs`` lists one user's jobs that a cookbook script started (the script's header names its
recipe and profile, so plain ``sbatch`` of a copied script counts too). Nothing here prints.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass
from pathlib import Path

from cookbook.slurm.client import JobInfo, SlurmClient, SlurmError
from cookbook.templating import script_header

JOB_ID = re.compile(r"^\d{1,12}(?:_\d{1,9})?$")


@dataclass(frozen=True)
class JobView:
    """One job: Slurm's state, its owner, and where its script and log are (None where unknown)."""

    job_id: str
    name: str
    state: str
    user: str
    nodes: str
    exit_code: str = ""
    elapsed: str = ""
    script: Path | None = None
    log: Path | None = None
    recipe: str | None = None
    profile: str | None = None

    @property
    def done(self) -> bool:
        return JobInfo(self.job_id, self.state).done


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Slurm job id (``123`` or an array task ``123_4``); ValueError otherwise."""
    if not JOB_ID.match(job_id):
        raise ValueError(f"{job_id!r} is not a Slurm job id (a number such as 12345, or 12345_3 for an array task)")
    return job_id


def recipe_of(script: Path | None) -> tuple[str, str] | None:
    """(recipe, profile) from a cookbook script's header; None for any other script or an unreadable one."""
    try:
        with open(script or "", encoding="utf-8", errors="replace") as fh:
            head = [fh.readline() for _ in range(3)]
    except OSError:
        return None
    return script_header("".join(head))


def _user_name(field: str) -> str:
    """``root(0)`` (scontrol's UserId) -> ``root``."""
    return field.split("(", 1)[0]


def find_log(workdir: Path, name: str, job_id: str) -> Path | None:
    """The log of a job Slurm no longer shows: ``NAME-JOBID.out`` (the cookbook's ``%x-%j.out``) or
    ``slurm-JOBID.out`` in its working folder or one folder below."""
    for pattern in (f"{name}-{job_id}.out", f"slurm-{job_id}.out", f"*/{name}-{job_id}.out", f"*-{job_id}.out"):
        found = sorted(workdir.glob(pattern))
        if found:
            return found[0]
    return None


def describe(client: SlurmClient, job_id: str) -> JobView:
    """What Slurm and the job's script say about ``job_id``; SlurmError if no source knows the job."""
    info = client.state(check_job_id(job_id), answer_required=True)
    fields = client.show_job(job_id)
    if fields:
        script = Path(fields["Command"]) if fields.get("Command", "").startswith("/") else None
        log = Path(fields["StdOut"]) if fields.get("StdOut") else None
        user, name, elapsed = _user_name(fields.get("UserId", "")), fields.get("JobName", ""), fields.get("RunTime", "")
    else:  # Slurm forgot it (MinJobAge): accounting has the owner and the working folder
        r = client.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "User,JobName,WorkDir,Elapsed", check=False)
        if r.returncode or not r.stdout.strip():
            r = client.run(
                "sacct", "-c", "-n", "-X", "-P", "-j", job_id, "-o", "User,JobName,WorkDir,Elapsed", check=False
            )
        row = (r.stdout.strip().splitlines() or [""])[-1].split("|") + ["", "", "", ""]
        user, name, workdir, elapsed = row[:4]
        log = find_log(Path(workdir), name, job_id) if workdir else None
        script = None
    found = recipe_of(script) or (None, None)
    return JobView(job_id, name, info.state, user, info.nodes, info.exit_code, elapsed, script, log, *found)


def user_jobs(client: SlurmClient, user: str | None = None, cookbook_only: bool = True) -> list[JobView]:
    """``user``'s jobs Slurm still shows (pending, running, recently ended), oldest first; only those a
    cookbook script started unless ``cookbook_only`` is False."""
    user = user or getpass.getuser()
    r = client.run("squeue", "-h", "-u", user, "-t", "all", "-o", "%i|%j|%T|%M|%R|%o")
    views = []
    for line in r.stdout.splitlines():
        parts = line.split("|", 5)
        if len(parts) < 6:
            continue
        job_id, name, state, elapsed, where, command = parts
        script = Path(command) if command.startswith("/") else None
        found = recipe_of(script)
        if cookbook_only and found is None:
            continue
        fields = client.show_job(job_id)
        log = Path(fields["StdOut"]) if fields.get("StdOut") else None
        views.append(
            JobView(
                job_id, name, state, user, where, fields.get("ExitCode", ""), elapsed, script, log, *(found or ("", ""))
            )
        )
    return sorted(views, key=lambda v: [int(x) for x in v.job_id.split("_")])


def require_own(view: JobView, user: str | None = None) -> None:
    """SlurmError unless ``view`` is ``user``'s job (the cookbook changes only your own jobs)."""
    user = user or getpass.getuser()
    if view.user and view.user != user:
        raise SlurmError(["scontrol"], 1, f"job {view.job_id} belongs to {view.user}, not to you ({user})")
