"""JobSpec + Recipe -> sbatch script (Jinja2, every user value shell-quoted) and its config files.

Nothing is written unless the whole job validates (:func:`validate` raises :class:`SpecError`
listing every problem). The script is written once per job; its configs go next to it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from cookbook.recipes import LOCAL_CPU, get_recipe
from cookbook.recipes.base import Recipe
from cookbook.secure_files import make_executable
from cookbook.spec import PROFILES, SHARED_PORT_SPAN, JobSpec, SpecError, check_spec

_TEMPLATES = Path(__file__).parent / "templates"
_BUILTIN_VARS = ("RECIPE_DIR", "RUN_DIR")


@dataclass(frozen=True)
class RenderedJob:
    """The sbatch text, the extra files (``{name: text}``) and warnings worth printing."""

    script: str
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def quote(value: object) -> str:
    """Shell-quote one value; nothing in it expands."""
    return shlex.quote(str(value))


def quote_with_vars(value: object, names: tuple[str, ...] | list[str]) -> str:
    """Shell-quote ``value`` except the references ``$NAME`` to the given variables, which expand."""
    text = str(value)
    if not names:
        return quote(text)
    pattern = re.compile(r"\$(?:\{(" + "|".join(map(re.escape, names)) + r")\}|(" + "|".join(map(re.escape, names))
                         + r")(?![A-Za-z0-9_]))")
    parts, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            parts.append(quote(text[pos:m.start()]))
        parts.append('"${%s}"' % (m.group(1) or m.group(2)))
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append(quote(text[pos:]))
    return "".join(parts)


def validate(spec: JobSpec) -> Recipe:
    """The spec's recipe, once the spec and the recipe both accept it; SpecError with every problem."""
    problems = check_spec(spec)
    try:
        recipe = get_recipe(spec.recipe)
    except KeyError as e:
        raise SpecError(problems + [str(e.args[0])]) from None
    if spec.profile in PROFILES:        # recipe checks assume a known profile
        problems += recipe.validate(spec)
    if problems:
        raise SpecError(problems)
    return recipe


def render_job(spec: JobSpec) -> RenderedJob:
    """Validate ``spec`` and render its sbatch script and config files (nothing written)."""
    recipe = validate(spec)
    launch = recipe.command(spec)
    names = (*_BUILTIN_VARS, *launch.variables)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = quote
    env.filters["arg"] = lambda v: quote_with_vars(v, names)
    launcher = "tune run" if launch.launcher == "tune" else "torchrun"
    srun_args: list[str] = []
    if spec.container_image:
        srun_args.append(f"--container-image={spec.container_image}")
        if spec.container_mounts:
            srun_args.append(f"--container-mounts={','.join(spec.container_mounts)}")
    variables = {k: quote_with_vars(v, names) for k, v in launch.variables.items()}
    script = env.get_template("job.sbatch.j2").render(
        spec=spec, recipe=recipe, profile=spec.profile_info, env=spec.profile_info.env,
        log_file=f"{spec.log_dir.rstrip('/') or '.'}/%x-%j.out",
        recipe_dir=quote(spec.recipe_dir) if spec.recipe_dir else '"$SLURM_SUBMIT_DIR"',
        run_dir=quote(spec.run_dir) if spec.run_dir else '"$RECIPE_DIR"/runs/' + quote(spec.name),
        variables=variables, resume=recipe.resume(spec).rstrip(), srun_args=srun_args,
        launcher=launcher, args=launch.args, port_span=SHARED_PORT_SPAN)
    return RenderedJob(script, recipe.files(spec), recipe.warnings(spec))


def write_job(spec: JobSpec, script_path: str | Path) -> Path:
    """Render ``spec`` and write the script to ``script_path``, its configs next to it; return the path.

    Without ``spec.recipe_dir`` the script refers to its configs through the folder it is written to.
    """
    script_path = Path(script_path)
    if spec.recipe_dir is None:
        from dataclasses import replace

        spec = replace(spec, recipe_dir=str(script_path.parent.resolve()))
    job = render_job(spec)
    script_path.parent.mkdir(parents=True, exist_ok=True)
    for name, text in job.files.items():
        (script_path.parent / name).write_text(text)
    script_path.write_text(job.script)
    make_executable(script_path)             # +x where the user's umask lets reads through
    return script_path


def log_dir_of(script: str | Path) -> Path | None:
    """The folder of ``#SBATCH --output=`` in a script (Slurm does not create it), if it has one."""
    for line in Path(script).read_text().splitlines():
        if line.startswith("#SBATCH --output="):
            value = shlex.split(line.split("=", 1)[1])[0]
            return Path(value).parent
    return None


def generated_specs() -> list[JobSpec]:
    """The spec of every script in ``slurm-recipes/``: each recipe x profile, 2 nodes, portable paths."""
    from cookbook.recipes import list_recipes

    specs = []
    for recipe in list_recipes():
        for name in PROFILES:
            local = name == LOCAL_CPU
            specs.append(JobSpec(
                recipe=recipe.name, profile=name, nodes=2, gpus_per_node=0 if local else 8,
                time="00:10:00" if local else "04:00:00", exclusive=not local, signal_seconds=30 if local else 120,
                job_name=f"{recipe.name}-{name}".replace("_", "-"),
                venv="$RECIPE_DIR/../../.venv" if local else None,
                assets_dir="$RECIPE_DIR/../../.cache/tiny" if local else None))
    return specs


def generated_files() -> dict[str, str]:
    """``{relative path: text}`` of everything :func:`generate_recipes` writes (README excluded)."""
    out: dict[str, str] = {}
    for spec in generated_specs():
        recipe = get_recipe(spec.recipe)
        job = render_job(spec)
        out[f"{recipe.framework}/{spec.recipe}.{spec.profile}.sbatch"] = job.script
        out.update({f"{recipe.framework}/{n}": t for n, t in job.files.items()})
    return out


def generate_recipes(root: Path) -> list[Path]:
    """Write every generated script and config under ``root``; return the paths written."""
    written = []
    for rel, text in sorted(generated_files().items()):
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sbatch"):
            path.chmod(0o755)
        written.append(path)
    return written


__all__ = ["generate_recipes", "generated_files", "generated_specs", "LOCAL_CPU", "RenderedJob", "quote", "quote_with_vars", "render_job", "validate", "write_job",
           "log_dir_of"]
