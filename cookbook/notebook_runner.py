"""Run the walkthrough notebooks with papermill: one notebook, the local quickstart, or a sweep.

    run_notebook("03_llama3_3_70b_lora", out_dir, local_parameters("03_llama3_3_70b_lora"))
    sweep("03_llama3_3_70b_lora.ipynb", {"rank 8": {"model.lora_rank": 8}, ...}).plot()
    sweep("03_llama3_3_70b_lora.ipynb", runs, array=True, parallel=2)  # ONE Slurm array, %2

Executed notebooks are written under ``out/notebooks/`` (git-ignored) unless told otherwise. Each run
gets its own working folder, so its jobs' files never mix with another run's. ``MPLBACKEND`` is
removed from the kernel's environment (``Agg`` there would keep plots out of the notebook).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from traitlets.config import Config

from cookbook.paths import output_dir, project_root
from cookbook.recipes.base import LOCAL_CPU
from cookbook.spec import profile_defaults

if TYPE_CHECKING:
    from cookbook.executor import Job
    from cookbook.slurm.client import SlurmClient

_ENV_LOCK = threading.Lock()


def notebook_dir() -> Path:
    """The folder with the walkthrough notebooks."""
    return project_root() / "notebooks"


def notebooks() -> list[str]:
    """Names (no suffix) of every walkthrough notebook, in order."""
    return sorted(p.stem for p in notebook_dir().glob("[0-9][0-9]_*.ipynb"))


def _path(notebook: str | os.PathLike) -> Path:
    p = Path(notebook)
    if p.suffix != ".ipynb":
        p = p.with_suffix(".ipynb")
    return p if p.is_absolute() or p.exists() else notebook_dir() / p.name


# ------------------------------------------------------------------------------------ parameters
def notebook_name(notebook: str | os.PathLike) -> str:
    """The walkthrough notebook's name: ``"03_llama3_3_70b_lora"`` for that name, its path, or ``"03"``."""
    stem = Path(notebook).stem
    names = notebooks()
    if stem in names:
        return stem
    matches = [n for n in names if n.startswith(f"{stem}_")]
    if len(matches) != 1:
        raise ValueError(f"no walkthrough notebook {stem!r}; the notebooks: {', '.join(names)}")
    return matches[0]


def cluster_parameters(profile: str = "generic") -> dict[str, Any]:
    """The parameters every job notebook takes; GPUs per node and time limit are ``profile``'s defaults."""
    d = profile_defaults(profile)
    return {
        "profile": profile,
        "nodes": 2,
        "spare_nodes": 0,
        "gpus_per_node": d["gpus_per_node"],
        "partition": None,
        "time_limit": d["time"],
        "container_image": None,
        "overrides": {},
        "gpu": "H100",
        "run_root": "runs",
    }


def default_parameters(notebook: str | os.PathLike) -> dict[str, Any]:
    """The defaults of ``notebook``'s ``parameters`` cell: the real recipe on a real GPU cluster.

    The cell in the .ipynb spells them out for its reader; a test checks that it agrees with this.
    """
    c = cluster_parameters()
    job = {k: c[k] for k in ("nodes", "spare_nodes", "gpus_per_node", "partition", "time_limit")}
    table: dict[str, dict[str, Any]] = {
        "00_setup": {
            "profile": c["profile"],
            "partition": None,
            "probe": True,
            "model_repo": "meta-llama/Llama-3.3-70B-Instruct",
            "model_dir": None,
            "download": False,
        },
        "01_plug_in_your_dataset": {
            "profile": c["profile"],
            "model_dir": None,
            "dataset": "NewEden/xlam-function-calling-60k-shareGPT",
            "style": "sharegpt",
            "column_map": {},
            "max_seq_len": 2048,
            "recipe": "llama3_3_70b_lora",
            **job,
            "container_image": None,
            "overrides": {"max_steps_per_epoch": 20},
            "run_root": c["run_root"],
        },
        "02_llama3_3_70b_full_finetune": {**c, "model_dir": None, "try_preemption": False},
        "03_llama3_3_70b_lora": {**c, "model_dir": None, "try_preemption": False},
        "04_flux_schnell_pretraining": {**c, "model_dir": None},
        "05_profiling": {**c, "model_dir": None},
        "06_llama3_8b_c4_torchtitan": {**c, "model_dir": None},
        "07_sweep_lora_rank": {
            "ranks": [8, 16, 64],
            "base_parameters": {},
            "out_dir": "sweeps/lora_rank",
            "parallel": 2,
            "array": True,
        },
        "08_job_builder": {
            "recipe": "llama3_3_70b_lora",
            "profile": c["profile"],
            **job,
            "overrides": {},
            "run_root": c["run_root"],
        },
    }
    name = notebook_name(notebook)
    if name not in table:
        raise ValueError(f"{name}: no defaults in cookbook.notebook_runner.default_parameters; add them there")
    return dict(table[name])


# The code cells every job notebook (one taking :func:`cluster_parameters`) has, in this order, as written
# here (comments aside; a test checks): set up, check, rehearse, submit, watch, read the metrics.
SHARED_CELLS: dict[str, str] = {
    "setup": "from cookbook import walkthrough as wt\nfrom cookbook.widgets import JobMonitor",
    "check": "wt.check_job(spec)",
    "rehearse": "wt.rehearse_job(spec, run_root)",
    "submit": "job = wt.submit(spec, run_root)\nprint(job.script.read_text())",
    "watch": "JobMonitor(job)",
    "wait": "job.wait()",
    "metrics": "metrics = job.metrics()\nmetrics.tail()",
    "plot": "job.plot()",
    "summary": "print(wt.run_summary(metrics))",
}


def local_parameters(notebook: str | os.PathLike, assets: Any = None) -> dict[str, Any]:
    """Parameters that run ``notebook`` on the embedded local cluster with the tiny assets."""
    name = notebook_name(notebook)
    if name == "00_setup":
        return {"profile": LOCAL_CPU, "probe": True}
    if name == "07_sweep_lora_rank":  # the sweep's runs are not preempted
        base = {k: v for k, v in local_parameters("03_llama3_3_70b_lora").items() if k != "try_preemption"}
        return {"ranks": [4, 16], "base_parameters": base}
    local = cluster_parameters(LOCAL_CPU)
    params = {k: local[k] for k in ("profile", "gpus_per_node", "time_limit")}
    if name == "01_plug_in_your_dataset":
        if assets is None:
            from cookbook.local.assets.tiny import ensure_tiny_assets

            assets = ensure_tiny_assets()
        params.update(
            model_dir=str(assets.llama_dir),
            dataset=str(assets.chat_sharegpt),
            style="sharegpt",
            max_seq_len=256,
            overrides={},
        )  # the tiny config's own short run
    elif "model_dir" in default_parameters(name):
        params["model_dir"] = None  # the tiny config points at the tiny model itself
    if name in ("02_llama3_3_70b_full_finetune", "03_llama3_3_70b_lora"):
        # train on 90% of the rows, so the "Use the model" section scores the other 10%, never trained on;
        # preempt the run once (USR1 after step 2) to show what a preemption costs
        params.update(overrides={"dataset.split": "train[:90%]"}, try_preemption=True)
    return params


# ------------------------------------------------------------------------------------ one run
class NotebookStopped(RuntimeError):
    """A notebook ended early at a failed cell; ``ename``/``evalue`` are the error's, ``path`` the output."""

    def __init__(self, path: Path, ename: str, evalue: str, cell: int | None):
        self.path, self.ename, self.evalue, self.cell = path, ename, evalue, cell
        super().__init__(f"{path.name} stopped at cell {cell}: {ename}: {evalue}")


_ENV_USERS = 0
_ENV_SAVED: dict[str, str] = {}


@contextmanager
def kernel_environment(extra: Mapping[str, str] | None = None) -> Iterator[None]:
    """The environment kernels started inside inherit: no MPLBACKEND, plus ``extra``; restored when the
    last concurrent user leaves (concurrent runs, e.g. a sweep, must pass the same ``extra``)."""
    global _ENV_USERS, _ENV_SAVED
    with _ENV_LOCK:
        if _ENV_USERS == 0:
            _ENV_SAVED = dict(os.environ)
        _ENV_USERS += 1
        os.environ.pop("MPLBACKEND", None)
        os.environ.update(extra or {})
    try:
        yield
    finally:
        with _ENV_LOCK:
            _ENV_USERS -= 1
            if _ENV_USERS == 0:
                os.environ.clear()
                os.environ.update(_ENV_SAVED)


def run_notebook(
    notebook: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    parameters: Mapping[str, Any] | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    name: str | None = None,
    timeout: int = 1200,
    env: Mapping[str, str] | None = None,
    log_output: bool = False,
) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/NAME.ipynb``; returns the executed path.

    ``cwd`` (default: a folder ``NAME.work`` next to the output) is where its jobs are written.
    Raises :class:`NotebookStopped` when a cell fails (the executed notebook is written anyway).
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src = _path(notebook)
    out = Path(out_dir) if out_dir is not None else output_dir() / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name or src.stem}.ipynb"
    work = Path(cwd) if cwd is not None else out / f"{target.stem}.work"
    work.mkdir(parents=True, exist_ok=True)
    with kernel_environment(env):
        try:
            pm.execute_notebook(
                str(src),
                str(target),
                parameters=dict(parameters or {}),
                cwd=str(work),
                kernel_name="python3",
                progress_bar=False,
                log_output=log_output,
                execution_timeout=timeout,
                request_save_on_cell_execute=False,
                config=_KERNEL_CONFIG,
            )
        except PapermillExecutionError as e:
            raise NotebookStopped(target, e.ename, _strip_ansi(e.evalue), e.cell_index) from None
    return target


# The kernel's sockets encrypted with CurveZMQ keys the manager makes (ipykernel warns on plain TCP):
# cells may read secrets such as HF_TOKEN from the environment.
_KERNEL_CONFIG = Config({"KernelManager": {"transport_encryption": "required"}})


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def error_output(executed: str | os.PathLike) -> dict[str, Any] | None:
    """The error output of an executed notebook (``ename``, ``evalue``, ``traceback``), if any."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                return {
                    "ename": o["ename"],
                    "evalue": o["evalue"],
                    "traceback": [_strip_ansi(t) for t in o.get("traceback", [])],
                }
    return None


def jobs_in(folder: str | os.PathLike) -> list:
    """Jobs a notebook run submitted (every ``job.json`` under ``folder``), oldest first."""
    from cookbook.walkthrough import Job

    return sorted((Job.load(p) for p in Path(folder).rglob("job.json")), key=lambda j: (j.submitted, int(j.job_id)))


# ------------------------------------------------------------------------------------ sweep
@dataclass
class SweepRun:
    """One run of a sweep: ``executed`` is its executed notebook (None for an array task), ``work`` the
    folder its job was written to."""

    label: str
    overrides: dict[str, Any]
    executed: Path | None
    work: Path
    error: str | None = None

    @property
    def job(self) -> Any:
        """The run's training job (the notebook's "use the model" job, ``<recipe>_use``, comes after it)."""
        jobs = [j for j in jobs_in(self.work) if not j.recipe.endswith("_use")]
        return jobs[-1] if jobs else None


@dataclass
class SweepResult:
    """The runs of a sweep; :meth:`table` and :meth:`plot` compare them."""

    runs: list[SweepRun] = field(default_factory=list)

    def metrics(self) -> dict[str, pd.DataFrame]:
        return {r.label: r.job.metrics() for r in self.runs if r.job is not None and r.job.log.exists()}

    def table(self) -> pd.DataFrame:
        rows = []
        for r in self.runs:
            job = r.job
            df = job.metrics() if job is not None and job.log.exists() else pd.DataFrame()
            train = df[df["split"].eq("train")] if "split" in df else df
            loss = train["loss"].dropna() if "loss" in train else pd.Series(dtype=float)
            tps = (
                train["tokens_per_second_per_gpu"].median()
                if "tokens_per_second_per_gpu" in train and train["tokens_per_second_per_gpu"].notna().any()
                else None
            )
            rows.append(
                {
                    "run": r.label,
                    **{k: v for k, v in r.overrides.items()},
                    "job": job.job_id if job else None,
                    "steps": len(train),
                    "first loss": loss.iloc[0] if len(loss) else None,
                    "last loss": loss.iloc[-1] if len(loss) else None,
                    "median tokens/s/GPU": tps,
                    "error": r.error,
                    "notebook": str(r.executed) if r.executed else None,
                }
            )
        return pd.DataFrame(rows)

    def plot(self, out: str | os.PathLike | None = None) -> Any:
        """Every run's loss (and throughput) on one plot."""
        from cookbook.metrics import plot_runs

        return plot_runs(self.metrics(), out=out)


def sweep(
    notebook: str | os.PathLike,
    runs: Mapping[str, Mapping[str, Any]],
    *,
    out_dir: str | os.PathLike = "sweeps",
    base_parameters: Mapping[str, Any] | None = None,
    parallel: int = 2,
    timeout: int = 1200,
    env: Mapping[str, str] | None = None,
    array: bool = False,
) -> SweepResult:
    """Run ``notebook`` once per entry of ``runs`` (label -> recipe overrides), ``parallel`` at a time.

    Each run gets ``overrides = {**base_parameters["overrides"], **run overrides}`` and its own folder
    ``out_dir/<label>/``; a run that stops is recorded with its error, the others go on.

    ``array=True``: no notebook runs; each run's job is built and checked as the job notebook builds it
    (:func:`sweep_array`) and all are submitted as ONE Slurm array, at most ``parallel`` tasks at once.
    """
    if array:
        return sweep_array(
            notebook,
            runs,
            out_dir=out_dir,
            base_parameters=base_parameters,
            parallel=parallel,
            timeout=timeout,
            env=env,
        )
    base = dict(base_parameters or {})
    plan = _sweep_plan(notebook, runs, Path(out_dir).resolve())
    if not plan:
        return SweepResult([])
    # alone first: a job that cannot run here stops the sweep at once
    first = _run_once(notebook, base, plan[0], timeout, env)
    if first.error and first.error.startswith("NotebookStop"):
        from cookbook.walkthrough import NotebookStop

        raise NotebookStop(
            f"the first run ({first.label}) stopped, so the sweep did too: "
            f"{first.error.split(': ', 1)[-1]}\n(executed notebook: {first.executed})"
        )
    return SweepResult([first, *_run_rest(notebook, base, plan[1:], parallel, timeout, env)])


def _sweep_plan(notebook: str | os.PathLike, runs: Mapping[str, Mapping[str, Any]], out: Path) -> list[SweepRun]:
    """One :class:`SweepRun` per label, each in its own folder ``out/<label as a slug>/``."""
    plan = []
    for label, extra in runs.items():
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "run"
        plan.append(SweepRun(label, dict(extra), out / slug / f"{_path(notebook).stem}.ipynb", out / slug / "work"))
    return plan


def _run_once(
    notebook: str | os.PathLike, base: Mapping[str, Any], run: SweepRun, timeout: int, env: Mapping[str, str] | None
) -> SweepRun:
    """Execute the notebook for one run, its overrides on the base's; a stopped run keeps its error."""
    # absolute run_root: papermill's cwd is a process-wide chdir, racy between parallel runs
    params = {
        **base,
        "overrides": {**dict(base.get("overrides") or {}), **run.overrides},
        "run_root": str(run.work / "runs"),
    }
    try:
        run_notebook(notebook, run.work.parent, params, cwd=run.work, timeout=timeout, env=env)
    except NotebookStopped as e:
        run.error = f"{e.ename}: {e.evalue}"
    return run


def _run_rest(
    notebook: str | os.PathLike,
    base: Mapping[str, Any],
    plan: list[SweepRun],
    parallel: int,
    timeout: int,
    env: Mapping[str, str] | None,
) -> list[SweepRun]:
    """Execute the remaining runs ``parallel`` at a time, the current folder restored afterwards."""
    here = os.getcwd()  # papermill chdirs process-wide; parallel runs can leave another folder current
    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(partial(_run_once, notebook, base, timeout=timeout, env=env), plan))
    finally:
        os.chdir(here)


def notebook_recipe(notebook: str | os.PathLike) -> str:
    """The recipe a job notebook runs: its ``RECIPE = "..."`` line (the notebook is the one place)."""
    import nbformat

    nb = nbformat.read(str(_path(notebook_name(notebook))), as_version=4)
    for cell in nb.cells:
        m = re.search(r"^RECIPE = [\"']([^\"']+)[\"']", cell.source, re.M) if cell.cell_type == "code" else None
        if m:
            return m[1]
    raise ValueError(f"{notebook_name(notebook)} is not a job notebook (no `RECIPE = ...` line): no array sweep of it")


def sweep_array(
    notebook: str | os.PathLike,
    runs: Mapping[str, Mapping[str, Any]],
    *,
    out_dir: str | os.PathLike = "sweeps",
    base_parameters: Mapping[str, Any] | None = None,
    parallel: int = 2,
    timeout: int = 1200,
    env: Mapping[str, str] | None = None,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    """The sweep as ONE Slurm array (``--array=0-N%parallel``; each task requeues only itself).

    Each run's job is the one the job ``notebook`` would submit with ``base_parameters`` and its overrides:
    its recipe (:func:`notebook_recipe`), the notebook's defaults (:func:`default_parameters`),
    ``walkthrough.job_spec`` and ``walkthrough.check_job`` (every run checked before anything is
    submitted: a run that cannot run here stops the sweep with ``NotebookStop``). The tasks are submitted
    with :meth:`cookbook.executor.Executor.map_array` into ``out_dir/runs/<name>-array-<time>/task-N/`` and
    waited for with progress; a task that does not end COMPLETED is recorded with its diagnosis.
    """
    from cookbook import walkthrough as wt

    name = notebook_name(notebook)
    recipe = notebook_recipe(name)
    p = _array_parameters(name, base_parameters)
    out = Path(out_dir).resolve()
    run_root = Path(p["run_root"]) if Path(p["run_root"]).is_absolute() else out / p["run_root"]
    model = wt.model_overrides(recipe, p.get("model_dir"), p["profile"], run_root)
    labels = list(runs)
    overrides = [{**model, **dict(p["overrides"] or {}), **dict(runs[label])} for label in labels]
    if not labels:
        return SweepResult([])
    client = wt.slurm_client(p["profile"])
    slurm = _array_slurm_parameters(p)
    _check_array_runs(recipe, p, slurm, labels, overrides, client)
    jobs = _submit_array(recipe, overrides, p["profile"], slurm, client, run_root, parallel, env)
    array_id = jobs[0].job_id.split("_")[0]
    echo(
        f"submitted {len(jobs)} runs as Slurm array {array_id} (at most {max(1, parallel)} at once): "
        f"{jobs[0].script.parent.parent}"
    )
    return SweepResult(_wait_array_tasks(labels, runs, jobs, timeout, echo))


def _array_parameters(name: str, base_parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """The job notebook's defaults with ``base_parameters`` on them; ValueError names a parameter it lacks."""
    defaults = default_parameters(name)
    unknown = sorted(set(base_parameters or {}) - set(defaults))
    if unknown:
        raise ValueError(f"{name} has no parameter(s) {', '.join(unknown)}; its parameters: {', '.join(defaults)}")
    return {**defaults, **dict(base_parameters or {})}


def _array_slurm_parameters(p: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSpec's Slurm fields from the notebook's parameters (an empty value: Slurm's default)."""
    return {
        "nodes": p["nodes"],
        "spare_nodes": p["spare_nodes"],
        "gpus_per_node": p["gpus_per_node"],
        "partition": p["partition"] or None,
        "time": p["time_limit"] or None,
        "container_image": p["container_image"] or None,
    }


def _check_array_runs(
    recipe: str,
    p: Mapping[str, Any],
    slurm: Mapping[str, Any],
    labels: list[str],
    overrides: list[dict[str, Any]],
    client: SlurmClient,
) -> None:
    """Check every run's job before anything is submitted; NotebookStop names one that cannot run."""
    from cookbook import walkthrough as wt

    for label, o in zip(labels, overrides, strict=True):  # as the notebook's spec and check cells do
        try:
            wt.check_job(wt.job_spec(recipe, profile=p["profile"], **slurm, overrides=o), client, gpu=p.get("gpu"))
        except wt.NotebookStop as e:
            raise wt.NotebookStop(f"run {label!r} cannot run, so the sweep did not start: {e}") from None


def _submit_array(
    recipe: str,
    overrides: list[dict[str, Any]],
    profile: str,
    slurm: Mapping[str, Any],
    client: SlurmClient,
    run_root: Path,
    parallel: int,
    env: Mapping[str, str] | None,
) -> list[Job]:
    """Submit the runs as ONE Slurm array, at most ``parallel`` tasks at once; NotebookStop if sbatch refuses."""
    from cookbook import walkthrough as wt
    from cookbook.executor import Executor
    from cookbook.slurm.client import SlurmError

    executor = Executor(run_root, profile, client)
    executor.update_parameters(**slurm)
    with kernel_environment(env):  # the jobs inherit the same environment the notebook runs' kernels would
        try:
            return executor.map_array(recipe, overrides, parallelism=max(1, parallel))
        except SlurmError as e:
            raise wt.NotebookStop(f"sbatch refused the sweep's array: {e.stderr or e}") from None


def _wait_array_tasks(
    labels: list[str], runs: Mapping[str, Mapping[str, Any]], jobs: list[Job], timeout: int, echo: Callable[[str], None]
) -> list[SweepRun]:
    """Wait for each task with its progress lines; one that does not end COMPLETED keeps its diagnosis."""
    from cookbook import walkthrough as wt

    result = []
    for label, job in zip(labels, jobs, strict=True):
        task = wt.Job(**{f.name: getattr(job, f.name) for f in fields(wt.Job)})
        run = SweepRun(label, dict(runs[label]), None, job.script.parent)

        def say(line: str, label: str = label) -> None:
            echo(f"{label}: {line}")

        try:
            task.wait(timeout=timeout, echo=say)
        except wt.NotebookStop as e:
            run.error = f"NotebookStop: {e}"
        result.append(run)
    return result


# ------------------------------------------------------------------------------------ quickstart
QUICKSTART = (
    "00_setup",
    "01_plug_in_your_dataset",
    "03_llama3_3_70b_lora",
    "06_llama3_8b_c4_torchtitan",
    "02_llama3_3_70b_full_finetune",
    "04_flux_schnell_pretraining",
    "05_profiling",
    "07_sweep_lora_rank",
    "08_job_builder",
)


def executed_plots(executed: str | os.PathLike, dest: str | os.PathLike) -> list[Path]:
    """Copy the ``metrics.png`` of every job an executed notebook's run submitted into ``dest``."""
    import shutil

    executed = Path(executed)
    work = executed.with_name(f"{executed.stem}.work")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for job in jobs_in(work):
        png = job.script.parent / "metrics.png"
        if png.exists():
            target = dest / f"{executed.stem}.{job.name}-{job.job_id}.png"
            shutil.copyfile(png, target)
            out.append(target)
    return out
