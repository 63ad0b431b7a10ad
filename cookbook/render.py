"""A resolved job -> sbatch script (Jinja2, every user value shell-quoted) and its config files.

The writers (:func:`write_job`, :func:`write_array`, :func:`test_only`) take the :class:`ResolvedJob` that
:func:`cookbook.resolve.resolve` made once per submission, and neither check nor size it again. A bare
:class:`JobSpec` handed to them (the API's convenience for a script or a test) is resolved at that one front door,
:func:`_resolved`; the engine's own submissions (``Executor``, ``cookbook render``, the notebooks' steps) pass the
resolved job. Nothing is written unless the whole job validates. The script is written once per job; its configs
go next to it.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import cookbook_runtime
from cookbook.recipes import LOCAL_CPU, get_recipe
from cookbook.recipes.base import Launch, Recipe, resolve_here
from cookbook.resolve import ResolvedJob, placed, resolve, with_signal
from cookbook.secure_files import make_executable
from cookbook.slurm.client import SlurmClient, SlurmError, SlurmUnreachable
from cookbook.spec import SHARED_PORT_SPAN, JobSpec, SpecError, check_spec, profile_defaults, profiles
from cookbook.templating import quote, quote_with_vars, render_template, template_env
from cookbook.tracking import VARIABLES as TRACKER_VARIABLES
from cookbook.tracking import tracker_block
from cookbook.versions import exact_version

_BUILTIN_VARS = ("RECIPE_DIR", "RUNTIME_DIR", "RUN_DIR", "SLURM_JOB_NUM_NODES")
RUNTIME = Path(cookbook_runtime.__file__).resolve().parent  # what a job runs on the nodes: shipped once
RUNTIME_NAME = RUNTIME.name


def runtime_files() -> dict[str, str]:
    """``{cookbook_runtime/PATH.py: text}``: the job runtime (the gate's node checks, the stop protocol, the hang
    watch, the rehearsal's check, the programs the ranks run), written into a rendered job's folder;
    ``slurm-recipes/`` holds it once, beside the recipe folders."""
    files = sorted(RUNTIME.rglob("*.py"))
    return {f"{RUNTIME_NAME}/{f.relative_to(RUNTIME).as_posix()}": f.read_text() for f in files}


@dataclass(frozen=True)
class RenderedJob:
    """The sbatch text, the extra files (``{name: text}``) and warnings worth printing."""

    script: str
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def log_file(spec: JobSpec) -> str:
    """``#SBATCH --output``: ``<job name>-<job id>.out`` in ``spec.log_dir`` (``.``: where sbatch runs)."""
    folder = spec.log_dir.rstrip("/")
    return "%x-%j.out" if folder in ("", ".") else f"{folder}/%x-%j.out"


def runtime_lines(job: ResolvedJob, names: tuple[str, ...]) -> list[str]:
    """The switches of ``python3 -m cookbook_runtime.run`` for ``job``, one group a line, shell-quoted: the
    rendezvous, the stop-save, the resume, the gate's thresholds (from the profile, each with its source in
    ``cookbook profiles show``), the srun options of a container."""
    spec, recipe = job.spec, job.recipe
    gate = spec.profile_info.gate()
    sizes = job.run_time_sizes  # the model's, picked at run time (FSDP's MODEL)
    port = [f"--port={spec.port}"] + ([] if spec.exclusive else [f"--port-span={SHARED_PORT_SPAN}"])
    interface = spec.profile_info.interface  # a pinned one is exported by the script (NCCL_SOCKET_IFNAME)
    if interface in ("detect", None):
        port.append(f"--interface={interface or 'none'}")
    if spec.gpus_per_node == 0 or spec.procs_per_node != spec.gpus_per_node:
        port.append(f"--nproc-per-node={spec.procs_per_node}")  # else Slurm's SLURM_GPUS_ON_NODE
    port.append(f"--max-retries={int(gate.max_retries.value)}")  # recoveries per window (the runtime's --retry-window)
    if spec.spare_nodes:
        port.append(f"--spare-nodes={spec.spare_nodes}")  # trains on the allocation's nodes less these
    lines = [port]
    if spec.requeue:
        seconds = job.save_seconds or 0.0
        save = f"--save-seconds={seconds:.0f}" if not sizes else f"--save-seconds=${{{sizes[1]}}}"
        # = #SBATCH --signal's: the ranks agree on a stop every N steps within it (else: every step)
        lead = ["--lead-from-signal"] if job.lead_from_signal else []  # written once: #SBATCH
        own = ["--lead-for-save"] if sizes and lead else []  # a larger MODEL than the --signal's: the runtime's stop
        lines.append(["--requeue", *lead, *own] + ([save] if seconds else []))
    resume = (["--once"] if recipe.trains else []) + recipe.resume(spec)  # on the stop-save's line: what resumes
    if resume and spec.requeue:
        lines[-1] += resume
    elif resume:
        lines.append(resume)
    checks = ["--gate", f"--gate-seconds={gate.time_limit_s.value:g}"]
    if gate.matmul_fraction:
        checks.append(f"--gate-matmul-fraction={gate.matmul_fraction.value:g}")
    if gate.matmul_min_tflops:
        checks.append(f"--gate-matmul-min-tflops={gate.matmul_min_tflops.value:g}")
    checks += [
        f"--gate-busbw-floor={gate.allreduce_min_busbw_gbps.value:g}",
        f"--gate-allreduce-mb={gate.allreduce_mb}",
        f"--gate-min-free-gb={gate.min_free_disk_gb.value:g}",
    ]
    lines.append(checks)
    pins = [f"{p}=={v}" if (v := exact_version(p)) else p for p in recipe.packages]  # the tested versions
    needs = [f"--needs={','.join(pins)}"]
    if recipe.trains and job.checkpoint_bytes is not None:
        size = f"{job.checkpoint_bytes / 1e9:.0f}"
        needs.append(f"--checkpoint-gb={f'${{{sizes[0]}}}' if sizes else size}")
    lines[0] += needs  # where the ranks meet, and what their Python must have
    if spec.container_image:
        # one import of the image per node and job: the named container is reused by every srun of the job
        srun = [f"--srun-arg=--container-image={spec.container_image}", f"--srun-arg=--container-name={spec.name}"]
        if spec.container_mounts:
            srun.append(f"--srun-arg=--container-mounts={','.join(spec.container_mounts)}")
        lines.append(srun)
    return [" ".join(quote_with_vars(word, names) for word in line) for line in lines]


def with_training_nodes(launch: Launch, spec: JobSpec) -> Launch:
    """``launch`` with ``$SLURM_JOB_NUM_NODES`` in its arguments (e.g. torchtitan's replica count, one per node)
    written as ``spec.nodes`` when the job has spare nodes: Slurm's count then includes the spares, which stand by."""
    if not spec.spare_nodes:
        return launch
    nodes = str(spec.nodes)
    args = tuple(a.replace("${SLURM_JOB_NUM_NODES}", nodes).replace("$SLURM_JOB_NUM_NODES", nodes) for a in launch.args)
    return replace(launch, args=args)


def program_lines(args: tuple[str, ...], names: tuple[str, ...]) -> list[str]:
    """The program's arguments, shell-quoted, one option a line with its value (``--config FILE``, ``-m MODULE``)."""
    lines: list[list[str]] = []
    for word in args:
        quoted = quote_with_vars(word, names)
        takes_value = bool(lines) and len(lines[-1]) == 1 and lines[-1][0].startswith("-") and "=" not in lines[-1][0]
        if takes_value and not word.startswith("-"):
            lines[-1].append(quoted)
        else:
            lines.append([quoted])
    return [" ".join(line) for line in lines]


def validate(spec: JobSpec) -> Recipe:
    """The spec's recipe, once the spec and the recipe both accept it; SpecError with every problem
    (:func:`cookbook.resolve.resolve`)."""
    return _resolved(spec).recipe


def render_job(spec: JobSpec, recipe: Recipe | None = None) -> RenderedJob:
    """Validate ``spec`` and render its sbatch script and config files (nothing written). ``recipe``: render
    with this one instead of the spec's (validated all the same), e.g. the FSDP script for any model, whose
    lead time is its largest model's. A caller that holds the resolved job calls :func:`render`."""
    return render(_resolved(spec, recipe=recipe))


def _resolved(job: ResolvedJob | JobSpec, script_path: Path | None = None, recipe: Recipe | None = None) -> ResolvedJob:
    """``job`` placed at ``script_path`` (:func:`placed`; None: as it is). A resolved job is not checked or sized
    again; a bare :class:`JobSpec` (the API's convenience, e.g. a test's) is resolved here (``recipe``: see
    :func:`render_job`), the one place in this module that resolves: the engine's submissions resolve before
    they render (:func:`cookbook.resolve.resolve`) and pass the resolved job."""
    if isinstance(job, ResolvedJob):
        return job if script_path is None else replace(job, spec=placed(job.spec, script_path))
    return resolve(job if script_path is None else placed(job, script_path), recipe)


def render(job: ResolvedJob) -> RenderedJob:
    """The sbatch script, config files and warnings of a resolved job (nothing checked or sized again)."""
    spec, recipe = job.spec, job.recipe
    launch = with_training_nodes(recipe.command(spec), spec)
    names = (*_BUILTIN_VARS, *launch.prelude_variables, *launch.variables)
    if spec.tracker != "none":
        names += TRACKER_VARIABLES
    env = template_env()
    variables = {k: quote_with_vars(v, names) for k, v in launch.variables.items()}
    script = env.get_template("job.sbatch.j2").render(
        spec=spec,
        recipe=recipe,
        profile=spec.profile_info,
        env=spec.profile_info.env,
        log_file=log_file(spec),
        recipe_dir=quote(spec.recipe_dir) if spec.recipe_dir else '"$SLURM_SUBMIT_DIR"',
        runtime_dir=quote_with_vars(spec.runtime_dir, names) if spec.runtime_dir else '"$RECIPE_DIR"',
        run_dir=quote_with_vars(spec.run_dir, names) if spec.run_dir else '"$RECIPE_DIR"/runs/' + quote(spec.name),
        prelude=launch.prelude.rstrip(),
        check=launch.check.rstrip(),
        variables=variables,
        tracker=tracker_block(spec, recipe.wandb_offline_runs(spec)),
        launcher="tune run" if launch.launcher == "tune" else "torchrun",
        program_lines=program_lines(launch.args, names),
        runtime_lines=runtime_lines(job, names),
        offline=offline_reason(spec, recipe),
        shell_names=names,
    )
    warnings = recipe.warnings(spec) + start_path_warnings(spec, recipe) + hub_fetch_warnings(spec, recipe)
    warnings += mount_problems(spec, recipe)
    files = {**recipe.files(spec), **({} if spec.runtime_dir else runtime_files())}
    return RenderedJob(script, files, warnings)


def start_path_warnings(spec: JobSpec, recipe: Recipe) -> list[str]:
    """A warning for each path the job reads that is not on this machine (the login node shares the cluster's
    filesystem, so a path missing here is usually missing on the nodes too): the start-up paths, the other
    config keys naming files when set (:meth:`Recipe.read_paths`), the venv and the tiny assets' folder."""
    if spec.recipe_dir is None:
        return []
    out = []
    variables = recipe.start_variables(spec)
    for sp in recipe.read_paths(spec):
        value = spec.overrides.get(sp.key, sp.default)
        path = resolve_here(value, spec, variables) if value else None
        if path is None or (sp.hub_ok and not path.startswith(("/", "."))):
            continue
        if not Path(path).exists():
            how = (
                f"export {sp.variable}=PATH before sbatch, or render with --set {sp.key}=PATH"
                if sp.variable
                else f"render with --set {sp.key}=PATH"
            )
            out.append(f"{sp.key} = {path} ({sp.what}) does not exist on this machine: put it there, or {how}")
    folders: tuple[tuple[str, str | None, str], ...] = (
        ("venv", spec.venv, "--venv"),
        ("assets_dir", spec.assets_dir if spec.local_cpu else None, "assets_dir="),
    )
    for label, folder, flag in folders:
        path = resolve_here(folder, spec, variables) if folder else None
        if path is not None and not Path(path).exists():
            out.append(
                f"{label} = {path} (read by every node) does not exist on this machine: create it, or set {flag}"
            )
    return out


STAGE_ROOT = "/shared/hf"  # the example shared folder the render's advice names


def hub_fetch_warnings(spec: JobSpec, recipe: Recipe) -> list[str]:
    """A multi-node GPU job that reads a Hub id at start-up (FLUX's T5 and CLIP encoders, C4, alpaca): every rank
    fetches it when it starts, hundreds at once (HTTP 429, a shared HF_HOME written concurrently). One warning
    each, with the staging command and the setting that then points the job at the local copy."""
    if spec.local_cpu or spec.nodes < 2:
        return []
    out = []
    for f in recipe.hub_fetches(spec):
        local = f.local(STAGE_ROOT)
        point = f"export {f.variable}={local} HF_HUB_OFFLINE=1 before sbatch, or render" if f.variable else "render"
        out.append(
            f"{f.key} = {f.repo_id} is a Hub {f.repo_type} every rank of the {spec.nodes} nodes fetches at start-up. "
            f"Stage it once (`cookbook stage {spec.recipe} --root {STAGE_ROOT}` stages all the job reads), then "
            f"{point} with --set {f.key}={local} (the script then sets HF_HUB_OFFLINE=1)"
        )
    return out


def offline_reason(spec: JobSpec, recipe: Recipe) -> str:
    """Why a GPU script sets ``HF_HUB_OFFLINE=1`` ("": it does not): every model, tokenizer and dataset the job
    reads is a local path, so no rank waits on the Hub (the libraries otherwise still ask it about a file)."""
    given = {v.name for v in spec.profile_info.env} | set(spec.env)
    if spec.local_cpu or "HF_HUB_OFFLINE" in given or not recipe.hub_complete(spec) or recipe.hub_fetches(spec):
        return ""
    return "every model, tokenizer and dataset this job reads is a local path (cookbook stage): no rank asks the Hub"


def mount_problems(spec: JobSpec, recipe: Recipe) -> list[str]:
    """Container jobs: every folder the job reads or writes must lie inside a ``--container-mounts``
    destination, else the job fails only after the queue."""
    if not spec.container_image:
        return []
    dests = [m.split(":")[1].rstrip("/") or "/" for m in spec.container_mounts if len(m.split(":")) >= 2]
    variables = recipe.start_variables(spec)
    paths = {"recipe folder ($RECIPE_DIR)": spec.recipe_dir, "run folder ($RUN_DIR)": spec.run_dir}
    paths.update(
        {
            f"{sp.key} ({sp.what})": resolve_here(spec.overrides.get(sp.key, sp.default), spec, variables)
            for sp in recipe.read_paths(spec)  # start paths and the config keys naming files (e.g. the dataset)
        }
    )
    out = []
    for label, path in paths.items():
        if not path or not path.startswith("/"):
            continue
        if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in dests):
            out.append(
                f"container: {label} {path} is inside no --container-mounts destination "
                f"({', '.join(dests) or 'none given'}): add --container-mount {path}:{path}"
            )
    return out


def script_file(script_path: str | Path) -> Path:
    """``script_path`` as the script's file; :class:`SpecError` (one line) where it names a folder: it ends in a
    path separator or is an existing folder (the script and ``cookbook_runtime/`` would land beside it)."""
    text = os.fspath(script_path)
    path = Path(script_path)
    if text.endswith(tuple(filter(None, (os.sep, os.altsep)))) or path.is_dir():
        raise SpecError(
            [f"script path {text!r} names a folder; a job script is a file: give its name, e.g. {path / 'job.sbatch'}"]
        )
    return path


def write_job(job: ResolvedJob | JobSpec, script_path: str | Path, rendered: RenderedJob | None = None) -> Path:
    """Write ``job``'s script to ``script_path``, its configs next to it; return the path.

    ``job``: resolved from ``placed(spec, script_path)`` (a bare spec is resolved first, :func:`_resolved`);
    without ``spec.recipe_dir`` the script refers to its configs through the folder it is written to.
    ``rendered``: the rendering of ``job`` the caller already made (its warnings shown). A ``script_path`` that
    names a folder is refused before anything is written (:func:`script_file`).
    """
    script_path = script_file(script_path)
    rendered = rendered or render(_resolved(job, script_path))
    script_path.parent.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.files.items():
        (script_path.parent / name).parent.mkdir(parents=True, exist_ok=True)  # cookbook_runtime/
        (script_path.parent / name).write_text(text)
    script_path.write_text(rendered.script)
    make_executable(script_path)  # +x where the user's umask lets reads through
    return script_path


def write_command_job(
    spec: JobSpec, command: list[str], script_path: str | Path, workdir: str | Path, description: str
) -> Path:
    """Write a CPU job that runs ``command`` (each word shell-quoted) in ``workdir`` on one node: the same
    ``#SBATCH`` lines and checks as a recipe's job (``spec.recipe`` names the job, e.g. ``data-c4``; GPUs 0).
    Used for data preparation that a training job then waits for (``dependency="afterok:ID"``)."""
    spec = with_signal(spec, None)
    problems = check_spec(spec, cpu_job=True)
    if spec.nodes != 1 or spec.gpus_per_node != 0:
        problems.append(
            f"a CPU job runs on 1 node without GPUs (nodes={spec.nodes}, gpus_per_node={spec.gpus_per_node})"
        )
    if not command:
        problems.append("no command to run")
    if problems:
        raise SpecError(problems)
    text = render_template(
        "command.sbatch.j2",
        spec=spec,
        description=re.sub(r"[\x00-\x1f\x7f]", " ", description),
        log_file=log_file(spec),
        workdir=quote(str(Path(workdir).resolve())),
        command=" ".join(quote(word) for word in command),
    )
    script = Path(script_path)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    make_executable(script)
    return script


def array_task_scripts(folder: str | Path, count: int) -> list[Path]:
    """The job scripts of an array's ``count`` tasks in the array folder ``folder``: ``folder/task-N/job.sbatch``."""
    return [Path(folder).resolve() / f"task-{task}" / "job.sbatch" for task in range(count)]


def write_array(
    tasks: Sequence[ResolvedJob | JobSpec], folder: str | Path, name: str, parallelism: int | None = None
) -> Path:
    """Write one Slurm array for ``tasks`` (a sweep: same Slurm settings, different config overrides): each task's
    full job script in ``folder/task-N/job.sbatch`` (:func:`array_task_scripts`; each resolved from its spec placed
    there, a bare spec resolved first as :func:`write_job` does) and the array script ``folder/job.sbatch`` (job
    ``name``, ``--array=0-(N-1)[%parallelism]``, the first task's ``#SBATCH`` lines with its lead time, log
    ``<name>-<array id>_<task>.out``) that runs task N's script in task N's allocation. Returns its path."""
    if not tasks:
        raise SpecError(["an array needs at least one task"])
    if parallelism is not None and parallelism < 1:
        raise SpecError([f"parallelism={parallelism}: run at least 1 task at a time (or leave it unset: all)"])
    scripts = array_task_scripts(folder, len(tasks))
    jobs = [_resolved(task, script) for task, script in zip(tasks, scripts, strict=True)]
    first = jobs[0].spec
    slurm = {f: getattr(first, f) for f in _SLURM_FIELDS}
    differ = sorted({f for j in jobs[1:] for f in _SLURM_FIELDS if getattr(j.spec, f) != slurm[f]})
    if differ:
        raise SpecError([f"the tasks of one array share their Slurm settings; these differ: {', '.join(differ)}"])
    for job, script in zip(jobs, scripts, strict=True):
        write_job(job, script)
    folder = Path(folder).resolve()
    base = replace(first, job_name=name)
    limit = f"%{parallelism}" if parallelism else ""
    text = render_template(
        "array.sbatch.j2",
        spec=base,
        recipe=jobs[0].recipe,
        count=len(jobs),
        array=f"0-{len(jobs) - 1}{limit}",
        log_file=log_file(base).replace("%j", "%A_%a"),
        array_dir=quote(str(folder)),
        task_script="job.sbatch",
    )
    script = folder / "job.sbatch"
    script.write_text(text)
    make_executable(script)
    return script


# Settings every task of an array shares: the array script's #SBATCH lines are the first task's.
_SLURM_FIELDS = (
    "nodes", "spare_nodes", "gpus_per_node", "cpus_per_task", "partition", "account", "qos", "exclude", "constraint",
    "reservation", "mem", "gres", "sbatch_extra", "dependency", "time", "exclusive", "log_dir", "profile", "requeue",
    "signal_seconds",
)  # fmt: skip


def test_only(
    job: ResolvedJob | JobSpec, client: SlurmClient | None = None, rendered: RenderedJob | None = None
) -> str:
    """Ask Slurm whether it would run ``job``: ``sbatch --test-only`` of its script (``rendered``: the rendering
    the caller already made; nothing queued, nothing kept). Returns Slurm's answer (``Job 12 to start at ... on
    nodes n2 ...``); :class:`SpecError` with Slurm's own message when it refuses (unknown reservation or
    partition, excluded every node, no such feature, more memory than a node has ...)."""
    spec = job.spec if isinstance(job, ResolvedJob) else job
    with tempfile.TemporaryDirectory(prefix="cookbook-test-only-") as tmp:
        script = write_job(job, Path(tmp) / f"{spec.script_stem}.sbatch", rendered)
        try:
            return (client or SlurmClient()).test_only(script)
        except SlurmUnreachable as e:  # not the job's fault: the controller named, SLURM_CONF
            raise SpecError([e.line]) from e
        except SlurmError as e:
            said = " / ".join(ln.strip() for ln in (e.stderr or str(e)).splitlines() if ln.strip())
            if e.returncode == 127:  # no sbatch here
                raise SpecError([f"could not ask Slurm (sbatch --test-only): {said}"]) from e
            raise SpecError([f"Slurm refuses the job (sbatch --test-only): {said}"]) from e


def log_dir_of(script: str | Path) -> Path | None:
    """The folder of ``#SBATCH --output=`` in a script (Slurm does not create it), if it has one."""
    for line in Path(script).read_text().splitlines():
        if line.startswith("#SBATCH --output="):
            value = shlex.split(line.split("=", 1)[1])[0]
            return Path(value).parent
    return None


def generated_specs() -> list[JobSpec]:
    """The spec of every script in ``slurm-recipes/``: each recipe x profile, on the recipe's ``script_nodes``
    (2 for training), portable paths."""
    from cookbook.recipes import list_recipes
    from cookbook.recipes.fsdp import DEFAULT_MODEL

    specs = []
    for recipe in list_recipes():
        # FSDP: one script per profile, for every model (MODEL=... sbatch fsdp.<profile>.sbatch)
        any_model = recipe.framework == "fsdp"
        if any_model and recipe.name != f"fsdp_{DEFAULT_MODEL}":
            continue
        stem = "fsdp" if any_model else recipe.name
        for name in profiles(builtin_only=True):  # slurm-recipes/: the profiles shipped with the package
            local = name == LOCAL_CPU
            specs.append(
                JobSpec(
                    recipe=recipe.name,
                    profile=name,
                    nodes=recipe.script_nodes,
                    **profile_defaults(name),
                    job_name=f"{stem}-{name}".replace("_", "-"),
                    script_name=f"{stem}.{name}.sbatch",
                    # one torchtune YAML for every GPU profile (the same config; generated_files checks it)
                    config_name=None if local or recipe.framework != "torchtune" else f"{stem}.yaml",
                    run_dir=f"$RECIPE_DIR/runs/fsdp-$MODEL-{name}" if any_model else None,
                    venv="$RUNTIME_DIR/../.venv",  # make setup's, beside slurm-recipes/
                    runtime_dir="$RECIPE_DIR/..",  # slurm-recipes/cookbook_runtime, once for every recipe folder
                    assets_dir="$RECIPE_DIR/../../.cache/tiny" if local else None,
                )
            )
    return specs


def generated_files() -> dict[str, str]:
    """``{relative path: text}`` of everything :func:`generate_recipes` writes (README excluded)."""
    from cookbook.recipes.fsdp import FsdpAnyModel

    out: dict[str, str] = {}
    for spec in generated_specs():
        recipe = get_recipe(spec.recipe)
        job = render_job(spec, FsdpAnyModel() if recipe.framework == "fsdp" else None)
        out[f"{recipe.framework}/{spec.script_name}"] = job.script
        for name, text in job.files.items():
            path = f"{recipe.framework}/{name}"
            if out.setdefault(path, text) != text:
                raise ValueError(f"{path}: the scripts sharing it would need different contents ({spec.script_name})")
    return out


START_PATHS_BEGIN, START_PATHS_END = "<!-- start-paths: generated -->", "<!-- /start-paths -->"


def start_paths_table() -> str:
    """Markdown: every file or folder a GPU script reads at start-up, its variable and default."""
    from cookbook.recipes import list_recipes

    rows = ["| recipe | variable | config key | default | what |", "| --- | --- | --- | --- | --- |"]
    seen: set[tuple[str, ...]] = set()
    for recipe in list_recipes():
        spec = JobSpec(recipe=recipe.name, profile="generic")
        paths = recipe.start_paths(spec)
        key = tuple(f"{sp.key}={sp.default}" for sp in paths)
        name = "`fsdp_<model>`" if recipe.framework == "fsdp" else f"`{recipe.name}`"
        if not paths or (recipe.framework == "fsdp" and key in seen):
            continue
        seen.add(key)
        for sp in paths:
            rows.append(
                f"| {name} | {f'`{sp.variable}`' if sp.variable else '(derived)'} | `{sp.key}` | "
                f"`{sp.default}` | {sp.what} |"
            )
    return "\n".join(rows)


def with_start_paths_table(readme: str) -> str:
    """``readme`` with the text between the start-paths markers replaced by :func:`start_paths_table`."""
    head, sep, rest = readme.partition(START_PATHS_BEGIN)
    if not sep:
        return readme
    _, _, tail = rest.partition(START_PATHS_END)
    return f"{head}{START_PATHS_BEGIN}\n{start_paths_table()}\n{START_PATHS_END}{tail}"


def generate_recipes(root: Path) -> list[Path]:
    """Write every generated script and config under ``root`` (and the README's start-paths table);
    return the paths written."""
    readme = Path(root) / "README.md"
    if readme.exists():
        readme.write_text(with_start_paths_table(readme.read_text()))
    written = []
    for rel, text in sorted(generated_files().items()):
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sbatch"):
            make_executable(path)
        written.append(path)
    return written


__all__ = [
    "LOCAL_CPU",
    "RenderedJob",
    "ResolvedJob",
    "generate_recipes",
    "generated_files",
    "generated_specs",
    "log_dir_of",
    "log_file",
    "mount_problems",
    "placed",
    "quote",
    "quote_with_vars",
    "render",
    "render_job",
    "script_file",
    "render_template",
    "resolve_here",
    "start_path_warnings",
    "hub_fetch_warnings",
    "template_env",
    "test_only",
    "validate",
    "with_signal",
    "write_job",
]
