"""``python3 -m cookbook_runtime.pyenv PACKAGE ...``: what this node's Python has, as one line.

The batch step runs it on every node before the gate (``srun``, inside the job's container if any): the
interpreter, its machine and the installed versions of torch and the framework, read from the package metadata
(nothing imported: it answers where torch is missing or broken). The verdict: ``decide.environment_verdict``.
"""

from __future__ import annotations

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
    return {"node": node, "python": sys.executable, "machine": platform.machine(), "versions": versions}


def read_answers(text: str) -> dict[str, dict]:
    """Every node's answer in the output of the srun step (``0: cookbook-pyenv {...}`` lines)."""
    answers = [json.loads(line.partition(TAG + " ")[2]) for line in text.splitlines() if TAG + " {" in line]
    return {str(a.get("node")): a for a in answers}


if __name__ == "__main__":
    print(f"{TAG} {json.dumps(probe(sys.argv[1:]))}", flush=True)
