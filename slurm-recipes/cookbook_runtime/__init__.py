"""The job runtime: what a cookbook job does on the nodes, and nothing else.

Held once, in ``slurm-recipes/cookbook_runtime/`` (a rendered job gets a copy in its folder); the sbatch script
puts the folder holding it on ``PYTHONPATH`` (``RUNTIME_DIR``) and ends with one line,
``exec python3 -m cookbook_runtime.run SWITCHES -- torchrun|tune run ARGS``. It never imports the ``cookbook``
package (which imports it: the GPU table, the file and log-line names, the decisions).

The core, standard library only (the batch step on the first node):

- ``run``: the batch step: NODE_FAIL, rendezvous, pre-flight, resume, launch, stop relay, hang check, requeue
- ``decide``: its decisions as pure functions (unit-tested at 1, 16 and 1,000 nodes)
- ``slurm``: what it asks Slurm (scontrol, sinfo, squeue, scancel; never sbatch), answering empty when Slurm does not
- ``resume``: the newest complete checkpoint per framework, as launch arguments
- ``files``: the names of the files and log lines a job writes
- ``pyenv``: what a node's Python has (torch, the framework), from package metadata

The optional layers, with torch, in the processes the batch step starts:

- ``launch``: one node's launcher (torchrun, ``tune run``), shielded from USR1/TERM
- ``rank``: the ranks' side of the stop protocol: agree at a step boundary, save, exit 0
- ``hang``: the ranks' hang watch and the verdict on who hung (the verdict is stdlib)
- ``nodecheck``: the gate's checks on every node, and their verdict
- ``gpus``: GPU kinds and their peak FLOP/s
- ``telemetry``: each node's GPU (NVML) and NIC samples beside the launcher, and the gate's GPU health
- ``titan_import``: torchtitan imported where triton is not installed (an inert stand-in while its kernels load)

Checks run beside a job, standard library only, on every node:

- ``probe``: what a node has (GPUs, RDMA/EFA devices, libraries, free space), read one way for the gate, the
  rehearsal and ``cookbook doctor``'s probe job (``python3 -m cookbook_runtime.probe``)
- ``rehearsal``: ``cookbook rehearse``'s check on every node, in the launcher's place
"""

import sys as _sys

if _sys.version_info < (3, 9):  # noqa: UP036  (the nodes' python3 is the first thing a job runs: say so, in one line)
    _sys.exit(
        f"cookbook: {_sys.executable} is Python {_sys.version.split()[0]}; the job runtime needs Python 3.9 or newer "
        "(the pinned stack: 3.11): set VENV to an environment built with `make setup` (VENV=/shared/env sbatch ...)"
    )
