"""Environment checks before the first job: Python, package versions, Slurm, every node, HF token.

:func:`run_checks` returns a list of :class:`Check` (status pass/warn/fail, detail, what to do); the
CLI prints it as a table and a notebook can show it as a DataFrame (:func:`to_frame`). The probe job
(:func:`probe_nodes`) runs one task on every node of a partition and reports what each node sees.
The HF token is only reported as present or absent.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from cookbook import versions
from cookbook.hub import token_status
from cookbook.paths import output_dir
from cookbook.slurm.client import JobTimeout, SlurmClient, SlurmError, read_output
from cookbook.templating import render_template
from cookbook_runtime.decide import NodeReport  # one report type: the gate's, the rehearsal's, the probe's
from cookbook_runtime.telemetry import NVML_PACKAGE

Status = Literal["pass", "warn", "fail"]
PYTHON_RANGE = ((3, 11), (3, 12))
UNUSABLE_NODE_STATES = ("down", "drain", "drng", "fail", "maint", "unk", "npc", "resv", "futr", "inval")


@dataclass(frozen=True)
class Check:
    """One check's result."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


# ------------------------------------------------------------------------------------------- local
def check_python(version: tuple[int, int] | None = None) -> Check:
    """Python 3.11-3.12 (TensorBoard and torchtitan bounds)."""
    v = version or sys.version_info[:2]
    text = f"{v[0]}.{v[1]} ({sys.executable})"
    if PYTHON_RANGE[0] <= tuple(v) <= PYTHON_RANGE[1]:
        return Check("python", "pass", text)
    return Check(
        "python",
        "fail",
        text,
        "create the venv with Python 3.11 or 3.12 (torchtitan needs >=3.11, "
        "TensorBoard breaks on newer), e.g. `uv venv -p 3.12` or `python3.12 -m venv .venv`",
    )


def check_packages(installed: dict[str, str | None] | None = None) -> list[Check]:
    """Installed torch / torchtune / torchao / torchtitan against the pins of ``pyproject.toml``
    (:mod:`cookbook.versions`; metadata only, no import)."""
    out = []
    for name in versions.FRAMEWORKS:
        have = installed.get(name) if installed is not None else None
        if installed is None:
            with contextlib.suppress(metadata.PackageNotFoundError):
                have = metadata.version(name)
        want, pin = str(versions.specifier(name)), versions.requirement(name)
        if have is None:
            out.append(Check(name, "fail", f"not installed (tested: {want})", f"pip install '{pin}'"))
        elif versions.accepts(name, have):
            out.append(Check(name, "pass", have))
        else:
            out.append(
                Check(
                    name,
                    "warn",
                    f"{have}, not the tested {want}",
                    f"pip install '{pin}' (install torch first so torchtune/torchao do not pull another)",
                )
            )
    return out


def check_token() -> Check:
    """HF token present (the value is never shown)."""
    st = token_status()
    if st.present:
        return Check("hf token", "pass", f"found ({st.source}); value not shown")
    return Check(
        "hf token",
        "warn",
        "not found (needed for gated models such as meta-llama/*)",
        "run `hf auth login` (its token file is what jobs on the nodes read; an exported HF_TOKEN serves this "
        "login node only); request access on the model's Hub page",
    )


def check_disk(path: str | Path, need_bytes: int | None = None) -> Check:
    """Free space where the model goes (the nearest existing parent of ``path``)."""
    p = Path(path).expanduser().resolve()
    while not p.exists():
        p = p.parent
    free = shutil.disk_usage(p).free
    detail = f"{_size(free)} free at {p}"
    if need_bytes:
        detail += f"; model needs {_size(need_bytes)}"
        if free < need_bytes:
            return Check("disk", "fail", detail, "choose another --output-dir / free space")
        if free < 3 * need_bytes:
            return Check("disk", "warn", detail, "checkpoints are about model-sized each: keep room for a few")
    return Check("disk", "pass", detail)


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def model_size(model_dir: str | Path) -> int | None:
    """Bytes of weights in ``model_dir`` (None if it has none yet)."""
    d = Path(model_dir)
    weights = [f for pat in ("*.safetensors", "*.bin", "*.pt", "*.pth") for f in d.rglob(pat)] if d.is_dir() else []
    return sum(f.stat().st_size for f in weights) or None


# ------------------------------------------------------------------------------------------- slurm
def check_slurm(client: SlurmClient, partition: str | None = None) -> list[Check]:
    """Slurm reachable, the partition exists and is up, GPUs per node (sinfo)."""
    try:
        parts = client.partitions()
    except SlurmError as e:
        return [
            Check(
                "slurm",
                "fail",
                " ".join(e.stderr.split()) if e.stderr else str(e),
                "run on the login node; export SLURM_CONF if the config is not in /etc/slurm "
                "(locally: eval $(cookbook cluster env))",
            )
        ]
    names_starred = [p["partition"] for p in parts]  # the default partition ends in "*"
    names = [n.rstrip("*") for n in names_starred]
    default = next((n.rstrip("*") for n in names_starred if n.endswith("*")), names[0] if names else None)
    part = partition or default
    out = [Check("slurm", "pass", f"partitions: {', '.join(names_starred)}")]
    if part not in names:
        return [*out, Check("partition", "fail", f"{part!r} not found", f"use one of: {', '.join(names)}")]
    nodes = partition_nodes(client, part)
    usable = [n for n in nodes if n["usable"]]
    bad = [f"{n['node']}({n['state']})" for n in nodes if not n["usable"]]
    status: Status = "pass" if usable and not bad else ("warn" if usable else "fail")
    out.append(
        Check(
            "partition",
            status,
            f"{part}: {len(usable)}/{len(nodes)} nodes usable" + (f"; not usable: {', '.join(bad)}" if bad else ""),
            "" if not bad else "ask the admins, or `scontrol show node NAME` for the reason",
        )
    )
    gres = {n["node"]: n["gpus"] for n in nodes}
    if any(gres.values()):
        status = "pass" if len(set(gres.values())) == 1 else "warn"
        out.append(
            Check(
                "gpus",
                status,
                ", ".join(f"{k}: {v}" for k, v in gres.items()),
                "" if status == "pass" else "nodes differ: set --gpus-per-node to the smallest",
            )
        )
    else:
        out.append(
            Check(
                "gpus",
                "warn",
                f"no GPU gres on {part} (CPU-only partition)",
                "fine for local-cpu runs; on a GPU cluster use a partition with gres/gpu",
            )
        )
    return out


def partition_nodes(client: SlurmClient, partition: str) -> list[dict]:
    """Nodes of ``partition``: name, state, GPUs (from gres), usable."""
    r = client.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N|%t|%G")
    seen: dict[str, dict] = {}
    for line in filter(str.strip, r.stdout.splitlines()):
        node, state, gres = line.split("|")
        seen[node] = {
            "node": node,
            "state": state,
            "gpus": _gpus(gres),
            "usable": not any(state.rstrip("*~#!%$@^-").startswith(s) for s in UNUSABLE_NODE_STATES)
            and not state.endswith("*"),
        }
    return list(seen.values())


def _gpus(gres: str) -> int:
    fields = [item.split("(")[0].split(":") for item in gres.split(",")]
    return sum(int(f[-1]) for f in fields if f[0] == "gpu" and f[-1].isdigit())


# ------------------------------------------------------------------------------------------- probe
PROBE_SBATCH = "doctor_probe.sbatch.j2"  # templates/: the job that runs the runtime's probe on every usable node


def probe_report(
    host: str,
    *,
    gpus: int = -1,
    gpu_names: str = "",
    nccl: str = "",
    efa: str = "",
    efa_devices: str = "",
    marker_ok: bool = False,
    python_ok: bool = False,
    free_bytes: dict[str, int] | None = None,
    pyenv: str = "",
    nccl_net: str = "",
) -> NodeReport:
    """What one node saw in the probe job, as the runtime's one :class:`NodeReport` (its ``facts``): ``gpus`` -1
    without nvidia-smi; ``pyenv`` the venv's answer (``cookbook_runtime.pyenv``) or its error (Exec format
    error...); ``efa`` libfabric and ``/opt/amazon/efa``, ``efa_devices`` the RDMA devices (InfiniBand or EFA)
    under ``/sys/class/infiniband``; ``nccl_net`` aws-ofi-nccl's NCCL plugin (libnccl-net*.so), where found."""
    facts = dict(gpus=gpus, gpu_names=gpu_names, nccl=nccl, efa=efa, efa_devices=efa_devices, marker_ok=marker_ok,
                 python_ok=python_ok, free_bytes=free_bytes or {}, pyenv=pyenv, nccl_net=nccl_net)  # fmt: skip
    return NodeReport(node=host, facts=facts)


def venv_answer(report: NodeReport) -> dict | None:
    """The venv's answer on the node (interpreter, machine, package versions); None where it did not run."""
    from cookbook_runtime import pyenv

    return next(iter(pyenv.read_answers(report.facts["pyenv"]).values()), None)


def probe_nodes(
    client: SlurmClient,
    partition: str,
    *,
    shared_dir: str | Path | None = None,
    disk_paths: Sequence[str | Path] = (),
    timeout: float = 180,
    extra_sbatch: Sequence[str] = (),
) -> tuple[str, list[NodeReport], list[str]]:
    """Run the probe on every usable node of ``partition``; return (job id, reports, expected nodes)."""
    nodes = [n["node"] for n in partition_nodes(client, partition) if n["usable"]]
    if not nodes:
        raise SlurmError(["sinfo"], 1, f"partition {partition} has no usable nodes")
    work = Path(shared_dir or output_dir() / "doctor") / f"probe-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    script = _write_probe_job(work, token, partition, len(nodes), disk_paths)
    job = client.submit(script, *extra_sbatch)
    try:
        info = client.wait(job, timeout=timeout)
    except JobTimeout:
        client.cancel(job)
        raise
    reports = [_read_probe_file(f, token) for f in sorted(work.glob("node-*.json"))]
    if info.state != "COMPLETED" and not reports:
        out = client.output_path(job) or work / f"probe-{job}.out"
        raise SlurmError(
            ["sbatch", str(script)],
            1,
            f"probe job {job} ended {info.state}: {read_output(out, tail_lines=5) or '(no output)'}",
        )
    return job, reports, nodes


def _write_probe_job(work: Path, token: str, partition: str, nodes: int, disk_paths: Sequence[str | Path]) -> Path:
    """Write the marker, the runtime (its :mod:`cookbook_runtime.probe` runs on each node) and the job that runs
    it on ``nodes`` nodes into ``work``; return the job."""
    from cookbook.render import runtime_files  # what a job ships; here, not at import: render is ~1 s of imports

    (work / "marker").write_text(token)
    for name, text in runtime_files().items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    site = next((p for p in sys.path if p.endswith("site-packages")), "")
    script = work / "probe.sbatch"
    script.write_text(
        render_template(
            PROBE_SBATCH,
            partition=partition,
            nodes=nodes,
            work=str(work),
            python=sys.executable,
            site=site,
            needs=(*versions.FRAMEWORKS, NVML_PACKAGE),
            disks=[str(Path(p).expanduser().resolve()) for p in disk_paths],
        )
    )
    return script


def _read_probe_file(f: Path, token: str) -> NodeReport:
    """One node's ``node-<host>.json`` (:mod:`cookbook_runtime.probe`'s facts) as its report."""
    d = json.loads(f.read_text())
    return probe_report(
        d["host"],
        gpus=int(d["gpus"]),
        gpu_names=d["gpu_names"],
        nccl=d["nccl"],
        efa=d["efa"],
        efa_devices=d["efa_devices"],
        marker_ok=d["marker"] == token,
        python_ok=bool(d["python_ok"]),
        free_bytes={path: int(n) for path, n in d["free_bytes"].items()},
        pyenv=d["pyenv"],
        nccl_net=d["nccl_net"],
    )


def stack_on_nodes(reports: Sequence[NodeReport]) -> Check:
    """The venv, run on each node: torch and the frameworks at the pinned versions, built for the node's
    machine (a venv made on an x86 login node does not run on aarch64 nodes: Exec format error)."""
    problems = []
    for r in reports:
        answer = venv_answer(r)
        if answer is None:
            problems.append(f"{r.node}: the venv does not run there ({r.facts['pyenv'] or 'no answer'})")
            continue
        for package in versions.FRAMEWORKS:
            version = answer["versions"].get(package)
            if version is None or not versions.accepts(package, version):
                have = "missing" if version is None else version
                problems.append(f"{r.node}: {package} {have}, tested {versions.tested_version(package)}")
    fix = "build the venv on a node of the cluster's architecture (`make setup` run there), on shared storage"
    if problems:
        return Check("stack on nodes", "fail", "; ".join(problems[:4]) + ("; ..." if len(problems) > 4 else ""), fix)
    return Check("stack on nodes", "pass", f"{', '.join(versions.FRAMEWORKS)} as pinned, on {len(reports)} node(s)")


def gpu_telemetry_on_nodes(reports: Sequence[NodeReport]) -> Check:
    """nvidia-ml-py in the venv, on each node: without it a job trains, but writes no GPU telemetry (clocks, power,
    XIDs, ECC) and its pre-flight gate cannot read a GPU's own faults."""
    answers = [(r.node, venv_answer(r)) for r in reports]
    missing = [host for host, a in answers if a is not None and not a["versions"].get(NVML_PACKAGE)]
    if not missing:
        return Check("gpu telemetry", "pass", f"{NVML_PACKAGE} on every node")
    return Check(
        "gpu telemetry",
        "warn",
        f"no {NVML_PACKAGE} on {', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}: jobs train without GPU "
        "telemetry, and the gate cannot read a GPU's XIDs or ECC errors",
        f"pip install {versions.requirement(NVML_PACKAGE)} into the venv",
    )


def probe_checks(
    job: str,
    reports: list[NodeReport],
    expected: list[str],
    *,
    need_bytes: int | None = None,
    want_gpus: bool | None = None,
) -> list[Check]:
    """Turn the probe's node reports into checks."""
    return [
        *_reach_checks(job, reports, expected),
        *_gpu_checks(reports, want_gpus),
        *_fabric_checks(reports),
        *_disk_checks(reports, need_bytes),
    ]


def _reach_checks(job: str, reports: list[NodeReport], expected: list[str]) -> list[Check]:
    """Which nodes answered, saw the shared filesystem's marker and ran the venv with the pinned stack."""
    got = {r.node for r in reports}
    missing = [n for n in expected if n not in got]
    no_fs = [r.node for r in reports if not r.facts["marker_ok"]]
    no_py = [r.node for r in reports if not r.facts["python_ok"]]
    return [
        Check(
            "probe",
            "fail" if missing else "pass",
            f"job {job}: {len(got)}/{len(expected)} nodes answered"
            + (f"; silent: {', '.join(missing)}" if missing else ""),
            "check those nodes' slurmd (`scontrol show node NAME`)" if missing else "",
        ),
        Check(
            "shared fs",
            "fail" if no_fs else "pass",
            f"not visible on {', '.join(no_fs)}" if no_fs else "marker written here was read on every node",
            "put the checkout, venv, model and outputs on a filesystem mounted on all nodes" if no_fs else "",
        ),
        Check(
            "venv on nodes",
            "fail" if no_py else "pass",
            f"{sys.executable} missing on {', '.join(no_py)}" if no_py else f"{sys.executable} on every node",
            "create the venv on the shared filesystem" if no_py else "",
        ),
        stack_on_nodes([r for r in reports if r.facts["python_ok"]]),
    ]


def _gpu_checks(reports: list[NodeReport], want_gpus: bool | None) -> list[Check]:
    """GPU telemetry, the GPUs each node sees and its libnccl; one warning where no node has GPUs."""
    gpus = {r.node: r.facts["gpus"] for r in reports}
    has_gpus = any(g > 0 for g in gpus.values())
    if has_gpus or want_gpus:
        uneven = len(set(gpus.values())) > 1
        no_nccl = [r.node for r in reports if not r.facts["nccl"]]
        return [
            gpu_telemetry_on_nodes([r for r in reports if r.facts["python_ok"]]),
            Check(
                "gpus visible",
                "warn" if uneven or not has_gpus else "pass",
                ", ".join(f"{h}: {g if g >= 0 else 'no nvidia-smi'}" for h, g in gpus.items()),
                "nodes differ: check drivers / CUDA_VISIBLE_DEVICES" if uneven else "",
            ),
            Check(
                "nccl",
                "warn" if no_nccl else "pass",
                f"no libnccl on {', '.join(no_nccl)} (torch wheels bundle their own)"
                if no_nccl
                else ", ".join(sorted({r.facts["nccl"] for r in reports})),
            ),
        ]
    return [
        Check(
            "gpus visible",
            "warn",
            "no GPUs on any node (nvidia-smi absent or none listed)",
            "expected on the local CPU cluster; on a GPU cluster check the drivers",
        )
    ]


def _fabric_checks(reports: list[NodeReport]) -> list[Check]:
    """EFA's NCCL plugin where EFA is, and whether any node has libfabric, EFA or InfiniBand."""
    out: list[Check] = []
    efa = [r.node for r in reports if r.facts["efa"] or r.facts["efa_devices"]]
    no_plugin = [r.node for r in reports if "/opt/amazon/efa" in r.facts["efa"] and not r.facts["nccl_net"]]
    if no_plugin:
        out.append(
            Check(
                "aws-ofi-nccl",
                "fail",
                f"EFA on {', '.join(no_plugin)} but no NCCL plugin (libnccl-net*.so in the ld cache or "
                "/opt/amazon/ofi-nccl/lib): NCCL would fall back to TCP sockets",
                "install aws-ofi-nccl (the DLAMI and ParallelCluster AMIs have it) or add its lib folder to "
                "LD_LIBRARY_PATH in the profile",
            )
        )
    out.append(
        Check(
            "efa/infiniband",
            "pass" if efa else "warn",
            f"libfabric/EFA/IB on {', '.join(efa)}" if efa else "no libfabric, /opt/amazon/efa or /dev/infiniband",
            "" if efa else "multi-node NCCL will use TCP sockets: slow; fine on one node / locally",
        )
    )
    return out


def _disk_checks(reports: list[NodeReport], need_bytes: int | None) -> list[Check]:
    """The free space of each path asked about on each node, against the model's size."""
    out: list[Check] = []
    for r in reports:
        for path, free in r.facts["free_bytes"].items():
            status: Status = "fail" if need_bytes and free < need_bytes else "pass"
            out.append(
                Check(
                    f"disk {r.node}",
                    status,
                    f"{_size(free)} free at {path}" + (f" (model {_size(need_bytes)})" if need_bytes else ""),
                    "choose a bigger filesystem" if status == "fail" else "",
                )
            )
    return out


# ------------------------------------------------------------------------------------------- all
def run_checks(
    partition: str | None = None,
    *,
    probe: bool = False,
    model_dir: str | Path | None = None,
    client: SlurmClient | None = None,
    shared_dir: str | Path | None = None,
    probe_timeout: float = 180,
) -> list[Check]:
    """Every check in order; ``probe=True`` also submits the probe job to every node of the partition."""
    checks = [check_python(), *check_packages(), check_token()]
    need = model_size(model_dir) if model_dir else None
    if model_dir:
        checks.append(check_disk(model_dir, need))
    client = client or SlurmClient()
    slurm = check_slurm(client, partition)
    checks += slurm
    part = next((c.detail.split(":")[0] for c in slurm if c.name == "partition"), None)
    if probe:
        if not all(c.ok for c in slurm) or part is None:
            checks.append(Check("probe", "fail", "skipped: Slurm checks failed", "fix those first"))
        else:
            try:
                job, reports, expected = probe_nodes(
                    client,
                    part,
                    shared_dir=shared_dir,
                    disk_paths=[model_dir] if model_dir else [],
                    timeout=probe_timeout,
                )
                checks += probe_checks(job, reports, expected, need_bytes=need)
            except JobTimeout as e:
                checks.append(
                    Check(
                        "probe",
                        "fail",
                        f"{e} (cancelled)",
                        "the partition is busy: retry later, or pick an idle partition with --partition",
                    )
                )
            except SlurmError as e:
                checks.append(Check("probe", "fail", str(e), "see the message; check the partition's limits"))
    return checks


def to_frame(checks: Sequence[Check]):
    """The checks as a pandas DataFrame (for notebooks)."""
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in checks])


def render(checks: Sequence[Check], width: int = 60) -> str:
    """A fixed-width table: check, status, detail, what to do."""
    name_w = max(len(c.name) for c in checks)
    lines = [f"{'check':<{name_w}}  status  detail", "-" * (name_w + 8 + width)]
    for c in checks:
        detail = textwrap.wrap(c.detail, width) or [""]
        lines.append(f"{c.name:<{name_w}}  {c.status.upper():<6}  {detail[0]}")
        lines += [f"{'':<{name_w}}  {'':<6}  {d}" for d in detail[1:]]
        if c.fix:
            lines += [f"{'':<{name_w}}  {'':<6}  -> {d}" for d in textwrap.wrap(c.fix, width - 3)]
    n = Counter(c.status for c in checks)
    return "\n".join([*lines, f"\n{n['pass']} pass, {n['warn']} warn, {n['fail']} fail"])
