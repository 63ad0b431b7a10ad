"""What a node has, read one way for ``cookbook doctor``'s probe job, the rehearsal and the gate (stdlib only).

The fact readers (GPUs by ``nvidia-smi -L``, RDMA and EFA devices, libnccl and libfabric, free space, the job
Python's answer) are the ones :mod:`cookbook_runtime.rehearsal` and :mod:`cookbook_runtime.nodecheck` use;
``python3 -m cookbook_runtime.probe --out DIR ...`` is the doctor's probe: one task per node, each writes
``DIR/node-<node>.json`` (presence checks only: no secret, no value of the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RDMA_SYSFS = "/sys/class/infiniband"  # InfiniBand HCAs and EFA devices alike
EFA_PREFIXES = ("efa", "rdmap")  # an EFA device's name (rdmapXsY on EC2), else its driver says efa


def gpu_names() -> list[str] | None:
    """The ``GPU N: ...`` lines of ``nvidia-smi -L``; None without nvidia-smi or when it fails."""
    if not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return [ln for ln in r.stdout.splitlines() if ln.startswith("GPU ")] if r.returncode == 0 else None


def rdma_devices(root: str | os.PathLike[str] = RDMA_SYSFS) -> list[str]:
    """The RDMA devices (InfiniBand HCAs, EFA) under ``root``, sorted."""
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def efa_devices(root: str | os.PathLike[str] = RDMA_SYSFS) -> list[str]:
    """The EFA devices under ``root``: named so, or bound to the ``efa`` driver. The one EFA test of the
    gate (``nodecheck``), the rehearsal and the doctor's probe."""

    def driver(name: str) -> str:
        return os.path.basename(os.path.realpath(os.path.join(root, name, "device", "driver")))

    return [d for d in rdma_devices(root) if d.startswith(EFA_PREFIXES) or driver(d) == "efa"]


def ld_cache() -> str:
    """``ldconfig -p``'s listing of the shared libraries the loader knows ("" where there is no ldconfig)."""
    return subprocess.run(["sh", "-c", "ldconfig -p 2>/dev/null"], capture_output=True, text=True).stdout


def library(prefix: str, cache: str, folders: Sequence[str] = ()) -> str:
    """The first ``PREFIX*`` library in the ld ``cache``, else in ``folders``; "" where none is."""
    for line in cache.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name.startswith(prefix):
            return name
    found = sorted(n for d in folders if os.path.isdir(d) for n in os.listdir(d) if n.startswith(prefix))
    return found[0] if found else ""


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem of ``path`` (its nearest existing folder)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def ask_python(interp: str, packages: Sequence[str], timeout: float = 120) -> tuple[dict[str, Any] | None, str]:
    """``interp -m cookbook_runtime.pyenv PACKAGES``: (its answer, "") or (None, why it gave none: the last line of
    its error, e.g. ``Exec format error`` for a venv built for another machine)."""
    from .pyenv import read_answers

    try:
        r = subprocess.run([interp, "-m", "cookbook_runtime.pyenv", *packages], capture_output=True, text=True,
                           timeout=timeout)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    answer = next(iter(read_answers(r.stdout).values()), None)
    why = (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]
    return answer, "" if answer is not None else why


def node_facts(args: argparse.Namespace) -> dict[str, Any]:
    """The doctor's facts of this node: GPUs, libnccl, fabric, the shared folder's marker, the venv, free space."""
    from .nodecheck import nccl_net_plugin
    from .pyenv import TAG
    from .telemetry import node_name

    cache, names = ld_cache(), gpu_names()
    nccl_dir = os.path.join(args.site, "nvidia", "nccl", "lib") if args.site else ""
    fabric = library("libfabric.so", cache) + (" /opt/amazon/efa" if os.path.isdir("/opt/amazon/efa") else "")
    answer, why = ask_python(args.python, args.needs) if os.access(args.python, os.X_OK) else (None, "")
    try:
        marker = Path(args.marker).read_text()
    except OSError:
        marker = ""
    return {
        "host": node_name(),
        "gpus": -1 if names is None else len(names),
        "gpu_names": ";".join(names or []),
        "nccl": library("libnccl.so", cache, [nccl_dir] if nccl_dir else []),
        "efa": fabric.strip(),
        "efa_devices": " ".join(rdma_devices()),
        "marker": marker,
        "python_ok": os.access(args.python, os.X_OK),
        "pyenv": f"{TAG} {json.dumps(answer)}" if answer is not None else why,
        "nccl_net": os.path.basename(nccl_net_plugin() or ""),
        "free_bytes": {d: free_bytes(d) for d in args.disk},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m cookbook_runtime.probe", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the probe's folder (shared): node-<node>.json goes there")
    p.add_argument("--marker", required=True, help="a file the login node wrote: read here, the folder is shared")
    p.add_argument("--python", required=True, help="the venv's interpreter, asked for its packages")
    p.add_argument("--site", default="", help="its site-packages (torch wheels' own libnccl)")
    p.add_argument("--needs", nargs="*", default=[], help="the packages whose versions it reports")
    p.add_argument("--disk", action="append", default=[], help="a path whose free space is reported (repeatable)")
    return p


def main(argv: Sequence[str]) -> int:
    """Write this node's facts to ``OUT/node-<node>.json``; 0."""
    args = build_parser().parse_args(argv)
    facts = node_facts(args)
    out = Path(args.out)
    tmp = out / f".node-{facts['host']}.{os.getpid()}"
    tmp.write_text(json.dumps(facts, indent=1))
    os.replace(tmp, out / f"node-{facts['host']}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
