"""Every script in slurm-recipes/ parses under bash and is accepted by `sbatch --test-only` on the local cluster.

The local cluster has no GPUs and 8 CPUs per node, so GPU scripts are checked with command-line
--gpus-per-node=0 (command-line options override #SBATCH lines); everything else is the script's own.
"""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "slurm-recipes").glob("*/*.sbatch"))


@pytest.mark.cluster
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_n_and_sbatch_test_only(script, slurm):
    subprocess.run(["bash", "-n", str(script)], check=True)
    gpu = ["--gpus-per-node=0"] if "--gpus-per-node=" in script.read_text() else []
    message = slurm.test_only(script, *gpu)
    assert "to start at" in message, message
