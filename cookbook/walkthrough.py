"""The notebooks' steps: check a job against the cluster, submit it, wait for it, read its metrics.

Every notebook cell is one call into this module (or the modules it builds on), so nothing a user
would have to copy lives in a notebook. A check that fails raises :class:`NotebookStop`, which a
notebook shows as one clear message (no traceback) and which stops the remaining cells.

    spec = job_spec("llama3_3_70b_lora", profile="local-cpu")
    check_job(spec)                       # NotebookStop with what to change, or a short report
    job = submit(spec, "runs")            # renders into runs/<name>-<time>/ and sbatches it
    job.wait()                            # progress lines; NotebookStop with the diagnosis on failure
    job.plot()                            # loss / throughput against step
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from cookbook import executor
from cookbook.executor import merge_metrics, tail_text
from cookbook.slurm.client import JobInfo, SlurmClient, SlurmError, SlurmUnreachable
from cookbook.spec import LOCAL_CPU, JobSpec, SpecError, get_profile, make_spec


class NotebookStop(Exception):
    """A check failed. In a notebook it shows as its message only (IPython's ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"\033[1;31mSTOP\033[0m: {line}" if i == 0 else f"      {line}"
            for i, line in enumerate(str(self).splitlines() or [""])
        ]


def show_figures_inline() -> bool:
    """In a Jupyter kernel, display matplotlib ``Figure`` objects (as returned by the cookbook's plot
    functions) as PNG, whatever the matplotlib backend; returns whether a kernel was found."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None or not hasattr(ip, "display_formatter"):
        return False
    import io

    from matplotlib.figure import Figure

    def png(fig: Figure) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return buf.getvalue()

    ip.display_formatter.formatters["image/png"].for_type(Figure, png)
    return True


show_figures_inline()


# ------------------------------------------------------------------------------------------ Slurm
def slurm_client(profile: str | None = None) -> SlurmClient:
    """A Slurm client for this login node. For ``local-cpu`` without ``SLURM_CONF`` set, the embedded
    local cluster's configuration is used when that cluster is up."""
    env = dict(os.environ)
    if profile == LOCAL_CPU and "SLURM_CONF" not in env:
        from cookbook.local.cluster import LocalCluster

        cluster = LocalCluster()
        if cluster.status().up:
            env.update(cluster.env())
    return SlurmClient(env)


# ------------------------------------------------------------------------------------------ spec
def job_spec(
    recipe: str,
    *,
    profile: str = "generic",
    nodes: int = 2,
    gpus_per_node: int | None = None,
    partition: str | None = None,
    time: str | None = None,
    container_image: str | None = None,
    job_name: str | None = None,
    overrides: dict[str, Any] | None = None,
    **extra: Any,
) -> JobSpec:
    """A :class:`JobSpec` with the profile's defaults filled in (see :func:`cookbook.spec.profile_defaults`)."""
    return make_spec(
        recipe,
        profile,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        partition=partition or None,
        time=time or None,
        container_image=container_image or None,
        job_name=job_name or None,
        overrides={str(k): str(v) for k, v in (overrides or {}).items()},
        **extra,
    )


@dataclass
class CheckReport:
    """What :func:`check_job` verified (printed as one line per item)."""

    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([f"ok   {ln}" for ln in self.lines] + [f"note {w}" for w in self.warnings])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _local_hint(spec: JobSpec) -> str:
    return (
        "On the embedded local cluster run this notebook with the tiny recipe instead: "
        "parameters profile='local-cpu', gpus_per_node=0 (`make demo` does that)."
    )


def check_job(spec: JobSpec, client: SlurmClient | None = None, gpu: str | None = None) -> CheckReport:
    """Validate ``spec`` with the recipe engine and against the cluster this runs on; warn when the
    planner says it will not fit on GPUs of kind ``gpu`` (default: the recipe's, H100).

    Raises :class:`NotebookStop` listing every problem, each with what to change: invalid spec, no
    Slurm, unknown partition, too few nodes, too few GPUs per node.
    """
    report = CheckReport()
    problems = _render_check(spec, gpu, report)
    client = client or slurm_client(spec.profile)
    parts, hint = _partitions(client, spec, problems)
    if parts is not None:
        found, hint, line = _partition_fit(client, spec, parts)
        problems += found
        if not problems:
            report.lines.append(line)
    if problems:
        raise NotebookStop(
            f"the job cannot run here ({len(problems)} problem(s)):\n"
            + "\n".join(f"- {p}" for p in problems)
            + (f"\n{hint}" if hint else "")
        )
    return report


def _render_check(spec: JobSpec, gpu: str | None, report: CheckReport) -> list[str]:
    """Render ``spec`` as a submission would: its line and warnings into ``report``, or its problems."""
    from cookbook.gpus import UnknownGpu
    from cookbook.planner import job_fit_warning
    from cookbook.render import render
    from cookbook.resolve import resolve

    try:
        job = render(resolve(spec))
        report.lines.append(
            f"job valid: {spec.recipe}, {spec.nodes} node(s) x "
            + (f"{spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else "CPU")
            + f", profile {spec.profile}"
        )
        report.warnings += job.warnings
        report.warnings += filter(None, [job_fit_warning(spec, gpu)])
    except SpecError as e:
        return list(e.problems)
    except UnknownGpu as e:
        return [str(e)]
    return []


def _partitions(client: SlurmClient, spec: JobSpec, problems: list[str]) -> tuple[list[dict[str, str]] | None, str]:
    """Slurm's partitions, and a hint; None where Slurm does not answer (why: appended to ``problems``)."""
    try:
        return client.partitions(), ""
    except SlurmUnreachable as e:
        problems.append(e.line)
        return None, ""
    except SlurmError as e:
        problems.append(
            f"Slurm is not reachable from here ({' '.join(e.stderr.split()) or e}): run this notebook on "
            "the cluster's login node (`make lab` starts JupyterLab there)"
            + ("; locally start the cluster first: `cookbook cluster up`" if spec.local_cpu else "")
        )
        return None, _local_hint(spec) if not spec.local_cpu else ""


def _partition_fit(client: SlurmClient, spec: JobSpec, parts: list[dict[str, str]]) -> tuple[list[str], str, str]:
    """The job's partition (else the default) against its nodes and GPUs: (problems, hint, the report's line)."""
    from cookbook import doctor

    names = [p["partition"].rstrip("*") for p in parts]
    default = next(
        (p["partition"].rstrip("*") for p in parts if p["partition"].endswith("*")), names[0] if names else None
    )
    part = spec.partition or default
    if part is None or part not in names:
        return [f"partition {part!r} does not exist here; use one of: {', '.join(names)}"], "", ""
    problems, hint = [], ""
    nodes = [n for n in doctor.partition_nodes(client, part) if n["usable"]]
    gpus = min((n["gpus"] for n in nodes), default=0)
    if len(nodes) < spec.nodes:
        problems.append(
            f"the job asks for {spec.nodes} node(s) but partition {part!r} has {len(nodes)} "
            "usable: lower nodes, or pick another partition"
        )
    if spec.profile_info.uses_gpus and gpus < spec.gpus_per_node:
        problems.append(
            f"the job needs {spec.gpus_per_node} GPUs per node, but the nodes of partition {part!r} have {gpus}"
        )
        hint = _local_hint(spec) if gpus == 0 else f"Set gpus_per_node={gpus} (and check the parallel settings)."
    return problems, hint, f"partition {part}: {len(nodes)} usable node(s), {gpus} GPU(s) per node"


# ------------------------------------------------------------------------------------------ jobs
@dataclass
class Job(executor.Job):
    """A submitted job (:class:`cookbook.executor.Job`) as a notebook shows it: ``wait`` prints progress
    and stops the notebook with the diagnosis when the job fails."""

    @property
    def slurm(self) -> SlurmClient:
        if self.client is None:
            self.client = slurm_client(self.profile)
        return self.client

    def wait(
        self, timeout: float = 3600, poll: float = 2.0, every: float = 10.0, echo: Callable[[str], None] = print
    ) -> JobInfo:
        """Wait for the job to end, printing its state and training progress at most every ``every`` s.

        A job that does not end COMPLETED raises :class:`NotebookStop` with the log's diagnosis.
        """
        from cookbook.metrics import LogFollower, eta

        follower = LogFollower(self.log)
        start, last_print, last_state = time.monotonic(), 0.0, ""
        while True:
            info = self.info()
            follower.poll()
            now = time.monotonic()
            if info.state != last_state and not info.done:
                echo(f"job {self.job_id}: {info.state}" + (f" on {info.nodes}" if info.state == "RUNNING" else ""))
                last_state = info.state
            elif now - last_print >= every and not follower.df.empty:
                echo(progress_line(follower.df, eta(follower.df)))
                last_print = now
            if info.done:
                break
            if now - start > timeout:
                raise NotebookStop(
                    f"job {self.job_id} still {info.state} after {timeout:.0f} s; it keeps running "
                    f"(cancel with job.cancel()); log: {self.log}"
                )
            time.sleep(poll)
        follower.poll()
        if not follower.df.empty:
            echo(progress_line(follower.df, None))
        echo(
            f"job {self.job_id}: {info.state} (exit {info.exit_code or '?'}) after {time.monotonic() - start:.0f} s; "
            f"log {self.log}"
        )
        if info.state != "COMPLETED":
            raise NotebookStop(f"job {self.job_id} ended {info.state}.\n{self.explain()}")
        return info

    def explain(self) -> str:
        """Known failures found in the log with their hints, else the log's last lines."""
        found = self.diagnose()
        if found:
            return "\n".join(str(f) for f in found) + f"\nlog: {self.log}"
        return f"last lines of {self.log}:\n{self.tail(15)}"


def submit(spec: JobSpec, root: str | os.PathLike[str] = "runs", client: SlurmClient | None = None) -> Job:
    """Render ``spec`` into a fresh folder ``root/<job name>-<time>/`` and sbatch it
    (:meth:`cookbook.executor.Executor.submit_spec`).

    A fresh folder per submission: re-running a notebook starts a new run instead of resuming the last
    one (resubmitting the same script resumes, see the recipe's resume logic). A spec the recipe rejects (it
    validates again as it renders) is a :class:`NotebookStop` with its problems, one line each.
    """
    client = client or slurm_client(spec.profile)
    try:
        job = executor.Executor(root, spec.profile, client).submit_spec(spec)
    except SlurmUnreachable as e:
        raise NotebookStop(e.line) from None
    except SlurmError as e:
        raise NotebookStop(f"sbatch refused the job: {e.stderr or e}") from None
    except SpecError as e:  # nothing was submitted: e.g. a use job whose run folder holds no checkpoint
        raise NotebookStop(str(e)) from None
    return Job(**{f.name: getattr(job, f.name) for f in fields(Job)})


# ------------------------------------------------------------------------------------------ steps
def default_model_dir(repo_id: str, run_root: str | os.PathLike = "runs") -> Path:
    """Where a model goes unless the user says otherwise: ``models/<name>`` beside the run folder root.

    A multi-node job needs the model on storage every node mounts; the run folders must be there too
    (checkpoints are written by every node), so the folder they are on is the natural default. ``/tmp``
    is node-local on every cluster: the other nodes would never see a model put there.
    """
    return Path(run_root).resolve().parent / "models" / repo_id.rstrip("/").split("/")[-1]


def model_dir_for(recipe: str, model_dir: str | os.PathLike | None, run_root: str | os.PathLike = "runs") -> Path:
    """``model_dir`` if given, else the :func:`default_model_dir` of the download the recipe reads."""
    from cookbook.recipes import get_recipe

    if model_dir:
        return Path(model_dir)
    folder = get_recipe(recipe).model_folder
    require(folder is not None, f"{recipe} reads no downloaded model: it needs no model_dir")
    return default_model_dir(str(folder), run_root)


def model_overrides(
    recipe: str, model_dir: str | os.PathLike | None, profile: str = "generic", run_root: str | os.PathLike = "runs"
) -> dict[str, str]:
    """The recipe's overrides pointing it at a downloaded model (``model_dir=None``:
    :func:`default_model_dir`; nothing for ``local-cpu``, whose config uses the tiny model, nor for a
    recipe that trains from scratch)."""
    from cookbook.recipes import get_recipe

    rec = get_recipe(recipe)
    if profile == LOCAL_CPU or rec.model_folder is None:
        return {}
    return rec.model_overrides(str(model_dir_for(recipe, model_dir, run_root)))


def rehearse_job(
    spec: JobSpec, root: str | os.PathLike = "runs", client: SlurmClient | None = None, timeout: float = 900
) -> Any:
    """Rehearse ``spec`` on the cluster (:func:`cookbook.rehearsal.rehearse`): its script runs on the same
    allocation with a check in the launcher's place on every node. A node that cannot run the job stops
    the notebook with the per-node table and what to change."""
    from cookbook.rehearsal import RehearsalError, rehearse
    from cookbook.render import write_job
    from cookbook.resolve import placed, resolve

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    path = (Path(root) / f"{spec.name}-rehearsal-{stamp}").resolve() / "job.sbatch"
    script = write_job(resolve(placed(spec, path)), path)
    try:
        report = rehearse(script, client or slurm_client(spec.profile), timeout=timeout)
    except RehearsalError as e:
        raise NotebookStop(str(e)) from None
    if not report.ok:
        raise NotebookStop(report.table())
    return report


def plan_for(spec: JobSpec, gpu: str = "H100") -> str:
    """The planner's memory / throughput estimate for ``spec`` with its overrides (batch size, sequence
    length, ...); for local-cpu: of the real recipe it stands for."""
    from cookbook.planner import plan
    from cookbook.planner.recipes import ignorable_overrides

    try:
        if spec.local_cpu:
            text = plan(spec.recipe, gpu=gpu).render()
            return "local-cpu trains a tiny model; this is the estimate for the real recipe it stands for:\n" + text
        return plan(spec.recipe, spec.nodes, spec.gpus_per_node, gpu, **ignorable_overrides(spec.overrides)).render()
    except (ValueError, KeyError) as e:
        return f"no estimate: {e}"


def profiling_overrides(
    recipe: str, profile: str, steps: int = 2, warmup: int = 1, start_step: int = 3
) -> dict[str, str]:
    """The recipe's overrides that turn the profiler on (CPU activities only on local-cpu)."""
    from cookbook.recipes import get_recipe

    device = "cpu" if profile == LOCAL_CPU else "cuda"
    return get_recipe(recipe).profiling_overrides(device=device, steps=steps, warmup=warmup, start_step=start_step)


def setup_checks(profile: str, partition: str | None = None, probe: bool = True, model_dir: str | None = None) -> list:
    """``cookbook doctor``'s checks (printed as a table); stops the notebook when one fails or when a GPU
    profile finds no GPU on the partition."""
    from cookbook import doctor

    existing = model_dir if model_dir and Path(model_dir).exists() else None
    checks = doctor.run_checks(partition, probe=probe, model_dir=existing, client=slurm_client(profile))
    print(doctor.render(checks))
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise NotebookStop(
            "some checks failed:\n"
            + "\n".join(f"- {c.name}: {c.detail}" + (f" -> {c.fix}" if c.fix else "") for c in failed)
        )
    gpus = next((c for c in checks if c.name == "gpus"), None)
    if get_profile(profile).uses_gpus and (gpus is None or gpus.status != "pass"):
        raise NotebookStop(
            f"profile {profile!r} trains on GPUs, but {gpus.detail if gpus else 'no GPU was found'}.\n"
            "On the embedded local cluster use profile='local-cpu' (`make demo` does that)."
        )
    return checks


def prepare_model(profile: str, repo_id: str, model_dir: str, download: bool = False) -> Any:
    """The model a run needs: tiny assets for ``local-cpu``; else the Hub download of ``repo_id`` into
    ``model_dir`` (``download=True``), or a plan of what it would fetch. Hub problems stop the notebook
    with what to do (the token is never shown)."""
    from cookbook import hub

    if profile == LOCAL_CPU:
        from cookbook.local.assets.tiny import ensure_tiny_assets

        assets = ensure_tiny_assets()
        print(f"tiny assets (Llama-3 architecture model, tokenizers, datasets, FLUX encoders): {assets.root}")
        return assets
    print(f"HF token: {hub.token_status()}")
    try:
        if download:
            path = hub.download(repo_id, model_dir)
            print(f"downloaded {repo_id} into {path}")
            return path
        files = hub.plan(repo_id, model_dir)
    except hub.HubError as e:
        raise NotebookStop(str(e)) from None
    table = pd.DataFrame([{"file": f.path, "GB": round(f.size / 1e9, 2), "to fetch": f.will_download} for f in files])
    print(
        f"{repo_id}: {len(files)} files, {table['GB'].sum():.1f} GB; set download=True to fetch them into {model_dir}"
    )
    return table


def check_dataset(
    source: str,
    style: str,
    model_dir: str,
    column_map: dict[str, str] | None = None,
    max_seq_len: int = 2048,
    split: str = "train",
) -> Any:
    """Check a dataset with the model's real tokenizer (:func:`cookbook.data.check_dataset`); problems
    (missing model, bad rows, wrong columns) stop the notebook naming the row and what to change."""
    from cookbook.data import DataError, DatasetSpec, TokenizerSpec
    from cookbook.data import check_dataset as check

    require(
        Path(model_dir).is_dir(),
        f"no model at {model_dir}: download it first (00_setup, or "
        f"`cookbook download REPO --output-dir {model_dir}`), or set model_dir. On the embedded local cluster "
        "use the tiny model: profile='local-cpu' and model_dir of the tiny assets (`make demo` does that)",
    )
    try:
        spec = DatasetSpec(source, style, column_map=dict(column_map or {}), split=split)
        return check(spec, TokenizerSpec.from_model_dir(model_dir), max_seq_len=max_seq_len, model_dir=model_dir)
    except (DataError, ValueError) as e:
        raise NotebookStop(str(e)) from None


def dataset_overrides(
    source: str,
    style: str,
    column_map: dict[str, str] | None = None,
    max_seq_len: int | None = None,
    packed: bool = False,
    recipe: str | None = None,
) -> dict[str, str]:
    """The overrides that plug the dataset into ``recipe`` (default:
    :data:`cookbook.data.recipe.DEFAULT_RECIPE`; for torchtune its ``dataset:`` block and
    ``tokenizer.max_seq_len``): the same ``key=value`` pairs ``cookbook render --set`` and the job
    builder take."""
    from cookbook.data import DatasetSpec
    from cookbook.data import dataset_overrides as recipe_overrides

    spec = DatasetSpec(source, style, column_map=dict(column_map or {}))
    kw = {"recipe": recipe} if recipe else {}
    return recipe_overrides(spec, packed=packed, max_seq_len=max_seq_len, **kw)


# ------------------------------------------------------------------------------------------ text


def progress_line(df: pd.DataFrame, remaining: timedelta | None) -> str:
    """``step 12/16  loss 5.94  tokens/s/GPU 310  ETA 0:00:03`` from a metrics frame."""
    train = df[df["split"].eq("train")] if "split" in df else df
    if train.empty:
        return "no training step logged yet"
    last = train.iloc[-1]
    total = last.get("total_steps") if "total_steps" in train else None
    parts = [f"step {int(last['step'])}" + (f"/{int(total)}" if total is not None and pd.notna(total) else "")]
    if "loss" in train and pd.notna(last.get("loss")):
        parts.append(f"loss {last['loss']:.4f}")
    for col, label in (("tokens_per_second_per_gpu", "tokens/s/GPU"), ("samples_per_second", "samples/s")):
        if col in train and pd.notna(last.get(col)):
            parts.append(f"{label} {last[col]:,.0f}")
            break
    if remaining is not None:
        parts.append(f"ETA {str(remaining).split('.')[0]}")
    return "  ".join(parts)


def run_summary(df: pd.DataFrame) -> str:
    """A few numbers worth reading first: steps, loss first -> last, median throughput."""
    train = df[df["split"].eq("train")] if "split" in df else df
    if train.empty or "loss" not in train:
        return "no training steps in the log"
    loss = train["loss"].dropna()
    lines = [
        f"steps logged: {len(train)} (last step {int(train['step'].iloc[-1])})",
        f"loss: {loss.iloc[0]:.4f} -> {loss.iloc[-1]:.4f} "
        f"({'down' if loss.iloc[-1] < loss.iloc[0] else 'NOT down'} {abs(loss.iloc[0] - loss.iloc[-1]):.4f})",
    ]
    for col, label in (
        ("tokens_per_second_per_gpu", "tokens/s/GPU"),
        ("samples_per_second", "samples/s"),
        ("mfu_pct", "MFU %"),
        ("memory_gib", "memory GiB"),
    ):
        if col in train and train[col].notna().any():
            lines.append(f"{label}: median {train[col].median():,.2f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ use it
def use_spec(spec: JobSpec, job: executor.Job, **overrides: Any) -> JobSpec:
    """The job that uses what ``job`` (trained from ``spec``) produced: recipe ``<recipe>_use`` (see
    :mod:`cookbook.recipes.use`) on one node with the same profile and cluster settings, pointed at the run
    folder and at the model the training started from; ``overrides`` are the use recipe's (e.g. ``merge``)."""
    from dataclasses import replace

    from cookbook.recipes import get_recipe

    name = f"{spec.recipe}_use"
    try:
        recipe = get_recipe(name)
    except KeyError:
        raise NotebookStop(f"{spec.recipe}: no recipe uses its output yet (`cookbook recipes` lists *_use)") from None
    keys = {sp.key for sp in recipe.start_paths(replace(spec, recipe=name, overrides={}))}
    carried = {k: v for k, v in spec.overrides.items() if k in keys}
    if "checkpointer.checkpoint_dir" in spec.overrides and "base" in keys:  # torchtune: the base model
        carried["base"] = spec.overrides["checkpointer.checkpoint_dir"]
    trained = getattr(recipe, "trained_key", "trained")
    return replace(
        spec,
        recipe=name,
        nodes=1,
        job_name=f"{spec.name}-use",
        run_dir=None,
        script_name=None,
        overrides={**carried, trained: str(job.run_dir), **{str(k): str(v) for k, v in overrides.items()}},
    )


def use_model(
    spec: JobSpec,
    job: executor.Job,
    root: str | os.PathLike[str] = "runs",
    client: SlurmClient | None = None,
    **overrides: Any,
) -> Any:
    """Submit the use job of ``job`` (:func:`use_spec`), wait for it and return its
    :class:`cookbook.use.report.UseResult`: generations of the base and the fine-tuned model, held-out loss
    before/after, the merged folder (LoRA, ``merge="$RUN_DIR/merged"``)."""
    from cookbook.use.report import UseResult

    use = submit(use_spec(spec, job, **overrides), root, client or job.client)
    use.wait()
    return UseResult.load(use.run_dir)


def sample_images(
    spec: JobSpec,
    job: executor.Job,
    root: str | os.PathLike[str] = "runs",
    client: SlurmClient | None = None,
    **overrides: Any,
) -> Any:
    """Submit ``flux_schnell_use`` on ``job``'s newest checkpoint (torchtitan's FLUX sampling), wait, and return
    the images as a grid figure (also saved as ``images/grid.png`` in the use job's run folder)."""
    from cookbook.use.report import image_grid

    use = submit(use_spec(spec, job, **overrides), root, client or job.client)
    use.wait()
    return image_grid(use.run_dir)


def outputs(job: executor.Job) -> Any:
    """Where ``job``'s weights are, their format and size, and how to serve them (``cookbook outputs RUN``)."""
    from cookbook.use.outputs import NoOutputs, describe

    try:
        return describe(job.run_dir)
    except NoOutputs as e:
        raise NotebookStop(str(e)) from None


def require(condition: bool, message: str) -> None:
    """Stop the notebook with ``message`` unless ``condition`` holds."""
    if not condition:
        raise NotebookStop(message)


__all__ = [
    "CheckReport",
    "Job",
    "NotebookStop",
    "check_dataset",
    "check_job",
    "job_spec",
    "merge_metrics",
    "model_overrides",
    "outputs",
    "plan_for",
    "prepare_model",
    "profiling_overrides",
    "progress_line",
    "require",
    "run_summary",
    "sample_images",
    "setup_checks",
    "slurm_client",
    "submit",
    "tail_text",
    "use_model",
    "use_spec",
]
