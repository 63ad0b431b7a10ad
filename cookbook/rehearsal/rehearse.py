"""``rehearse(script)``: run a rendered sbatch script on the real cluster with its launcher swapped for a check.

The script is submitted as it is (same nodes, GPUs, CPUs, partition, profile environment, head-node and
interface logic), with four environment variables that only the launch line reads:
``COOKBOOK_REHEARSE`` (the check program, :mod:`cookbook_runtime.rehearsal`, copied next to its report
folder), ``COOKBOOK_REHEARSE_OUT`` (where every node writes its report), ``COOKBOOK_REHEARSE_MANIFEST``
(what to check: the recipe's start-up paths and config keys) and ``RECIPE_DIR``. The time limit becomes a
few minutes and the log goes to the report folder, so the real run's log stays clean. Nothing trains.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import cookbook_runtime
from cookbook.recipes import Recipe, get_recipe
from cookbook.secure_files import make_executable
from cookbook.slurm.client import SlurmClient, SlurmError, SlurmUnreachable, read_output
from cookbook.spec import JobSpec, get_profile, profile_defaults, profiles
from cookbook.templating import render_template, script_header
from cookbook.versions import exact_version
from cookbook_runtime.decide import NodeReport  # one report type: the gate's, the rehearsal's, the probe's

HOOK = "COOKBOOK_REHEARSE"  # the runtime (cookbook_runtime.run) runs this check in the launcher's place
RUNTIME_LAUNCH = "-m cookbook_runtime.run"  # a script that can be rehearsed ends in the runtime's launch line
NODE_CHECK = Path(cookbook_runtime.__file__).with_name("rehearsal.py")  # the runtime's; standard library only
CHECK_TEMPLATE = "rehearse_node_check.sh.j2"  # templates/: the launcher stand-in that starts NODE_CHECK


class RehearsalError(ValueError):
    """The script cannot be rehearsed (missing, not a cookbook script, Slurm refused it): one line for the user."""


@dataclass
class RehearsalReport:
    """Every node's result; ``ok`` only when every node of the allocation passed."""

    script: Path
    job_id: str | None
    state: str
    nodes: list[NodeReport]
    problems: list[str] = field(default_factory=list)  # not tied to a node (before submission, the job)
    folder: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.nodes) and all(n.ok for n in self.nodes)

    def rows(self) -> list[dict[str, str]]:
        """One row per node: the columns of :meth:`table`."""
        out = []
        for n in self.nodes:
            d = n.facts
            g, c, net = d.get("gpus", {}), d.get("cpus", {}), d.get("network", {})
            rdzv = d.get("rendezvous", {})
            out.append(
                {
                    "node": n.node,
                    "host": str(d.get("host", "?")),
                    "gpus": f"{g.get('visible')}"
                    + (f" (smi {g['nvidia_smi']})" if g.get("nvidia_smi") is not None else ""),
                    "cpus": f"{c.get('step') or c.get('affinity')}/{c.get('job_on_node')}",
                    "rendezvous": (
                        "head, reached by " + str(len(rdzv.get("reached_by", [])))
                        if rdzv.get("head")
                        else ("reached" if rdzv.get("reached") else "-")
                    )
                    if rdzv
                    else "-",
                    "config": str(d.get("config", "-")),
                    "paths": str(len(d.get("paths", {}))),
                    "interface": str(net.get("NCCL_SOCKET_IFNAME") or "-"),
                    "result": "ok" if n.ok else f"{len(n.failures)} problem(s)",
                }
            )
        return out

    def table(self) -> str:
        """The per-node table and every problem, named by node, as plain text."""
        rows = self.rows()
        lines = [f"rehearsal of {self.script} (job {self.job_id or '-'}, {self.state})"]
        if rows:
            cols = list(rows[0])
            width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
            lines.append("  ".join(c.ljust(width[c]) for c in cols))
            lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
        lines += [f"problem: {p}" for p in self.problems]
        lines += [f"problem on {n.node}: {p}" for n in self.nodes for p in n.failures]
        lines += [f"note on {n.node}: {x}" for n in self.nodes for x in n.notes]
        lines.append("PASSED: every node can run this job" if self.ok else "FAILED: fix the problems above")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: object, cycle: bool) -> None:
        """IPython/Jupyter shows the table, not the dataclass fields."""
        p.text(self.table())  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------ script
def sbatch_value(text: str, option: str) -> str | None:
    """The value of ``#SBATCH --option=value`` in a script (the last one wins, as in sbatch)."""
    found = re.findall(rf"^#SBATCH\s+--{re.escape(option)}(?:[= ](\S+))?\s*$", text, re.M)
    return found[-1] if found else None


def container_mounts(text: str) -> list[str]:
    """Destinations of the script's ``--container-mounts`` (empty: no container)."""
    m = re.search(r"--container-mounts=('[^']*'|\S+)", text)
    if not m:
        return []
    value = shlex.split(m.group(1))[0]
    return [part.split(":")[1] for part in value.split(",") if len(part.split(":")) >= 2]


def manifest(text: str, env: dict[str, str] | None = None) -> dict:
    """What the node check verifies for this script: start-up paths and config keys per framework.
    ``env``: the job's environment (a script for any model, ``fsdp.<profile>.sbatch``, reads ``MODEL``)."""
    header = script_header(text)
    recipe: Recipe | None = None
    profile = "generic"
    if header:
        default = re.search(r"^MODEL=\$\{MODEL:-(\w+)\}", text, re.M)
        model = (env or {}).get("MODEL") or (default[1] if default else "")
        try:
            recipe = get_recipe(header[0].replace("${MODEL}", model))
            profile = header[1] if header[1] in profiles() else profile
        except KeyError:
            recipe = None
    paths: dict[str, list[dict]] = {}
    expect_config: dict[str, dict] = {}
    if recipe is not None:
        spec = JobSpec(recipe=recipe.name, profile=profile, **profile_defaults(profile))
        entries = [
            {"key": sp.key, "kind": sp.kind, "what": sp.what, "expect": list(sp.expect), "hub_ok": sp.hub_ok}
            for sp in recipe.read_paths(spec)
        ]
        paths[recipe.framework] = entries
        expect_config[recipe.framework] = {k: list(v) for k, v in recipe.expected_config(spec).items()}
    expect_env = {v.name: [v.value, v.source] for v in get_profile(profile).env if not v.expand} if header else {}
    return {
        "recipe": recipe.name if recipe else None,
        "profile": profile,
        "paths": paths,
        "expect_config": expect_config,
        "profiling_requested": profiling_requested(text, recipe),
        "expect_env": expect_env,
        "uses_gpus": bool(
            sbatch_value(text, "gpus-per-node") or sbatch_value(text, "gres") or sbatch_value(text, "gpus")
        ),
        "mounts": container_mounts(text),
        # the nodes' Python must have these (the tested versions) and run there (built for the nodes' machine)
        "needs": {p: exact_version(p) or "" for p in (recipe.packages if recipe else ("torch",))},
        "login_machine": platform.machine(),
    }


def profiling_requested(text: str, recipe: Recipe | None) -> bool:
    """The script turns the profiler on itself (rendered with the recipe's ``profiling_overrides``): the user
    asked for it, so a profiler setting that differs from the recipe's "off" is no problem."""
    try:
        switches = [k for k, v in recipe.profiling_overrides().items() if v.lower() == "true"] if recipe else []
    except ValueError:  # a recipe without profiler settings
        return False
    return any(re.search(rf"--{re.escape(k)}(?![\w.-])", text) for k in switches)


def possibly_empty_arrays(text: str) -> list[str]:
    """Arrays the script expands as ``"${A[@]}"`` although they may be empty (declared ``A=()`` or filled by
    ``mapfile``): under ``set -u`` bash before 4.4 aborts there with "unbound variable"."""
    names = set(re.findall(r"\b([A-Za-z_]\w*)=\(\)", text)) | set(
        re.findall(r"mapfile\s+(?:-\w+\s+)*([A-Za-z_]\w*)", text)
    )
    return sorted(n for n in names if re.search(r'(?<!\+)"\$\{' + re.escape(n) + r'\[@\]\}"', text))


def static_problems(text: str, script: Path | None = None) -> list[str]:
    """Problems found in the script's text (and the files it names) before anything is submitted."""
    problems = []
    for name in possibly_empty_arrays(text):
        problems.append(
            f'"${{{name}[@]}}" may be an empty array: bash before 4.4 (RHEL/CentOS 7, Amazon Linux 2) '
            f"aborts with 'unbound variable' under set -u; write ${{{name}[@]+\"${{{name}[@]}}\"}}"
        )
    if re.search(r"scontrol show hostnames[^\n|]*\|\s*head\b", text):
        problems.append(
            "the head node is taken with `scontrol show hostnames | head`: under set -o pipefail "
            "scontrol dies of SIGPIPE on large allocations; use awk 'NR == 1'"
        )
    if script is not None:
        output = sbatch_value(text, "output")
        folder = Path(output).parent if output else None
        if folder is not None and not folder.is_absolute() and not (script.parent / folder).is_dir():
            problems.append(
                f"#SBATCH --output={output}: Slurm does not create {folder}/, so plain `sbatch` of this "
                "script fails with no log at all; write the log where sbatch runs (--output=%x-%j.out)"
            )
        m = re.search(r"--config\s+\\?\s*\"\$\{RECIPE_DIR\}\"/(\S+?\.yaml)", text)
        config = script.parent / m.group(1) if m else None
        if config is not None and config.is_file():
            owner = re.search(r"^# for (\S+)$", config.read_text(errors="replace"), re.M)
            if owner and owner.group(1) != script.name:
                problems.append(
                    f"{config.name} was written for {owner.group(1)}, not {script.name}: a second render "
                    "into this folder replaced this script's config; render each job into its own name"
                )
    return problems


def script_folders(text: str, env: dict[str, str], submit_dir: Path) -> dict[str, str]:
    """The script's folder variables (``RECIPE_DIR``, ``RUN_DIR``, ``MODEL_DIR``...) as bash evaluates them
    with ``env``, from the script's own "where things are" block."""
    m = re.search(r"^# --- where things are.*?\n(.*?)^export (RECIPE_DIR[^\n]*)$", text, re.M | re.S)
    if not m:
        return {}
    names = m.group(2).split()
    show = "".join(f'printf "%s=%s\\n" {n} "${{{n}:-}}"\n' for n in names)
    r = subprocess.run(
        ["bash", "-c", f"set -u\n{m.group(1)}\n{show}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "SLURM_SUBMIT_DIR": str(submit_dir)},
    )
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line) if r.returncode == 0 else {}


def container_problems(text: str, client: SlurmClient, submit_dir: Path) -> list[str]:
    """A container job on a cluster whose srun has no ``--container-image`` (pyxis), and folders the job
    uses that no ``--container-mounts`` destination covers (inside the container they do not exist)."""
    if "--container-image" not in text:
        return []
    problems = []
    r = client.run("srun", "--help", check=False)
    if "--container-image" not in r.stdout + r.stderr:
        problems.append(
            "the script runs in a container (--container-image) but this cluster's srun has no such "
            "option (the pyxis plugin is not installed): srun would fail at launch"
        )
    mounts = container_mounts(text)
    for name, value in script_folders(text, dict(client.env), submit_dir).items():
        if value.startswith("/") and not any(value == d or value.startswith(d.rstrip("/") + "/") for d in mounts):
            problems.append(
                f"{name}={value} is inside no --container-mounts destination ({', '.join(mounts) or 'none'}):"
                f" inside the container it does not exist; add {value}:{value} to the mounts"
            )
    return problems


# ------------------------------------------------------------------------------------------ run
@dataclass
class Rehearsal:
    """A submitted rehearsal: its job, folder and the script's text (see :func:`start_rehearsal`)."""

    script: Path
    text: str
    job_id: str
    folder: Path
    client: SlurmClient
    problems: list[str]


def start_rehearsal(
    script: str | os.PathLike,
    client: SlurmClient | None = None,
    time_limit: str = "00:05:00",
    folder: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> Rehearsal:
    """Submit ``script`` with its launcher replaced by the node check; return without waiting.

    ``env`` adds to the environment the job inherits (as ``export X=...`` before ``sbatch`` would).
    Raises :class:`RehearsalError` when the script cannot be rehearsed at all.
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise RehearsalError(f"{script}: no such script (render one with `cookbook render RECIPE -o FILE`)")
    text = script.read_text(errors="replace")
    if RUNTIME_LAUNCH not in text:
        raise RehearsalError(
            f"{script}: not a cookbook script (its launch runs `python3 {RUNTIME_LAUNCH}`, which takes the rehearsal "
            f"hook {HOOK}); render it again with `cookbook render`"
        )
    problems = static_problems(text, script)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(folder).resolve() if folder else script.parent / ".rehearsal" / f"{script.stem}-{stamp}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    check = out / "node-check"
    shutil.copyfile(NODE_CHECK, out / "node_check.py")
    check.write_text(render_template(CHECK_TEMPLATE, node_check=str(out / "node_check.py")))
    make_executable(check)
    base = dict(client.env) if client is not None else dict(os.environ)
    (out / "manifest.json").write_text(json.dumps(manifest(text, {**base, **(env or {})}), indent=1))
    job_env = {
        **base,
        **(env or {}),
        HOOK: str(check),
        f"{HOOK}_OUT": str(out / "reports"),
        f"{HOOK}_MANIFEST": str(out / "manifest.json"),
    }
    job_env.setdefault("RECIPE_DIR", str(script.parent))
    runner = SlurmClient(job_env, timeout=client.timeout if client else 60)
    problems += container_problems(text, runner, script.parent)
    try:
        # the script's --signal lead (960 s for a 70B stop-save) is longer than the rehearsal's time limit: Slurm
        # would send USR1 at once and end the batch step before its handler is in place; a rehearsal saves nothing
        job_id = runner.submit(
            script, f"--time={time_limit}", "--signal=B:USR1@1", f"--output={out}/rehearsal-%j.out", "--no-requeue",
            cwd=script.parent,
        )  # fmt: skip
    except SlurmUnreachable as e:
        raise RehearsalError(e.line) from e
    except SlurmError as e:
        raise RehearsalError(f"Slurm refused the script: {' '.join((e.stderr or str(e)).split())}") from e
    return Rehearsal(script, text, job_id, out, runner, problems)


def finish_rehearsal(r: Rehearsal, timeout: float = 600) -> RehearsalReport:
    """Wait for a started rehearsal and collect every node's report."""
    info = r.client.wait(r.job_id, timeout=timeout, poll=1.0)
    nodes = collect(r.folder / "reports")
    expected = int(sbatch_value(r.text, "nodes") or 1)
    problems = list(r.problems)
    missing = expected - len(nodes)
    if missing > 0 or info.state != "COMPLETED":
        log = r.folder / f"rehearsal-{r.job_id}.out"
        tail = read_output(log, tail_lines=8).strip() if log.exists() else "(no log)"
        problems.append(
            f"job {r.job_id} ended {info.state}"
            + (f"; {missing} node(s) wrote no report" if missing > 0 else "")
            + f". Log tail:\n{tail}"
        )
    return RehearsalReport(r.script, r.job_id, info.state, nodes, problems, r.folder)


def rehearse(
    script: str | os.PathLike,
    client: SlurmClient | None = None,
    timeout: float = 600,
    time_limit: str = "00:05:00",
    folder: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> RehearsalReport:
    """Submit ``script`` with its launcher replaced by the node check, wait, and collect every node's report
    (:func:`start_rehearsal` + :func:`finish_rehearsal`)."""
    return finish_rehearsal(start_rehearsal(script, client, time_limit, folder, env), timeout)


def collect(reports: Path) -> list[NodeReport]:
    """Every node's JSON report under ``reports``, in node order."""
    nodes = []
    for path in sorted(reports.glob("node-*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
        data = json.loads(path.read_text())
        problems, notes = tuple(data.get("problems", [])), tuple(data.get("notes", []))
        nodes.append(NodeReport(node=str(data.get("node")), facts=data, failures=problems, notes=notes))
    return nodes
