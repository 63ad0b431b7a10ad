"""What the notebooks show is quiet and true (issue #42, item 8): no third-party import noise once ``cookbook`` is
imported, ``Job.outputs()`` lists what the run made (the cookbook's bookkeeping only with ``all=True``), and the
loss plot names the raw final loss, its moving average labelled as such. (The executed notebooks themselves:
``tests/notebooks/notebook_checks.py``'s ``check_quiet``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from cookbook.executor import Job
from cookbook.metrics import plot_runs

IMPORTS = (
    "import torchao, torchao.dtypes, logging; logging.getLogger('torchao').warning('another torchao warning'); "
    "logging.getLogger('torch._library.triton').warning('Triton not available, find_triton_kernels = []')"
)  # the last: torch's line where triton is absent (a login node's CPU torch), as torch logs it


def _stderr(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, check=True, timeout=300
    ).stderr


def test_torchaos_import_noise_is_filtered_once_cookbook_is_imported_and_nothing_else():
    import importlib.util

    source = Path(importlib.util.find_spec("torchao").origin).read_text()  # type: ignore[arg-type, union-attr]
    assert "Skipping import of cpp extensions" in source  # the noise is real with these versions (one import: ~10 s)
    quiet = _stderr(f"import cookbook; {IMPORTS}")
    assert "Skipping import of cpp extensions" not in quiet, quiet
    assert "Importing from torchao.dtypes is deprecated" not in quiet, quiet
    assert "Triton not available" not in quiet, quiet
    assert "another torchao warning" in quiet, quiet  # only the known messages are dropped


def test_outputs_lists_what_the_run_made_and_all_adds_the_bookkeeping(tmp_path: Path):
    made = [
        "epoch_0/adapter_model.safetensors",
        "epoch_0/adapter_config.json",
        "logs/log_1795889252.txt",
        "torchrun-logs/30-0/n1.log",
        "samples/step-4.png",
        "torchtune_config.yaml",
    ]
    bookkeeping = [".cookbook/runs.tsv", ".cookbook/hang/30-0/stack_rank_0.txt", "hang/stack_rank_0.txt", ".lock"]
    for name in made + bookkeeping:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 10)
    job = Job("30", tmp_path / "job.sbatch", tmp_path / "job.out", tmp_path, "llama3_3_70b_lora", "local-cpu", "lora")
    assert sorted(job.outputs()["file"]) == sorted(made)
    assert sorted(job.outputs(all=True)["file"]) == sorted(made + bookkeeping)


def test_the_loss_plot_names_the_raw_final_loss_not_the_smoothed_end():
    steps = range(1, 21)
    df = pd.DataFrame({"step": steps, "loss": [8 - 0.15 * s for s in steps], "split": "train"})
    ax = plot_runs({"run": df}).axes[0]
    raw, smoothed = ax.get_lines()[:2]
    assert raw.get_label() == "run: final loss 5 (step 20)" and raw.get_ydata()[-1] == 5
    assert smoothed.get_label().startswith("run: smoothed") and smoothed.get_ydata()[-1] > 5.5  # it trails
    assert [t.get_text() for t in ax.texts] == ["5"]  # the final value beside its point
