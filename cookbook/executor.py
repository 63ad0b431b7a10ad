"""A submitit-shaped Python API: ``Executor`` renders and submits recipes, ``Job`` follows one job.

    executor = Executor(folder="runs", profile="nebius")
    executor.update_parameters(nodes=2, gpus_per_node=8, time="04:00:00", partition="gpu")
    job = executor.submit("llama3_3_70b_lora", **{"lora_rank": 16})
    job.job_id, job.state, job.done()
    job.wait(); job.metrics(); job.plot(); job.goodput()

As in submitit, ``update_parameters`` takes the job's Slurm and cluster settings (the fields of
:class:`cookbook.spec.JobSpec`: ``nodes``, ``gpus_per_node``, ``time``, ``partition``, ``account``, ``qos``,
``exclude``, ``constraint``, ``reservation``, ``mem``, ``gres``, ``sbatch_extra`` (any other sbatch option),
``container_image`` ...), and ``submit`` takes what is run, here a recipe and its config overrides. Every job
gets a fresh folder ``folder/<job name>-<time>/`` with its script, configs, log and ``job.json``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cookbook.render import array_task_scripts, test_only, write_array, write_job
from cookbook.resolve import placed, resolve
from cookbook.slurm.client import (
    REQUEUED_STATES,
    TERMINAL_STATES,
    JobInfo,
    JobTimeout,
    SlurmClient,
    SlurmError,
    read_output,
)
from cookbook.slurm.record import JobRecord
from cookbook.spec import JobSpec, SpecError, make_spec
from cookbook_runtime import files

if TYPE_CHECKING:
    import pandas as pd

    from cookbook.metrics import Finding


class JobFailed(RuntimeError):
    """``Job.result()`` of a job that did not end COMPLETED; the message has the log's diagnosis."""


@dataclass
class Job(JobRecord):
    """A submitted job: Slurm's state of it, its log, and what the cookbook reads from its run."""

    client: SlurmClient | None = field(default=None, repr=False, compare=False)

    @property
    def slurm(self) -> SlurmClient:
        if self.client is None:
            self.client = SlurmClient()
        return self.client

    # --------------------------------------------------------------- Slurm (submitit's shape)
    def info(self) -> JobInfo:
        """What Slurm knows of the job now (state, exit code, nodes)."""
        return self.slurm.state(self.job_id)

    @property
    def state(self) -> str:
        """Slurm's state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT ..."""
        return self.info().state

    def done(self) -> bool:
        """Whether the job has ended (in any state)."""
        return self.info().done

    def wait(self, timeout: float = 3600, poll: float = 2.0) -> JobInfo:
        """Block until the job ends (:class:`~cookbook.slurm.client.JobTimeout` after ``timeout`` s)."""
        return self.slurm.wait(self.job_id, timeout=timeout, poll=poll, until=TERMINAL_STATES)

    def result(self, timeout: float = 3600) -> pd.DataFrame:
        """Wait, then the metrics table; :class:`JobFailed` with the diagnosis unless it ended COMPLETED."""
        info = self.wait(timeout)
        if info.state != "COMPLETED":
            found = self.diagnose()
            why = "\n".join(str(f) for f in found) if found else f"last lines:\n{self.tail(15)}"
            raise JobFailed(f"job {self.job_id} ended {info.state} (exit {info.exit_code or '?'}); {why}")
        return self.metrics()

    def stdout(self) -> str:
        """The job's log ('' before it starts); every rank's lines, tagged with node and rank."""
        return read_output(self.log)

    def stderr(self) -> str:
        """The cookbook's scripts send stderr to the same log as stdout."""
        return self.stdout()

    def cancel(self, signal: str | None = None) -> None:
        """``scancel`` (``signal="USR1"``: the script saves and requeues instead of stopping)."""
        self.slurm.cancel(self.job_id, signal=signal)

    def requeue(self) -> None:
        """Back into the queue; the script resumes from its newest complete checkpoint."""
        self.slurm.requeue(self.job_id)

    def preempt(self, after_step: int = 2, timeout: float = 600, poll: float = 0.5) -> str:
        """Do to the job what Slurm does before a preemption or its time limit, to see what that costs: once
        the run has logged ``after_step``, send the batch script USR1 (``scancel --signal=USR1 --batch``, as
        ``--signal=B:USR1@N`` does). The ranks save at their next step boundary and the job requeues; it is
        then started again at once (Slurm holds a requeued job back about two minutes). One line says what
        happened; :func:`cookbook.analysis.preemption.preemption_report` of the log says what it cost."""
        end = time.monotonic() + timeout
        while (steps := self.metrics()).empty or steps["step"].max() < after_step:
            if self.done():
                return f"job {self.job_id} ended before step {after_step}: not preempted"
            if time.monotonic() > end:
                raise JobTimeout(f"job {self.job_id} logged no step {after_step} in {timeout:.0f} s")
            time.sleep(poll)
        self.slurm.run("scancel", "--signal=USR1", "--batch", self.job_id)
        while (info := self.info()).state not in REQUEUED_STATES:
            if info.done:
                return f"job {self.job_id} ended {info.state} before its next step boundary: not preempted"
            if time.monotonic() > end:
                raise JobTimeout(f"job {self.job_id} was not requeued {timeout:.0f} s after USR1")
            time.sleep(poll)
        self.slurm.release_requeued(self.job_id, timeout=max(1.0, end - time.monotonic()))
        return f"job {self.job_id}: USR1 after step {after_step}; the ranks saved, the job requeued and starts again"

    # --------------------------------------------------------------- what the run wrote
    def tail(self, lines: int = 20) -> str:
        """The last lines of the log (progress-bar redraws collapsed to the latest)."""
        return tail_text(self.log, lines)

    def diagnose(self) -> list[Finding]:
        """Known failures found in the log, each with what to do."""
        from cookbook.metrics import diagnose

        return diagnose(self.log) if self.log.exists() else []

    def metrics_files(self) -> list[Path]:
        """Logs with metrics: the Slurm log, plus the files the recipe's framework writes."""
        from cookbook.recipes import get_recipe

        try:
            recipe = get_recipe(self.recipe)
        except KeyError:  # a record of a recipe this version no longer has
            return [self.log]
        return [self.log, *recipe.metrics_files(self.run_dir)]

    def metrics(self, gpus: bool = False) -> pd.DataFrame:
        """One row per training step, from every metrics file (see :func:`cookbook.metrics.parse_log`); ``gpus``
        adds what the GPUs did at each step (:func:`cookbook.metrics.telemetry.join_telemetry`)."""
        from cookbook.metrics import parse_log

        steps = merge_metrics([parse_log(p) for p in self.metrics_files() if p.exists()])
        if not gpus:
            return steps
        from cookbook.metrics.telemetry import join_telemetry

        return join_telemetry(steps, self.telemetry())

    def telemetry(self) -> pd.DataFrame:
        """Every node's GPU and NIC samples of the run (:mod:`cookbook.metrics.telemetry`): one row per device
        per sample, across requeues."""
        from cookbook.metrics.telemetry import read_telemetry

        return read_telemetry(self.run_dir)

    def plot(self, save: bool = True) -> Any:
        """Loss (raw + smoothed) and throughput against step; saved as ``metrics.png`` next to the script."""
        from cookbook.metrics.plots import plot_runs  # matplotlib: only when a plot is asked for

        out = self.script.parent / "metrics.png" if save else None
        return plot_runs({self.name: self.metrics()}, out=out)

    def goodput(self, gpu: str | None = None, price: float | None = None) -> Any:
        """The goodput ledger of this job across its requeues (``.table()``, ``.plot()``, ``.render()``);
        ``gpu`` and ``price`` default to the job's profile's GPU kind and price per GPU-hour."""
        from cookbook.analysis.goodput import resolve_run, run_ledger

        return run_ledger(resolve_run(str(self.script.parent)), self.slurm, gpu=gpu, price=price)

    def rehearse(self, timeout: float = 900) -> Any:
        """Run this job's script as a rehearsal (a check on every node in the launcher's place)."""
        from cookbook.rehearsal import rehearse

        return rehearse(self.script, self.slurm, timeout=timeout)

    def outputs(self, all: bool = False) -> pd.DataFrame:
        """Files the run made (weights, adapters, samples, logs, configs), with sizes; ``all=True`` adds the
        cookbook's own bookkeeping (:func:`internal`: ``.cookbook/``, hang dumps, hidden files)."""
        import pandas as pd

        found = [p for p in sorted(self.run_dir.rglob("*")) if p.is_file()]
        rows = [
            {"file": str(rel), "MB": round(p.stat().st_size / 1e6, 3)}
            for p, rel in ((p, p.relative_to(self.run_dir)) for p in found)
            if all or not internal(rel)
        ]
        return pd.DataFrame(rows, columns=["file", "MB"])


def internal(path: Path) -> bool:
    """Whether ``path`` (relative to a run folder) is the cookbook's bookkeeping, not something the run made: under
    ``.cookbook/`` (the job runtime's state, :mod:`cookbook_runtime.files`), a hang dump folder, a hidden file."""
    return path.parts[0] in (files.STATE, files.HANG) or any(part.startswith(".") for part in path.parts)


_SPEC_FIELDS = {f.name for f in fields(JobSpec)} - {"recipe", "profile", "overrides"}


class Executor:
    """Submits recipes as Slurm jobs, each rendered into a fresh folder under ``folder``."""

    def __init__(
        self, folder: str | os.PathLike[str] = "runs", profile: str = "generic", client: SlurmClient | None = None
    ):
        self.folder, self.profile, self.client = Path(folder), profile, client
        self.parameters: dict[str, Any] = {}

    def update_parameters(self, **parameters: Any) -> None:
        """Set the jobs' Slurm and cluster settings (fields of :class:`cookbook.spec.JobSpec`)."""
        unknown = sorted(set(parameters) - _SPEC_FIELDS)
        if unknown:
            raise SpecError(
                [f"unknown parameter(s) {', '.join(unknown)}: use the JobSpec fields {', '.join(sorted(_SPEC_FIELDS))}"]
            )
        self.parameters.update(parameters)

    def spec(self, recipe: str, **overrides: Any) -> JobSpec:
        """The validated job ``submit`` would run (:class:`cookbook.spec.SpecError` names what is wrong)."""
        spec = self._spec(recipe, **overrides)
        resolve(spec)
        return spec

    def _spec(self, recipe: str, **overrides: Any) -> JobSpec:
        """The job ``submit`` would run, not yet validated: submitting it resolves it, once."""
        return make_spec(
            recipe, self.profile, **self.parameters, overrides={str(k): str(v) for k, v in overrides.items()}
        )

    def test_only(self, recipe: str, **overrides: Any) -> str:
        """Slurm's answer to ``sbatch --test-only`` of the job ``submit`` would run (nothing queued);
        :class:`cookbook.spec.SpecError` with Slurm's own message when it refuses."""
        return test_only(resolve(self._spec(recipe, **overrides)), self.client)

    def submit(self, recipe: str, **overrides: Any) -> Job:
        """Render ``recipe`` with its config ``overrides`` into ``folder/<name>-<time>/`` and sbatch it."""
        return self.submit_spec(self._spec(recipe, **overrides))

    def map_array(
        self, recipe: str, overrides: list[dict[str, Any]], parallelism: int | None = None, array: bool = True
    ) -> list[Job]:
        """A sweep: one task per override set, as ONE Slurm array (``--array=0-N%parallelism``: at most
        ``parallelism`` tasks run at once; None: all) in ``folder/<name>-array-<time>/``, task N's script in
        ``task-N/``; each :class:`Job` is one task (``job_id`` ``<array id>_<N>``), requeued on its own.
        ``array=False``: one separate job per override set instead. Each task is resolved once (validated, its
        lead time and sizes computed); the sweep's own name is the recipe's job name, not a job of its own."""
        name = self._spec(recipe).name
        specs = [replace(self._spec(recipe, **o), job_name=f"{name}-{i}") for i, o in enumerate(overrides)]
        if not array:
            return [self.submit_spec(spec) for spec in specs]
        folder = (self.folder / f"{name}-array-{_stamp()}").resolve()
        scripts = array_task_scripts(folder, len(specs))
        tasks = [resolve(placed(spec, script)) for spec, script in zip(specs, scripts, strict=True)]
        script = write_array(tasks, folder, name, parallelism)
        return self._submit_array(script, name, [(t.spec, s) for t, s in zip(tasks, scripts, strict=True)])

    def _submit_array(self, script: Path, name: str, tasks: list[tuple[JobSpec, Path]]) -> list[Job]:
        """sbatch the array ``script`` (job ``name``; each task's resolved spec and script) and record a
        :class:`Job` per task."""
        folder, specs = script.parent, [spec for spec, _ in tasks]
        log_dir = Path(specs[0].log_dir) if Path(specs[0].log_dir).is_absolute() else folder / specs[0].log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        client = self.client or SlurmClient()
        array_id = client.submit(script, cwd=folder)
        jobs = []
        for i, (spec, task_script) in enumerate(tasks):
            task = task_script.parent
            job = Job(
                job_id=f"{array_id}_{i}",
                script=task_script,
                log=log_dir / f"{name}-{array_id}_{i}.out",
                run_dir=Path(spec.run_dir) if spec.run_dir else task / "runs" / spec.name,
                recipe=spec.recipe,
                profile=spec.profile,
                name=spec.name,
                submitted=datetime.now().isoformat(timespec="seconds"),
                client=client,
            )
            job.save()
            jobs.append(job)
        return jobs

    def submit_spec(self, spec: JobSpec) -> Job:
        """Render and sbatch a :class:`JobSpec` (resolved once, :func:`cookbook.resolve.resolve`, then rendered:
        :class:`cookbook.spec.SpecError` names what is wrong); :class:`SlurmError` with Slurm's text if refused."""
        folder = (self.folder / f"{spec.name}-{_stamp()}").resolve()
        resolved = resolve(placed(spec, folder / "job.sbatch"))
        spec = resolved.spec
        script = write_job(resolved, folder / "job.sbatch")
        log_dir = Path(spec.log_dir)
        (log_dir if log_dir.is_absolute() else folder / log_dir).mkdir(parents=True, exist_ok=True)
        client = self.client or SlurmClient()
        job_id = client.submit(script, cwd=folder)
        job = Job(
            job_id=job_id,
            script=script,
            log=(log_dir if log_dir.is_absolute() else folder / log_dir) / f"{spec.name}-{job_id}.out",
            run_dir=Path(spec.run_dir) if spec.run_dir else folder / "runs" / spec.name,
            recipe=spec.recipe,
            profile=spec.profile,
            name=spec.name,
            submitted=datetime.now().isoformat(timespec="seconds"),
            client=client,
        )
        job.save()
        return job


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]


def load_job(folder: str | os.PathLike[str], client: SlurmClient | None = None) -> Job:
    """The job recorded in ``folder/job.json`` (a run folder ``submit`` made)."""
    record = JobRecord.load(folder)
    return Job(**{f.name: getattr(record, f.name) for f in fields(JobRecord)}, client=client)


def merge_metrics(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of several sources of one run joined on (split, step); earlier frames win per cell."""
    import pandas as pd

    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["step", "split", "loss"])
    out = frames[0].set_index(["split", "step"])
    for f in frames[1:]:
        out = out.combine_first(f.set_index(["split", "step"]))
    out = out.reset_index().sort_values(["split", "step"], kind="stable").reset_index(drop=True)
    return out[["step", "split", *[c for c in out.columns if c not in ("step", "split")]]]


def tail_text(path: str | os.PathLike[str], lines: int = 20) -> str:
    """Last ``lines`` lines of a log, with carriage-return redraws (tqdm) collapsed to the last one."""
    text = read_output(path)
    out = [ln.rsplit("\r", 1)[-1] if "\r" in ln.rstrip("\r") else ln.rstrip("\r") for ln in text.split("\n")]
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out[-lines:])


__all__ = ["Executor", "Job", "JobFailed", "JobTimeout", "SlurmError", "load_job", "merge_metrics", "tail_text"]
