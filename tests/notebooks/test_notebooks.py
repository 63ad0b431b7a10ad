"""Set-up, dataset and torchtune notebooks, executed top to bottom by papermill on the real local cluster.

A failing cell fails the test; the executed notebooks stay under out/test-notebooks/. The checks are in
notebook_checks.py; the notebooks are split over two files so both pytest-xdist workers run notebooks.
"""

from __future__ import annotations

import pytest
from notebook_checks import notebooks_for, run_and_check

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.parametrize("name", notebooks_for(("00_", "01_", "02_", "03_")))
def test_notebook_runs_on_local_cluster(name, slurm, tiny_assets, kernel_dirs, artifacts, tmp_path, known_hf_token):
    run_and_check(name, tiny_assets, artifacts, tmp_path, known_hf_token)
