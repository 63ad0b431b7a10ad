"""Careless FILES given to the ``cookbook`` command (issue #42): where a command writes and what it reads.

Every output (render's script folder, CSVs, plots, JSON, profile views, data layouts, download folders) is checked
before any work by ``cookbook.cli.files``: a folder where a file is meant, a file where a folder is meant, a
missing folder for a file, a place nobody can write to, a plot format matplotlib cannot write. A file that is not
a training log (text, binary) given to ``metrics``/``explain``/``diagnose``, an unknown ``--gpu``, a dataset file
of another type and a number out of range are refused too. Each: exit 2, exactly one line on stderr, no
traceback, nothing left behind. Then ``profile collect`` run twice and ``profile summary`` counting each rank once.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.cli.files import training_log
from cookbook.profiling.collect import VIEW_MARKER

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOG = FIXTURES / "logs" / "torchtune_tqdm.log"
TRACES = FIXTURES / "traces" / "torchtune"
DATA = FIXTURES / "data" / "openai_good.jsonl"

# (argv, a fragment the one line must hold); {locked} is a folder nobody may write to, {empty} an empty argument,
# the rest lie in the test's own folder: dir/ (a folder), text.txt (plain text), bin.dat (random bytes),
# latin1.txt (not UTF-8), imgs/ (bad.jpg, not an image, with its caption: a user's folder), missing/ (absent)
CASES: list[tuple[str, str]] = [
    # render: its -o folder is created, so a file above it, a folder as the script, no write access
    ("render fsdp_llama3_1_8b --profile local-cpu -o dir", "-o dir: is a folder, not a file"),
    ("render fsdp_llama3_1_8b --profile local-cpu -o text.txt/job.sbatch", "text.txt is a file, not a folder"),
    ("render fsdp_llama3_1_8b --profile local-cpu -o {locked}/job.sbatch", "cannot write in"),
    # metrics: CSV, plot, the log itself, --gpu, --tail
    ("metrics {log} --csv dir", "--csv dir: is a folder, not a file"),
    ("metrics {log} --csv missing/m.csv", "folder missing does not exist; create it"),
    ("metrics {log} --csv {locked}/m.csv", "cannot write in"),
    ("metrics {log} --csv text.txt/m.csv", "text.txt is a file, not a folder"),
    ("metrics {log} --plot m.xyz", "matplotlib cannot tell a plot format from '.xyz'"),
    ("metrics {log} --plot m", "matplotlib cannot tell a plot format from no suffix"),
    ("metrics {log} --plot missing/m.png", "folder missing does not exist"),
    ("metrics {log} --plot dir", "--plot dir: is a folder, not a file"),
    ("metrics {log} --plot {locked}/m.png", "cannot write in"),
    ("metrics text.txt", "text.txt: not a training log"),
    ("metrics bin.dat", "bin.dat: a binary file, not a training log"),
    ("metrics {log} --gpu h1000", "--gpu h1000: unknown GPU kind; use one of a100-40"),
    ("metrics {log} --tail -1", "--tail -1: must be >= 0"),
    # goodput: checked before the run is looked up
    ("goodput {log} --csv dir", "--csv dir: is a folder"),
    ("goodput {log} --csv missing/g.csv", "folder missing does not exist"),
    ("goodput {log} --plot g.xyz", "cannot tell a plot format"),
    ("goodput {log} --gpu h1000", "unknown GPU kind"),
    # explain, diagnose: the log and the plot
    ("explain text.txt", "text.txt: not a training log"),
    ("explain bin.dat", "bin.dat: a binary file"),
    ("explain {log} --gpu h1000", "--gpu h1000: unknown GPU kind; use one of"),
    ("explain {log} --plot e.xyz", "cannot tell a plot format"),
    ("explain {log} --plot missing/e.png", "folder missing does not exist"),
    ("diagnose text.txt", "not a training log"),
    ("diagnose bin.dat", "a binary file"),
    # profile: the view folder, the summary plot, the summary's --top, a file that is no trace
    ("profile collect text.txt", "text.txt: no such folder"),
    ("profile collect {traces} --out text.txt", "--out text.txt: is a file, not a folder"),
    ("profile collect {traces} --out {locked}/view", "cannot write in"),
    ("profile summary {traces} --plot s.xyz", "cannot tell a plot format"),
    ("profile summary {traces} --plot dir", "--plot dir: is a folder"),
    ("profile summary {traces} --plot missing/s.png", "folder missing does not exist"),
    ("profile summary {traces} --top 0", "--top 0: must be >= 1"),
    ("profile view text.txt --no-tensorboard", "not a readable profiler trace"),
    # data: the dataset's type, --sample, --max-seq-len, the plot, the layouts' folders and inputs
    ("data check bin.dat --style openai --model-dir missing", "unsupported file type"),
    ("data check {data} --style openai --model-dir missing --sample -3", "--sample -3: must be >= 1"),
    ("data check {data} --style openai --model-dir missing --max-seq-len -5", "--max-seq-len -5: must be >= 1"),
    ("data check {data} --style openai --model-dir missing --max-seq-len 0", "--max-seq-len 0: must be >= 1"),
    ("data check {data} --style openai --model-dir missing --plot h.xyz", "cannot tell a plot format"),
    ("data check {data} --style openai --model-dir missing --plot missing/h.png", "folder missing does not exist"),
    ("data check missing.jsonl --style openai --model-dir dir", "missing.jsonl: file not found"),
    ("data check {data} --style openai --model-dir text.txt", "text.txt/original/tokenizer.model: tokenizer file not"),
    ("data check {data} --style openai --tokenizer missing.model", "missing.model: tokenizer file not found"),
    ("data c4 text.txt --output-dir text.txt", "--output-dir text.txt: is a file, not a folder"),
    ("data c4 text.txt --output-dir text.txt/c4", "text.txt is a file, not a folder"),
    ("data c4 text.txt --output-dir {locked}/c4", "cannot write in"),
    ("data c4 bin.dat --output-dir out", "bin.dat: unsupported file type"),
    ("data c4 missing.txt --output-dir out", "missing.txt: no such file"),
    ("data c4 latin1.txt text.txt --output-dir out", "latin1.txt: not UTF-8 text"),
    ("data c4 text.txt --output-dir out --submit --log-dir text.txt", "--log-dir text.txt: is a file"),
    ("data cc12m text.txt --output-dir out", "text.txt: no such folder"),
    ("data cc12m imgs --output-dir out --shard-size 0", "--shard-size 0: must be >= 1"),
    ("data cc12m imgs --output-dir out", "bad.jpg: not an image"),
    ("data layout c4 missing", "missing: no such folder"),
    # the rest that write: rehearse's JSON, the tiny assets, downloads
    ("rehearse text.txt --json dir", "--json dir: is a folder"),
    ("tiny --root text.txt/tiny", "text.txt is a file, not a folder"),
    ("download org/model --output-dir text.txt --dry-run", "--output-dir text.txt: is a file"),
    ("stage llama3_8b_c4 --root text.txt --dry-run", "--root text.txt: is a file"),
    # a user's folder is never replaced by the tiny assets; an empty path is no folder (Path("") is the cwd)
    ("tiny --root imgs", "--root imgs: holds files the cookbook did not write (bad.jpg, bad.txt; no VERSION"),
    ("tiny --root {empty}", "--root '': an empty path names no folder"),
    ("stage llama3_8b_c4 --root {empty} --dry-run", "--root '': an empty path names no folder"),
    ("download org/model --output-dir {empty}", "--output-dir '': an empty path names no folder"),
    ("data c4 text.txt --output-dir {empty}", "--output-dir '': an empty path"),
    ("data cc12m imgs --output-dir {empty}", "--output-dir '': an empty path"),
    ("profile collect {traces} --out {empty}", "--out '': an empty path"),
    # a file option ending in "/" names a folder: Path() would drop the slash and write a file of that name
    ("render fsdp_llama3_1_8b --profile local-cpu -o newdir/", "-o newdir/: names a folder (it ends in /); name a"),
    (
        "render fsdp_llama3_1_8b --profile local-cpu -o dir/",
        "-o dir/: names a folder (it ends in /); name a file in it, e.g. dir/job.sbatch",
    ),
    ("render fsdp_llama3_1_8b --profile local-cpu -o {empty}", "-o '': an empty path names no file"),
    ("metrics {log} --csv newcsv/", "--csv newcsv/: names a folder (it ends in /)"),
    ("metrics {log} --plot p.png/", "--plot p.png/: names a folder (it ends in /)"),
    ("metrics {log} --csv {empty}", "--csv '': an empty path names no file"),
    ("goodput {log} --csv g/", "--csv g/: names a folder"),
    ("goodput {log} --plot g.png/", "--plot g.png/: names a folder"),
    ("explain {log} --plot {empty}", "--plot '': an empty path names no file"),
    ("explain {log} --plot e.png/", "--plot e.png/: names a folder"),
    ("goodput {log} --price-per-gpu-hour nan", "--price-per-gpu-hour nan: not a finite number"),
    ("profile summary {traces} --plot s.png/", "--plot s.png/: names a folder"),
    ("profile summary {traces} --plot {empty}", "--plot '': an empty path"),
    ("data check {data} --style openai --model-dir missing --plot h.png/", "--plot h.png/: names a folder"),
    ("rehearse text.txt --json r/", "--json r/: names a folder"),
    # the numbers the derived FLOPs come from: negative or infinite ones printed negative FLOPs
    ("metrics {log} --model llama3_1_8b --gpu h100 --seq-len -5", "--seq-len -5: must be >= 1"),
    ("metrics {log} --model flux_schnell --image-size 0", "--image-size 0: must be >= 16"),
    ("metrics {log} --flops-per-token -5", "--flops-per-token -5: must be >= 1"),
    ("metrics {log} --flops-per-token inf", "--flops-per-token inf: not a finite number"),
    ("metrics {log} --flops-per-token nan", "--flops-per-token nan: not a finite number"),
    ("metrics {log} --gpus 0", "--gpus 0: must be >= 1"),
]


def _unwritable(tmp_path: Path) -> Path:
    """A folder this user cannot write to: a read-only folder, or (root writes anywhere) ``/sys``."""
    folder = Path("/sys") if os.geteuid() == 0 else tmp_path / "locked"
    if folder != Path("/sys"):
        folder.mkdir()
        folder.chmod(0o555)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pytest.skip(f"{folder} is writable here")
    except OSError:
        return folder


def _files(*roots: Path) -> set[Path]:
    return {p for root in roots for p in root.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's folder, the current one, holding the careless inputs of :data:`CASES`."""
    work = tmp_path / "work"
    (work / "dir").mkdir(parents=True)
    (work / "text.txt").write_text("Dear diary,\nthe weather was fine today and the cat slept all afternoon.\n")
    (work / "bin.dat").write_bytes(random.Random(42).randbytes(8192))
    (work / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin-1"))
    (work / "imgs").mkdir()
    (work / "imgs" / "bad.jpg").write_text("not a JPEG")
    (work / "imgs" / "bad.txt").write_text("a caption")
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize(("command", "fragment"), CASES, ids=[c for c, _ in CASES])
def test_careless_file_is_one_line_exit_2_nothing_written(command, fragment, workdir, tmp_path, capsys):
    locked = _unwritable(tmp_path) if "{locked}" in command else None
    argv = [
        word.format(log=LOG, traces=TRACES, data=DATA, locked=locked, empty="")
        for word in command.split()  # no value of the table holds a space
    ]
    before = _files(workdir, *([locked] if locked else []))
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and fragment in err, err
    assert _files(workdir, *([locked] if locked else [])) == before


@pytest.mark.parametrize(
    "names",
    [("precious.txt",), ("notes/a.txt", "b.txt"), ("llama3/config.json",)],
    ids=["a user's file", "a user's folder", "a build's folder without VERSION"],
)
def test_tiny_assets_never_replace_a_folder_the_cookbook_did_not_write(names, tmp_path):
    """The tiny assets replace their whole root on a rebuild: a root that is not empty and has no VERSION marker
    of a build is refused before anything is written, forced or not."""
    from cookbook.local.assets.tiny import TinyRootTaken, ensure_tiny_assets

    root = tmp_path / "mydata"
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("mine\n")
    before = _files(tmp_path)
    for force in (False, True):
        with pytest.raises(TinyRootTaken) as info:
            ensure_tiny_assets(root, force=force)
        assert str(info.value).startswith(f"{root}: holds files the cookbook did not write")
        assert "\n" not in str(info.value) and _files(tmp_path) == before


def test_table_is_large_and_distinct():
    assert len(CASES) >= 35 and len({c for c, _ in CASES}) == len(CASES)


def test_fixture_logs_are_training_logs():
    """The log check refuses no real log: every log of the fixtures (steps, failures before the first step, Slurm
    lines only, tqdm only) passes; an empty file too (a job that has not written yet)."""
    logs = [p for p in (FIXTURES / "logs").iterdir() if p.is_file() and p.suffix in (".log", ".out", ".txt")]
    logs += [FIXTURES / "traces" / name / "run.log" for name in ("torchtune", "torchtitan")]
    assert len(logs) >= 15
    for log in logs:
        training_log(log)


def test_empty_log_passes(tmp_path):
    empty = tmp_path / "1234.out"
    empty.write_text("")
    training_log(empty)


def test_missing_folder_of_a_script_is_made(workdir, capsys):
    """render writes a folder of files (script, configs, runtime): a missing folder is made; a file alone (CSV,
    plot) needs its folder to exist (the cases above)."""
    assert main(["render", "fsdp_llama3_1_8b", "--profile", "local-cpu", "-o", "new/jobs/job.sbatch"]) == 0
    assert (workdir / "new" / "jobs" / "job.sbatch").is_file()
    assert main(["metrics", str(LOG), "--csv", "dir/m.csv", "--plot", "dir/m.PNG"]) == 0
    assert (workdir / "dir" / "m.csv").stat().st_size and (workdir / "dir" / "m.PNG").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------- profile collect twice, summary counts


def _torchtune_run(root: Path) -> Path:
    """A run folder as torchtune 0.6.1 leaves it: both ranks' traces named r0-<date>.<ns>.pt.trace.json.gz."""
    it = root / "run" / "profiling_outputs" / "iteration_5"
    it.mkdir(parents=True)
    shutil.copy(
        TRACES / "rank1_iter5.pt.trace.json.gz", it / "r0-2026-11-22-22-19.1795385965174767040.pt.trace.json.gz"
    )
    shutil.copy(
        TRACES / "rank0_iter5.pt.trace.json.gz", it / "r0-2026-11-22-22-19.1795385965207193914.pt.trace.json.gz"
    )
    return root / "run"


def _summary_ranks(out: str) -> list[str]:
    """The rank column of ``profile summary``'s per-rank table."""
    table = out.split("Per rank (mean over profiled steps):\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in table.splitlines()[1:]]


def test_profile_collect_twice_into_its_default_folder(tmp_path, capsys):
    run = _torchtune_run(tmp_path)
    for _ in range(2):  # the default view folder lies inside the run folder: the second run must not see its copies
        assert main(["profile", "collect", str(run)]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"Traces of {run} (2 files" in out and "Copied 2 to" in out
    view = run / "profile_view"
    assert sorted(p.name for p in view.iterdir()) == sorted(
        [VIEW_MARKER, "rank0_iter5.pt.trace.json.gz", "rank1_iter5.pt.trace.json.gz"]
    )
    for folder, names in ((run, "r0-"), (view, "rank")):  # the run, and its view: each rank once
        assert main(["profile", "summary", str(folder)]) == 0
        out = capsys.readouterr().out
        first = out.splitlines()[0]
        assert first.startswith("2 trace(s): ") and first.count(names) == 2, first
        assert _summary_ranks(out) == ["0", "1"], out


def test_profile_summary_refuses_a_rank_twice(tmp_path, capsys):
    """A copy of the traces with no view marker (copied by hand, or collected by an older cookbook): summarizing
    the folder above would count each rank twice, so it is refused in one line."""
    run = _torchtune_run(tmp_path)
    shutil.copytree(run / "profiling_outputs", run / "copy" / "profiling_outputs")
    assert main(["profile", "summary", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "two traces of rank 0 at iteration 5" in err, err
