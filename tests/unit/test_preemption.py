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
from batch_step import FakeSlurm, job_view, runtime_args, runtime_argv

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


@pytest.mark.parametrize("name", ["llama3_3_70b_full", "llama3_8b_c4", "flux_schnell", "fsdp_llama3_1_8b"])
def test_every_rendered_job_ships_the_runtime_and_saves_on_usr1_or_term(name, tmp_path):
    """Every job ships cookbook_runtime (rank.py for the ranks, run.py for the batch step) and asks the batch step
    to watch USR1/TERM (--requeue). Run for real against stand-in srun/scontrol: the signal becomes the stop flag
    the ranks poll (COOKBOOK_STOP_FILE); after their stop-save USR1 requeues the job, TERM leaves that to Slurm."""
    from cookbook.recipes import list_recipes
    from cookbook.render import RUNTIME, render_job
    from cookbook.spec import make_spec

    assert name in {r.name for r in list_recipes()}
    job = render_job(make_spec(name, profile="generic"))
    for module in RUNTIME.glob("*.py"):
        assert job.files[f"cookbook_runtime/{module.name}"] == module.read_text(), module.name
    argv = runtime_argv(job.script)
    assert "--requeue" in argv[: argv.index("--")]
    usr1 = FakeSlurm(tmp_path / "usr1").run_step(argv, FAKE_SRUN="signal:USR1", COOKBOOK_PREFLIGHT="0")
    (launch,) = usr1.launches()
    assert launch["env"]["COOKBOOK_STOP_FILE"] == str(tmp_path / "usr1" / "run" / ".cookbook" / "stop")
    assert "cookbook: got USR1: every rank saves at its next step boundary" in usr1.out
    assert "cookbook: requeueing job 41 after the stop-save (cookbook: saved at step 3" in usr1.out
    assert usr1.status == 0 and usr1.argv("scontrol")[-1] == ["requeue", "41"]
    term = FakeSlurm(tmp_path / "term").run_step(argv, FAKE_SRUN="signal:TERM", COOKBOOK_PREFLIGHT="0")
    assert "cookbook: got TERM: every rank saves at its next step boundary" in term.out
    assert "cookbook: got TERM: not requeueing" in term.out
    assert term.status == 0 and not [a for a in term.argv("scontrol") if a[0] == "requeue"]
    if name == "llama3_8b_c4":
        assert "cookbook_runtime/programs/cookbook_titan_trainer.py" in job.files
        titan = job.files["cookbook_runtime/programs/cookbook_titan.py"]
        assert "from cookbook_runtime.programs.cookbook_titan_trainer import stoppable" in titan


def test_the_launcher_on_every_node_is_shielded_from_usr1_and_term(monkeypatch):
    """torchrun's agent answers TERM by killing its workers mid-save: each node's launcher runs under
    cookbook_runtime.launch, which ignores USR1 and TERM, keeps ignoring them when torchrun installs its own
    handler, and passes the ignored disposition to the ranks it starts (their StopRequest replaces it).
    `cookbook rehearse` (COOKBOOK_REHEARSE) runs its check in the launcher's place instead."""
    from cookbook.render import render_job
    from cookbook.spec import make_spec
    from cookbook_runtime import run

    monkeypatch.delenv("COOKBOOK_REHEARSE", raising=False)
    for name, words in (("llama3_3_70b_full", ["tune", "run"]), ("fsdp_llama3_1_8b", ["torchrun"])):
        args = runtime_args(render_job(make_spec(name, profile="generic")).script)
        command = run.launch_command(job_view(args), "10.0.0.1", 29500, 8, [])
        launcher = command[command.index("--kill-on-bad-exit=1") + 1 :]
        assert launcher[: 3 + len(words)] == ["python3", "-m", "cookbook_runtime.launch", *words]
        monkeypatch.setenv("COOKBOOK_REHEARSE", "/jobs/.rehearsal/node-check")
        command = run.launch_command(job_view(args), "10.0.0.1", 29500, 8, [])
        rehearsed = command[command.index("--kill-on-bad-exit=1") + 1 :]
        assert rehearsed[: 1 + len(words)] == ["/jobs/.rehearsal/node-check", *words]
        monkeypatch.delenv("COOKBOOK_REHEARSE")
    code = textwrap.dedent(
        """
        import os, signal, subprocess, sys
        from cookbook_runtime import launch

        launch.shield()
        signal.signal(signal.SIGTERM, lambda *a: print("torchrun's handler ran"))  # as torchrun's agent does
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        rank = "import signal as s; print(s.getsignal(s.SIGUSR1) == s.getsignal(s.SIGTERM) == s.SIG_IGN)"
        ignored = subprocess.run([sys.executable, "-c", rank], capture_output=True, text=True).stdout.strip()
        print("alive; a rank ignores both:", ignored)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "slurm-recipes")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "alive; a rank ignores both: True"), r.stderr
