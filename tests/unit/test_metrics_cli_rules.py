"""Regressions around the metrics engine: CLI start-up imports, `cookbook metrics RUN_DIR` naming its source,
the diagnose prefilter covering every rule, and a log without line ends read in linear time."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.metrics import parse_log
from cookbook.metrics.diagnose import NEEDLES, RULES

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"
HEAVY = ("pandas", "matplotlib", "huggingface_hub")


@pytest.mark.parametrize("args", [["--help"], ["recipes"], ["plan", "--help"]])
def test_cli_start_loads_no_heavy_library(args):
    """`-X importtime` lists every module the process imported (stderr, one line each)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cookbook", *args], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "cookbook.cli" in imported  # the listing is real
    assert not {m for m in imported if m.split(".")[0] in HEAVY}


@pytest.mark.parametrize(
    "files, says",
    [
        ({"tb": "torchtitan_tb", "slurm-1.out": "torchtitan_debug_2rank.log"}, "(TensorBoard event files)"),
        ({"slurm-1.out": "torchtitan_debug_2rank.log"}, "(training log)"),
    ],
)
def test_metrics_run_dir_says_which_source_it_read(tmp_path, capsys, files, says):
    run = tmp_path / "run"
    run.mkdir()
    for name, src in files.items():
        (shutil.copytree if (LOGS / src).is_dir() else shutil.copy)(LOGS / src, run / name)
    assert main(["metrics", str(run), "--tail", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("reading ") and first.endswith(says)
    assert ("slurm-1.out" in first) == (says == "(training log)")  # the log file read, or the event folder


def _literal_runs(items, limit: int = 64) -> list[str]:
    """The texts a regex sequence must hold, as strings where "\\0" stands for anything not literal
    (repeats, classes, anchors); alternatives and small character sets expand into several strings."""
    from re import _constants as c

    out = [""]
    for op, av in items:
        if op is c.LITERAL:
            options = [chr(av)]
        elif op is c.IN and all(o is c.LITERAL for o, _ in av):
            options = [chr(v) for _, v in av]
        elif op is c.SUBPATTERN:
            options = _literal_runs(av[-1], limit)
        elif op is c.BRANCH:
            options = [s for branch in av[1] for s in _literal_runs(branch, limit)]
        else:
            options = ["\0"]
        out = [a + b for a in out for b in options][: limit * 4]
    return out


def test_every_rule_alternative_holds_a_needle():
    """The diagnose prefilter only passes lines holding one of NEEDLES: every text a rule can match (each
    alternative, each character-set choice) must hold one literally, or the rule is never tried."""
    from re import _parser

    for rule in RULES:
        for text in _literal_runs(list(_parser.parse(rule.pattern))):
            assert any(n in text for n in NEEDLES), f"{rule.kind}: {text!r} holds none of NEEDLES"
    assert re.compile("|".join(map(re.escape, NEEDLES)))  # the needles themselves are plain literals


def test_log_without_line_ends_is_read_in_linear_time(tmp_path, monkeypatch):
    """A file with no \\n or \\r (binary junk, a broken writer) used to grow the carried-over partial line
    window by window (quadratic); the leftover is capped like the follower's."""
    from cookbook.metrics import parse

    monkeypatch.setattr(parse, "WINDOW", 1 << 12)
    monkeypatch.setattr(parse, "MAX_PARTIAL", 1 << 14)
    times = {}
    for mb in (2, 16):
        log = tmp_path / f"junk{mb}.log"
        log.write_bytes(b"x" * (mb << 20) + b"\nstep: 1  loss: 2.5\n")
        t = time.process_time()
        df = parse_log(log)
        times[mb] = time.process_time() - t
        assert df["step"].tolist() == [1]  # the junk is dropped, the line after it still read
    assert times[16] < 8 * times[2] + 0.2, times  # linear (uncapped: 32 GB copied and scanned for 16 MB)
