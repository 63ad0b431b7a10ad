"""The job runtime: what a cookbook job does on the nodes, and nothing else.

Shipped once, in ``slurm-recipes/cookbook_runtime/`` (a rendered job gets a copy in its folder); the sbatch
script puts the folder holding it on ``PYTHONPATH`` and ends with ``exec python3 -m cookbook_runtime.run ...``.
It needs Python's standard library in the batch step, and torch only in the ranks' side; it never imports
the ``cookbook`` package (which imports it: the GPU table, the file names, the decisions).

=============  =======================================================================================
``run``        the batch step: rendezvous, gate, resume, one launcher per node, signals, hang check, retries
``decide``     every decision of the batch step, as pure functions (unit-tested at 1, 16 and 1,000 nodes)
``slurm``      what the batch step asks Slurm (scontrol, sinfo, sbatch)
``resume``     the newest complete checkpoint of a run folder, per framework
``launch``     one node's launcher (torchrun, tune run), shielded from USR1/TERM
``nodecheck``  the gate's checks on every node (torch)
``rank``       the ranks' side of the stop protocol: agree at a step boundary, save, exit 0 (torch)
``hang``       the ranks' hang watch and the verdict on who hung (torch in the ranks; the verdict is stdlib)
``files``      the names of every file and log line the job writes
``gpus``       GPU kinds and their peak FLOP/s
=============  =======================================================================================
"""
