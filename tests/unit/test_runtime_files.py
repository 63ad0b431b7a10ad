"""Issue #41 item 6: the job runtime is light on the shared filesystem. A start writes a few files a node, none a
rank (the real batch step, launcher, torchrun and ranks of a 2-node x 4-rank job against a fake Slurm); the hang
watch asks the shared folder about ``HANG`` once a node; the hang verdict reads every rank's ``pg_status`` and the
flight-recorder entries of one rank only."""

from __future__ import annotations

import json
import os
import pickle
import textwrap
from pathlib import Path

import pytest
from batch_step import FakeSlurm

from cookbook_runtime import files, hang, nodecheck

TRAIN = """
import os
from cookbook_runtime import hang
for step in range(1, 4):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    hang.step(step)
"""


def tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_start_writes_files_per_node_not_per_rank(tmp_path: Path):
    """2 nodes x 4 ranks, the gate included (its real checks and pair rounds, gloo): runs.tsv and the gate's
    passes, and per node its telemetry, its ranks' output, the gate's probe and its one report; no stack file
    without a hang (cf74e12 wrote 29 files without the gate: a stack file and torchrun's stdout/stderr per rank;
    37f8b60's gate wrote one report per rank, twice)."""
    slurm = FakeSlurm(tmp_path)
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(TRAIN))
    before = tree(slurm.run_dir) if slurm.run_dir.exists() else set()
    (node_tmp := tmp_path / "node-tmp").mkdir()  # the nodes' own disk (every fake node is this machine)
    argv = ["--gate", "--nproc-per-node=4", "--gate-allreduce-mb=1", f"--port={29300 + os.getpid() % 300}", "--",
            "torchrun", str(train)]  # fmt: skip
    ran = slurm.run_step(argv, FAKE_SRUN="nodes", FAKE_GATE="real", OMP_NUM_THREADS="1", TMPDIR=str(node_tmp))
    assert ran.status == 0 and "pre-flight ok on n2" in ran.out, ran.out
    written = tree(slurm.run_dir) - before
    nodes, ranks = 2, 8
    assert len(written) <= 4 * nodes + 2 < 2 + 3 * nodes + ranks, sorted(written)
    assert not any("stack_rank" in f or "nccl_trace" in f for f in written), sorted(written)
    gate = files.gate_dir(slurm.run_dir, "41", 0)
    for node in ("n1", "n2"):  # local rank 0 gathered its 3 peers' reports, each with its pair's figure
        reports = json.loads(nodecheck.report_path(gate, node).read_text())["ranks"]
        assert [r["local_rank"] for r in reports] == [0, 1, 2, 3], reports
        assert all(p["gbps"] for r in reports for p in r["measures"]["pairs"]), reports
    assert not list(node_tmp.glob("cookbook-gate-*"))  # the ranks' hand-over on the node's disk: removed
    logs = files.rank_logs_dir(slurm.run_dir, "41", 0)
    for node, first in (("n1", 0), ("n2", 4)):  # every rank's output is kept, in its node's one file
        text = (logs / f"{node}.log").read_text()
        assert all(f"rank {r} step 3" in text for r in range(first, first + 4)), text
    assert not list(files.hang_dir(slurm.run_dir, "41", 0).iterdir())


@pytest.fixture
def quiet_watch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A hang watch of one rank (``RANK``, ``LOCAL_RANK``) on a folder, its thread asleep for the test."""
    monkeypatch.setenv("COOKBOOK_HANG_POLL_S", "3600")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node-local"))
    (tmp_path / "node-local").mkdir()

    def make(folder: Path, rank: int, local_rank: int) -> hang.HangWatch:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setattr(hang.tempfile, "tempdir", None)  # read TMPDIR again
        return hang.HangWatch(str(folder))

    return make


def test_one_rank_a_node_looks_for_hang_on_the_shared_folder(tmp_path: Path, quiet_watch):
    shared = tmp_path / "hang"
    watches = [quiet_watch(shared, rank, rank % 4) for rank in range(4)]  # one node's 4 ranks
    assert not shared.exists()  # nothing written at the start: no stack file, not even the folder
    watches[0].mark.touch()
    os.utime(watches[0].mark, (0, 0))  # an earlier run's mark on this node
    assert not watches[1].hung()
    shared.mkdir()
    (shared / hang.TRIGGER).write_text("{}")
    assert not watches[1].hung()  # a local rank > 0 never asks the shared folder
    assert watches[0].hung()  # local rank 0 does, and tells its node
    assert all(w.hung() for w in watches[1:])
    assert sorted(p.name for p in shared.iterdir()) == [hang.TRIGGER]


def _dump(folder: Path, rank: int, enqueued: int, host: str, readable: bool) -> None:
    status = {"0": {"last_enqueued_collective": enqueued, "last_started_collective": -1,
                    "last_completed_collective": 12}}  # fmt: skip
    entries = [{"pg_id": 0, "collective_seq_id": s, "profiling_name": "nccl:all_reduce", "is_p2p": False}
               for s in range(1, enqueued + 1)]  # fmt: skip
    trace = {"pg_status": status, "entries": entries}
    (folder / f"{hang.TRACE_PREFIX}{rank}").write_bytes(pickle.dumps(trace) if readable else b"not a pickle")
    meta = {"rank": rank, "world_size": 3, "host": host, "step": 4, "pg_status": status}
    (folder / f"rank_{rank}.json").write_text(json.dumps(meta))


def test_the_verdict_reads_pg_status_first_and_one_ranks_entries(tmp_path: Path):
    """Only waiting rank 0's recorder is readable: the verdict still names rank 1 and the collective (cf74e12
    unpickled every rank's whole recorder and, without ranks 1 and 2's, named them both)."""
    _dump(tmp_path, 0, 13, "n1", readable=True)
    _dump(tmp_path, 1, 12, "n2", readable=False)  # never entered #13
    _dump(tmp_path, 2, 13, "n3", readable=False)
    found = hang.culprit(tmp_path)
    assert (found["ranks"], found["hosts"], found["seq"], found["op"], found["waiting"]) == (
        [1], ["n2"], 13, "nccl:all_reduce", [0, 2]
    )  # fmt: skip
