"""Issue #41 item 6's wiring on real Slurm: a 2-node FSDP start (one rank a node: the unit test
``test_runtime_files.py`` counts 4 ranks a node) leaves a few files a node in RUN_DIR; each node's ranks' output is
one file (copied from the node's $TMPDIR when its ranks end), no torchrun file a rank, no stack file without a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_job import fsdp_spec

from cookbook.render import write_job
from cookbook.slurm.client import read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_two_node_start_writes_files_per_node_not_per_rank(slurm, tiny_assets, job_dir: Path):
    spec = fsdp_spec(job_dir, tiny_assets, "fsdp-files-test", 4)
    script = write_job(spec, job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = slurm.submit(script, cwd=job_dir)
    info = slurm.wait(job, timeout=400)
    log = read_output(job_dir / "logs" / f"fsdp-files-test-{job}.out")
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
    run = job_dir / "run"
    written = sorted(
        p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and "checkpoints" not in p.parts
    )
    nodes = 2
    # runs.tsv, gate-passes.tsv, complete; per node: its gate probe and report (one rank a node here), CSV, output
    assert len(written) <= 4 * nodes + 3, written
    assert not [f for f in written if "stack_rank" in f or "/attempt_" in f], written
    outputs = sorted((run / "torchrun-logs").glob("*/*.log"))
    assert len(outputs) == nodes, written
    assert all("==> " in p.read_text() for p in outputs), written
