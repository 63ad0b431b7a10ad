"""``make demo`` executes every committed notebook (issue #42: 00-08), 07 being the sweep ``--no-sweep`` skips."""

from __future__ import annotations

from pathlib import Path

from cookbook.demo import _parse_args

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_the_demo_runs_every_committed_notebook_once():
    names = _parse_args([]).notebooks
    assert sorted(names) == sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) and len(set(names)) == len(names)
    assert names[0] == "00_setup", "the set-up notebook first: it checks what the others need"


def test_no_sweep_leaves_out_notebook_07_only():
    assert _parse_args(["--no-sweep"]).notebooks == [n for n in _parse_args([]).notebooks if n != "07_sweep_lora_rank"]
