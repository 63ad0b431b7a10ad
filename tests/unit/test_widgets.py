"""Job builder and monitor widgets, and the notebook step helpers, without Slurm.

The builder validates with the real recipe engine; the monitor reads real log files (fixtures
captured from real runs), written into a growing file the way a running job writes them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cookbook.walkthrough import NotebookStop, job_spec, merge_metrics, tail_text
from cookbook.widgets import JobBuilder, JobMonitor

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def _status(builder: JobBuilder) -> str:
    return builder.status.value


def test_builder_starts_valid_for_local_cpu():
    b = JobBuilder("llama3_3_70b_lora", profile="local-cpu")
    assert b.gpus.value == 0 and b.time.value == "00:10:00"
    assert b.problems() == []
    assert "data-valid='yes'" in _status(b) and not b.submit_button.disabled


def test_builder_shows_engine_problems_live_and_recovers():
    b = JobBuilder("llama3_3_70b_lora", profile="local-cpu")
    b.gpus.value = 8  # a change re-validates at once
    assert "set gpus_per_node=0" in _status(b)
    assert b.submit_button.disabled
    b.gpus.value = 0
    assert "data-valid='yes'" in _status(b)
    b.overrides.value = "checkpoint_dir=/x"  # a top-level override the 70B configs silently ignore
    assert "checkpointer.checkpoint_dir" in _status(b)
    b.overrides.value = "not an override"
    assert "KEY=VALUE" in _status(b) or "key=value" in _status(b).lower()


def test_builder_profile_switch_sets_gpus_and_tp_rule():
    b = JobBuilder("llama3_3_70b_full", profile="local-cpu")
    b.profile.value = "generic"
    assert b.gpus.value == 8 and b.time.value == "04:00:00"
    b.overrides.value = "tensor_parallel_dim=3"
    assert "must divide GPUs per node" in _status(b)


def test_builder_warns_when_the_planner_says_the_job_will_not_fit():
    b = JobBuilder("llama3_3_70b_full", profile="generic", nodes=2)
    assert "data-valid='yes'" in _status(b) and "data-fit" not in _status(b)  # 2 x 8 H100 fits
    b.nodes.value = 1
    b.overrides.value = "batch_size=16"
    status = _status(b)
    assert "data-fit='no'" in status and "does not fit on H100" in status
    assert "--nodes 1 --gpus-per-node 8 --gpu h100" in status and not b.submit_button.disabled  # a warning
    b.gpu.value = "b200"  # the GPU kind re-plans at once: ~95 GiB fits in 180
    assert "data-valid='yes'" in _status(b) and "data-fit" not in _status(b)
    b.profile.value = "local-cpu"  # tiny models: no GPU plan
    assert "data-fit" not in _status(b)


def test_builder_render_shows_script():
    b = JobBuilder("llama3_3_70b_lora", profile="local-cpu", nodes=2)
    text = b.render()
    assert text is not None and text.startswith("#!/bin/bash")
    assert "#SBATCH --nodes=2" in text and b.script.value == text


def test_builder_spare_nodes_ask_slurm_for_more_and_are_checked_live():
    b = JobBuilder("llama3_3_70b_lora", profile="local-cpu", nodes=2)
    b.spare_nodes.value = 1
    text = b.render()
    assert text is not None and "#SBATCH --nodes=3" in text and "--spare-nodes=1" in text
    b.spare_nodes.value = 3
    assert "spare_nodes=3 is more than nodes=2" in _status(b) and b.submit_button.disabled


def _grow(src: Path, dst: Path, fraction: float) -> None:
    """Write the first part of ``src``: up to just after its 3rd progress line when ``fraction`` < 1."""
    data = src.read_bytes()
    if fraction < 1:
        cut = 0
        for _ in range(4):
            cut = data.index(b"|Loss:", cut) + 1
        data = data[:cut]
    dst.write_bytes(data)


def test_monitor_follows_a_growing_torchtune_log(tmp_path):
    log = tmp_path / "job.out"
    _grow(LOGS / "torchtune_tqdm.log", log, 0.5)
    m = JobMonitor(log=log)
    m.refresh()
    first = len(m.df)
    assert first >= 1 and m.state.value == "state: (log only)"
    assert m.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    _grow(LOGS / "torchtune_tqdm.log", log, 1.0)
    m.refresh()
    assert len(m.df) > first
    total = int(m.df["total_steps"].dropna().iloc[-1])
    assert m.progress.value == pytest.approx(m.df["step"].iloc[-1] / total)
    assert m.progress_text.value.startswith(f"step {int(m.df['step'].iloc[-1])}/{total}")
    assert m.tail.value.strip() != ""


def test_monitor_diagnoses_a_failed_run(tmp_path):
    m = JobMonitor(log=LOGS / "torchtune_missing_checkpoint.log")
    m.refresh()
    assert "diagnosis" in m.diagnosis.value


def test_monitor_titan_log_plots_throughput(tmp_path):
    m = JobMonitor(log=LOGS / "torchtitan_debug_2rank.log")
    m.refresh()
    assert m.df["tokens_per_second_per_gpu"].notna().any()
    assert m.progress_text.value.startswith("step ") and "tokens/s/GPU" in m.progress_text.value


def test_notebook_stop_renders_one_clear_message():
    e = NotebookStop("the job cannot run here:\n- reason one")
    lines = e._render_traceback_()
    assert lines[0].endswith("the job cannot run here:") and "STOP" in lines[0]
    assert lines[1].strip() == "- reason one" and len(lines) == 2


def test_merge_metrics_joins_sources_per_step():
    a = pd.DataFrame({"step": [1, 2], "split": ["train", "train"], "loss": [2.0, 1.5], "total_steps": [2, 2]})
    b = pd.DataFrame(
        {"step": [1, 2], "split": ["train", "train"], "loss": [9.0, 9.0], "tokens_per_second_per_gpu": [10.0, 20.0]}
    )
    m = merge_metrics([a, b])
    assert list(m["loss"]) == [2.0, 1.5] and list(m["tokens_per_second_per_gpu"]) == [10.0, 20.0]
    assert list(m.columns[:2]) == ["step", "split"]


def test_tail_collapses_progress_bar_redraws(tmp_path):
    log = tmp_path / "x.out"
    log.write_bytes(b"start\n1|1|Loss: 3.0: 10%\r1|2|Loss: 2.0: 20%\rdone line\nlast\n")
    assert tail_text(log, 5) == "start\ndone line\nlast"


def test_job_spec_local_defaults():
    s = job_spec("llama3_3_70b_lora", profile="local-cpu")
    assert (s.gpus_per_node, s.exclusive, s.time) == (0, False, "00:10:00")
    assert 20000 <= s.port < 40000
    g = job_spec("llama3_3_70b_lora")
    assert (g.gpus_per_node, g.exclusive, g.time, g.port) == (8, True, "04:00:00", 29500)
