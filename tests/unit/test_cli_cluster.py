"""`cookbook cluster` as a user meets it: the env line, and a clear refusal without root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from cookbook.cli import main


def test_env_prints_the_export_line(capsys):
    assert main(["cluster", "env", "--name", "demo-x"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("export SLURM_CONF=") and out.endswith(".cluster/demo-x/etc/slurm.conf")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to nobody")
def test_up_without_root_says_what_is_needed_and_that_a_real_cluster_needs_none_of_it(tmp_path):
    env = {**os.environ, "COOKBOOK_HOME": str(tmp_path)}
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "cookbook", "cluster", "up", "--name", "nobody"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert all(s in r.stderr for s in ("needs root", "slurmctld", "real Slurm cluster", "sudo make cluster-up"))
    assert "Traceback" not in r.stderr
