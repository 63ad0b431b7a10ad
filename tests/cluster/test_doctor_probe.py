"""`cookbook doctor --probe` on the real local cluster, and the HF token never leaking from our commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook import doctor
from cookbook.paths import project_root

pytestmark = pytest.mark.cluster
SECRET = "hf_LEAKTESTdoNotWrite9876543210"


def test_probe_reaches_every_node(slurm, job_dir, tiny_assets):
    nodes = [n["node"] for n in doctor.partition_nodes(slurm, "debug") if n["usable"]]
    job, reports, expected = doctor.probe_nodes(
        slurm, "debug", shared_dir=job_dir, disk_paths=[tiny_assets.llama_dir], timeout=240
    )
    assert expected == nodes and sorted(r.node for r in reports) == sorted(nodes)
    assert all(r.facts["marker_ok"] and r.facts["python_ok"] for r in reports)
    assert all(r.facts["free_bytes"][str(tiny_assets.llama_dir)] > 0 for r in reports)
    checks = {c.name: c for c in doctor.probe_checks(job, reports, expected)}
    assert checks["probe"].status == "pass" and checks["shared fs"].status == "pass"
    assert checks["stack on nodes"].status == "pass", checks["stack on nodes"]  # the venv, run on each node


def test_probe_checks_flag_silent_nodes_and_unshared_fs():
    """A node that did not answer and one that could not read the marker fail their checks."""
    from cookbook.doctor import probe_report

    r = probe_report("n1", python_ok=True)
    checks = {c.name: c for c in doctor.probe_checks("1", [r], ["n1", "n2"])}
    assert checks["probe"].status == "fail" and "n2" in checks["probe"].detail
    assert checks["shared fs"].status == "fail"


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cookbook", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_hf_token_appears_in_no_output_or_file(slurm, tiny_assets, tmp_path):
    """Doctor (with the probe job), download and data check run with a known HF_TOKEN: it is nowhere."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(project_root()),
        "HF_TOKEN": SECRET,
        "HF_HOME": str(tmp_path / "hf"),
        "COOKBOOK_OUT": str(out),
        "HF_HUB_ETAG_TIMEOUT": "3",
        "MPLBACKEND": "Agg",
    }
    results = [
        _run(
            ["doctor", "--probe", "--model-dir", str(tiny_assets.llama_dir), "--shared-dir", str(out / "doctor")],
            env,
            tmp_path,
        ),
        _run(["download", "meta-llama/Llama-3.2-1B", "--output-dir", str(out / "model")], env, tmp_path),
        _run(
            [
                "data",
                "check",
                str(tiny_assets.chat_sharegpt),
                "--style",
                "sharegpt",
                "--model-dir",
                str(tiny_assets.llama_dir),
                "--sample",
                "16",
                "--plot",
                str(out / "lengths.png"),
            ],
            env,
            tmp_path,
        ),
    ]
    assert "found (HF_TOKEN); value not shown" in results[0].stdout
    assert "probe" in results[0].stdout and results[0].returncode == 0, results[0].stdout + results[0].stderr
    assert results[1].returncode == 2 and "cannot reach" in results[1].stderr
    assert results[2].returncode == 0, results[2].stderr
    for r in results:
        assert SECRET not in r.stdout + r.stderr
    written = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert any(f.name.startswith("probe-") and f.suffix == ".out" for f in written)  # the job's log is checked too
    assert any(f.name == "probe.sbatch" for f in written) and (out / "lengths.png").exists()
    for f in written:
        assert SECRET.encode() not in f.read_bytes(), f
    # and not in any job's process arguments: the probe job's script carries no token
    assert all(SECRET not in f.read_text() for f in written if f.name == "probe.sbatch")
