"""The job runtime: what a cookbook job does on the nodes, and nothing else.

Held once, in ``slurm-recipes/cookbook_runtime/`` (a rendered job gets a copy in its folder); the sbatch script
puts the folder holding it on ``PYTHONPATH`` (``RUNTIME_DIR``). It needs Python's standard library, and torch
only on the ranks' side; it never imports the ``cookbook`` package (which imports it: the GPU table, the file
and log-line names, the decisions).

=============  =======================================================================================
``decide``     the batch step's decisions as pure functions (unit-tested at 1, 16 and 1,000 nodes)
``nodecheck``  the gate's checks on every node (torch) and its verdict for the batch shell (``summarize``)
``rank``       the ranks' side of the stop protocol: agree at a step boundary, save, exit 0 (torch)
``hang``       the ranks' hang watch and the verdict on who hung (torch in the ranks; the verdict is stdlib)
``files``      the names of the files and log lines a job writes
``gpus``       GPU kinds and their peak FLOP/s
=============  =======================================================================================

The batch step itself is still the script's bash (``cookbook/templates/job.sbatch.j2``); its Python form
(``run``, ``launch``, ``resume``, ``slurm``) is the next step.
"""
