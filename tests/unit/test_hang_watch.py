"""Hang forensics without Slurm: the culprit analysis on flight-recorder dumps shaped as torch 2.13 writes them,
secret masking with a known value, `cookbook diagnose`'s one-line refusal, and (slow) a real 2-process gloo job
whose collective times out: the waiting rank's exception makes every rank dump, and the stalled rank is named."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cookbook.analysis.hang import hang_report
from cookbook_runtime import hang

KNOWN = "hf_unitKnownSecretValue77"


def _entry(seq: int, op: str = "gloo:all_reduce", state: str = "completed") -> dict:
    return {
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "profiling_name": op,
        "state": state,
        "is_p2p": False,
        "frames": [{"name": "all_reduce", "filename": "x.py", "line": 1}],
    }


def _dump(folder: Path, rank: int, enqueued: int, completed: int, step: int, host: str) -> None:
    trace = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": enqueued,
                "last_started_collective": -1,
                "last_completed_collective": completed,
            }
        },  # fmt: skip
        "entries": [_entry(s, state="scheduled" if s > completed else "completed") for s in range(1, enqueued + 1)],
    }
    (folder / f"{hang.TRACE_PREFIX}{rank}").write_bytes(pickle.dumps(hang._name_groups(trace)))
    meta = {"rank": rank, "world_size": 3, "host": host, "step": step}
    (folder / f"rank_{rank}.json").write_text(json.dumps(meta))
    (folder / f"stack_rank_{rank}.txt").write_text(
        f'Thread 0x1 (most recent call first):\n  File "train.py", line {rank} in stall_{rank}\n'
    )


def test_culprit_is_the_member_that_never_entered_the_collective_the_others_wait_in(tmp_path: Path):
    run = tmp_path / "run"
    folder = run / ".cookbook" / "hang" / "7-0"
    folder.mkdir(parents=True)
    (folder / hang.TRIGGER).write_text(json.dumps({"rank": 0, "reason": "no step for 40 s"}))
    _dump(folder, 0, enqueued=13, completed=12, step=4, host="n1")
    _dump(folder, 1, enqueued=12, completed=12, step=4, host="n2")  # never entered #13
    _dump(folder, 2, enqueued=13, completed=12, step=4, host="n3")
    found = hang.culprit(folder)
    assert (found["ranks"], found["hosts"], found["seq"], found["op"], found["waiting"]) == (
        [1],
        ["n2"],
        13,
        "gloo:all_reduce",
        [0, 2],
    )
    assert hang.describe(found) == (
        "hang: rank 1 on n2 never entered collective #13 (gloo:all_reduce, process group 0) that rank(s) 0,2 wait in"
    )
    # the group named as its entries name it, so torch's fr_trace can match them
    assert set(pickle.loads((folder / f"{hang.TRACE_PREFIX}0").read_bytes())["pg_config"]) == {"0"}
    report = hang_report(run)
    assert report[0].startswith("hang: rank 1 on n2 never entered collective #13")
    assert "in stall_1" in "\n".join(report) and "in stall_0" not in "\n".join(report)
    # the job script's question: NODES<TAB>what
    out = subprocess.run(
        [sys.executable, "-m", "cookbook_runtime.hang", "culprit", str(folder)], capture_output=True, text=True
    )
    assert out.stdout.split("\t")[0] == "n2"

    # a rank that left no dump at all is the one named
    (folder / f"{hang.TRACE_PREFIX}1").unlink()
    (folder / "rank_1.json").unlink()
    assert hang.culprit(folder)["ranks"] == [1]
    assert hang_report(tmp_path / "elsewhere") == []


def test_known_secret_is_masked_in_stacks_and_dumps(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", KNOWN)
    monkeypatch.setenv("WANDB_API_KEY", KNOWN + "w")
    text = f'  File "/data/{KNOWN}/train.py", line 3 in f {KNOWN}w'
    masked = hang.mask(text)
    assert KNOWN not in masked and masked.count("***") == 2
    trace = {"entries": [{"frames": [{"filename": f"/x/{KNOWN}.py"}]}], "pg_config": {KNOWN: {"name": KNOWN}}}
    assert KNOWN not in repr(hang.mask(trace))


def test_diagnose_refuses_an_unknown_target_in_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "cookbook", "diagnose", "/nonexistent/run"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "no such log" in out.stderr


SCRIPT = """
import datetime, os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {module_dir!r})
from cookbook_runtime import hang as cookbook_hang
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
t = torch.ones(2)
for step in range(1, 30):
    dist.all_reduce(t)
    cookbook_hang.step(step)
"""


@pytest.mark.slow
def test_a_collective_timeout_makes_every_rank_dump_and_names_the_stalled_rank(tmp_path: Path):
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent(SCRIPT.format(module_dir=str(Path(hang.__file__).parent.parent))))
    folder = tmp_path / "hang"
    env = {**os.environ, "COOKBOOK_HANG_DIR": str(folder), "COOKBOOK_HANG_INJECT": "1:3", "HF_TOKEN": KNOWN,
           "COOKBOOK_HANG_POLL_S": "0.5", "TORCH_FR_BUFFER_SIZE": "100", "OMP_NUM_THREADS": "1"}  # fmt: skip
    # the step watch stays quiet (3600 s): the gloo timeout (6 s) is what ends the waiting rank
    env["COOKBOOK_HANG_MIN_S"] = "3600"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", str(script)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode != 0
    trigger = json.loads((folder / hang.TRIGGER).read_text())
    assert trigger["rank"] == 0 and trigger["reason"].startswith("collective timeout on rank 0"), trigger
    assert {p.name for p in folder.glob("rank_*.json")} == {"rank_0.json", "rank_1.json"}
    found = hang.culprit(folder)
    assert found["ranks"] == [1] and found["op"] == "gloo:all_reduce" and found["seq"] == 4, found
    assert "in step" in (folder / "stack_rank_1.txt").read_text()
    for f in folder.iterdir():
        assert KNOWN.encode() not in f.read_bytes(), f
