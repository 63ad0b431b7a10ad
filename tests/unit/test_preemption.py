"""The stop protocol's rank side (cookbook_runtime.rank): flag file, signals, the agreement
across ranks (2 real gloo processes), the stop-save line and file; shipped beside every script."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cookbook_runtime import rank as preemption
from cookbook_runtime.rank import StopRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_signals():
    saved = {name: signal.getsignal(getattr(signal, name)) for name in preemption.SIGNALS}
    yield
    for name, handler in saved.items():
        signal.signal(getattr(signal, name), handler)


def test_flag_file_and_signal_ask_for_a_stop_and_the_save_is_reported(tmp_path, restore_signals, capsys):
    flag = tmp_path / ".cookbook" / "stop"
    stop = StopRequest(str(flag))
    assert not stop.should_stop()
    flag.parent.mkdir()
    flag.touch()
    assert stop.should_stop() and stop.should_stop()
    stop.saved(7, "/runs/x/checkpoint/step-7")
    out = capsys.readouterr().out
    assert out.count("cookbook: stop requested (flag file") == 1  # said once, at the first agreed stop
    assert "cookbook: saved at step 7 for preemption: /runs/x/checkpoint/step-7\n" in out
    assert (tmp_path / ".cookbook" / "stop.saved").read_text() == preemption.saved_line(
        7, "/runs/x/checkpoint/step-7"
    ) + "\n"

    by_signal = StopRequest(str(tmp_path / "absent"))
    assert not by_signal.should_stop()
    os.kill(os.getpid(), signal.SIGUSR1)  # the handler only sets the flag: this process goes on
    assert by_signal.signal_name == "SIGUSR1" and by_signal.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert by_signal.signal_name == "SIGTERM"


def test_the_environment_names_the_flag_file(tmp_path, monkeypatch, restore_signals):
    monkeypatch.setenv(preemption.STOP_FILE_ENV, str(tmp_path / "stop"))
    assert StopRequest().flag_file == str(tmp_path / "stop")
    monkeypatch.delenv(preemption.STOP_FILE_ENV)
    stop = StopRequest()
    assert stop.flag_file is None and not stop.should_stop()
    stop.saved(1, "x")  # no flag file: the line only
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_one_rank_signalled_stops_every_rank_at_the_same_step(tmp_path):
    """2 gloo ranks; only rank 1 gets USR1, after its step 3: both answer True at step 3, and only rank 0
    reports the save."""
    program = textwrap.dedent(
        """
        import os, signal, sys
        import torch.distributed as dist
        from cookbook_runtime.rank import StopRequest

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        stop = StopRequest()
        for step in range(1, 10):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGUSR1)
            if stop.should_stop():
                stop.saved(step, f"ckpt/step-{step}")
                print(f"rank {rank} stopped at {step}", flush=True)
                break
        dist.destroy_process_group()
        """
    )
    script = tmp_path / "loop.py"
    script.write_text(program)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COOKBOOK_STOP_FILE": str(tmp_path / "stop"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank 0 stopped at 3" in r.stdout and "rank 1 stopped at 3" in r.stdout
    assert r.stdout.count("cookbook: saved at step 3 for preemption: ckpt/step-3") == 1
    assert "a signal on another rank" in r.stdout
    assert (tmp_path / "stop.saved").is_file()


def test_every_rendered_job_ships_the_module_and_the_traps():
    from cookbook.recipes import list_recipes
    from cookbook.render import RUNTIME, render_job
    from cookbook.spec import make_spec

    for name in ("llama3_3_70b_full", "llama3_8b_c4", "flux_schnell", "fsdp_llama3_1_8b"):
        assert name in {r.name for r in list_recipes()}
        job = render_job(make_spec(name, profile="generic"))
        assert job.files["cookbook_runtime/rank.py"] == (RUNTIME / "rank.py").read_text()
        assert 'COOKBOOK_STOP_FILE="$RUN_DIR/.cookbook/stop"' in job.script
        assert "trap 'on_stop_signal USR1' USR1" in job.script and "trap 'on_stop_signal TERM' TERM" in job.script
        assert 'bash -c \'trap "" USR1; exec "$@"\' cookbook-launcher' in job.script
    titan = render_job(make_spec("llama3_8b_c4", profile="generic"))
    assert "cookbook_titan_trainer.py" in titan.files
    assert "from cookbook_titan_trainer import stoppable" in titan.files["cookbook_titan.py"]
