"""``python3 -m cookbook_runtime.pyenv PACKAGE==VERSION ...``: what this node's Python has, as one line.

The batch step runs it on every node before the gate (``srun``, inside the job's container if it has one): the
interpreter, its architecture and the installed versions of torch and the framework, read from the package
metadata (nothing is imported: it answers where torch is missing or broken). The verdict is
:func:`cookbook_runtime.decide.environment_verdict`. Standard library only.
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
    answers: dict[str, dict] = {}
    for line in text.splitlines():
        _, tag, rest = line.partition(TAG + " ")
        if tag:
            try:
                answer = json.loads(rest)
            except ValueError:
                continue
            answers[str(answer.get("node"))] = answer
    return answers


def main(argv: Sequence[str] | None = None) -> int:
    needs = [word.split("==")[0] for word in (sys.argv[1:] if argv is None else argv)]
    print(f"{TAG} {json.dumps(probe(needs))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
