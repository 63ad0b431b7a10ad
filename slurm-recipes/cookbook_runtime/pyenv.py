"""``python3 -m cookbook_runtime.pyenv PACKAGE ...``: what this node's Python has, as one line.

The batch step runs it on every node before the gate (``srun``, inside the job's container if any): the
interpreter, its machine and the installed versions of torch and the framework, read from the package metadata
(nothing imported: it answers where torch is missing or broken), and whether torch's C extension loads here (its
ELF machine, then the dynamic loader: an x86 venv on aarch64 nodes, a CUDA or C library the node lacks). The
verdict: ``decide.environment_verdict``.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.machinery
import json
import os
import platform
import socket
import sys
from collections.abc import Sequence
from importlib import metadata

TAG = "cookbook-pyenv"  # the answer's line starts so (after srun's --label)


def probe(packages: Sequence[str]) -> dict[str, object]:
    """This node's name, interpreter, machine and each package's installed version (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    broken = {"torch": problem} if versions.get("torch") and (problem := extension_problem("torch")) else {}
    return {"node": node, "python": sys.executable, "machine": platform.machine(), "versions": versions,
            "broken": broken}  # fmt: skip


ELF_MACHINES = {3: "i386", 62: "x86_64", 183: "aarch64", 21: "ppc64le", 243: "riscv64"}  # e_machine


def extension_problem(package: str, search: Sequence[str] | None = None) -> str:
    """Why ``package``'s C extension (``PACKAGE/_C*.so``) would not import on this node, "" when it loads: built
    for another machine (its ELF header), or the dynamic loader's own error (``ctypes``: the import's first step,
    without running the package)."""
    spec = importlib.machinery.PathFinder.find_spec(package, search)
    folders = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(glob.glob(os.path.join(folders[0], "_C*.so"))) if folders else []
    if not found:
        return ""
    with open(found[0], "rb") as f:
        header = f.read(20)
    built = ELF_MACHINES.get(int.from_bytes(header[18:20], "little"), "") if header[:4] == b"\x7fELF" else ""
    if built and built != platform.machine():
        return f"its C extension is built for {built}, this node is {platform.machine()}"
    try:
        ctypes.CDLL(found[0])
    except OSError as e:
        return f"its C extension does not load: {e}"
    return ""


def read_answers(text: str) -> dict[str, dict]:
    """Every node's answer in the output of the srun step (``0: cookbook-pyenv {...}`` lines)."""
    answers = [json.loads(line.partition(TAG + " ")[2]) for line in text.splitlines() if TAG + " {" in line]
    return {str(a.get("node")): a for a in answers}


if __name__ == "__main__":
    print(f"{TAG} {json.dumps(probe(sys.argv[1:]))}", flush=True)
