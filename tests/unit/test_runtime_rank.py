"""The ranks' side of the stop protocol (``cookbook_runtime.rank``), in one process (no process group)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cookbook_runtime import decide, files, rank


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(rank.time, "monotonic", lambda: now[0])
    return now


def _steps(stop: rank.StopRequest, clock: list[float], first: int, last: int, step_s: float) -> list[int]:
    """Run steps first..last of ``step_s`` seconds each; the steps at which the stop was agreed."""
    agreed = []
    for step in range(first, last + 1):
        clock[0] += step_s
        if stop.should_stop(step):
            agreed.append(step)
    return agreed


def test_problem_11_the_ranks_agree_every_n_steps_from_the_step_and_lead_time(
    tmp_path: Path, clock: list[float], monkeypatch: pytest.MonkeyPatch
):
    """1 s steps, a 240 s lead, a 20 s save: the flag is compared every N steps, N = stop_check_every (no host
    sync between), and a stop asked for mid-way is still seen within N steps."""
    monkeypatch.setenv(files.LEAD_ENV, "240")
    monkeypatch.setenv(files.SAVE_ENV, "20")
    flag = tmp_path / "stop"
    stop = rank.StopRequest(str(flag))
    every = decide.stop_check_every(1.0, 240, 20)
    assert every > 1
    asked = []
    real = stop.requested_here
    monkeypatch.setattr(stop, "requested_here", lambda: asked.append(1) or real())
    assert _steps(stop, clock, 1, 3 * every, 1.0) == []
    assert len(asked) < 3 * every  # not every step
    flag.touch()
    seen = _steps(stop, clock, 3 * every + 1, 5 * every, 1.0)
    assert seen and seen[0] - 3 * every <= every and seen[0] % every == 0


def test_without_a_lead_time_the_ranks_agree_at_every_step(tmp_path: Path, clock: list[float]):
    """No lead time known (a job without --signal): every step, as before."""
    flag = tmp_path / "stop"
    stop = rank.StopRequest(str(flag))
    assert _steps(stop, clock, 1, 5, 1.0) == []
    flag.touch()
    assert _steps(stop, clock, 6, 6, 1.0) == [6]


def test_a_slow_save_for_tests_delays_the_saved_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """COOKBOOK_TEST_SLOW_SAVE_S: the save is complete (the .saved file) only after that long."""
    slept = []
    monkeypatch.setattr(rank.time, "sleep", slept.append)
    monkeypatch.setenv("COOKBOOK_TEST_SLOW_SAVE_S", "40")
    stop = rank.StopRequest(str(tmp_path / "stop"))
    stop.saved(7, "/ckpt/step-7")
    assert slept == [40.0]
    assert (tmp_path / f"stop{files.SAVED_SUFFIX}").read_text().strip() == files.saved_line(7, "/ckpt/step-7")


def test_problem_9_torchtunes_collective_timeout_covers_the_stop_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """cookbook_tune gives torchtune's process group a timeout of 1.5 x the model's stop-save (at least torch's 10
    minutes): the ranks waiting while rank 0 writes a 70B full save (~846 s) are not a collective timeout."""
    from cookbook_runtime.programs import cookbook_tune

    recipe = tmp_path / "lora_finetune_distributed.py"
    recipe.write_text(
        "from torch.distributed import init_process_group\n"
        "class LoRAFinetuneRecipeDistributed:\n    pass\n"
        "SEEN = []\n"
        "def _main():\n    SEEN.append(init_process_group)\n"
        "def recipe_main():\n    _main()\n"
        "recipe_main.__wrapped__ = _main\n"
    )
    seen: list = []
    real = cookbook_tune.runpy.run_path

    def run_path(path: str, run_name: str) -> dict:
        module = real(path, run_name=run_name)
        seen.append(module)
        return module

    monkeypatch.setattr(cookbook_tune, "_recipe_file", lambda name: str(recipe))
    monkeypatch.setattr(cookbook_tune.runpy, "run_path", run_path)
    monkeypatch.setenv(files.SAVE_ENV, "846")
    assert cookbook_tune.main(["lora_finetune_distributed", "--config", "x.yaml"]) == 0
    (init,) = seen[0]["SEEN"]
    assert init.keywords["timeout"].total_seconds() == pytest.approx(1.5 * 846)


def test_problem_12_a_finished_run_submitted_again_does_nothing(tmp_path: Path):
    """--once: a run that trained to its end writes RUN_DIR/.cookbook/complete; the next submission says so and
    launches nothing. A stop-saved run is not finished, and a rehearsal neither reads nor writes the mark."""
    from batch_step import FakeSlurm

    slurm = FakeSlurm(tmp_path / "once")
    argv = ["--once", "--requeue", "--", "torchrun", "train.py"]
    first = slurm.run_step(argv, COOKBOOK_PREFLIGHT="0")
    assert first.status == 0 and len(first.launches()) == 1, first.out
    mark = slurm.run_dir / files.STATE / files.COMPLETE
    assert mark.read_text().startswith("job 41 finished it")
    again = slurm.run_step(argv, COOKBOOK_PREFLIGHT="0")
    assert again.status == 0 and again.launches() == [], again.out
    assert f"cookbook: the run in {slurm.run_dir} is complete (job 41 finished it" in again.out
    rehearsal = slurm.run_step(argv, COOKBOOK_PREFLIGHT="0", COOKBOOK_REHEARSE="/bin/true")
    assert len(rehearsal.launches()) == 1  # a rehearsal checks the nodes whatever the run's state

    saved = FakeSlurm(tmp_path / "saved")
    stopped = saved.run_step(argv, COOKBOOK_PREFLIGHT="0", FAKE_SRUN="signal:USR1")
    assert "requeueing job 41 after the stop-save" in stopped.out
    assert not (saved.run_dir / files.STATE / files.COMPLETE).exists()


def test_a_term_before_the_launch_trains_nothing(tmp_path: Path):
    """Cancelled (TERM) while the gate ran: no launch, no requeue, the run recorded as ended by TERM."""
    from batch_step import FakeSlurm

    slurm = FakeSlurm(tmp_path / "term")
    gate = slurm.bin / "srun"  # the gate's srun sends the batch step TERM, as scancel would
    gate.write_text(
        gate.read_text().replace(
            'if "cookbook_runtime.nodecheck" in args:  # the gate: no report (FAKE_GATE=ok: every node passes)\n',
            'if "cookbook_runtime.nodecheck" in args:\n    os.kill(os.getppid(), signal.SIGTERM)\n',
        )
    )
    assert "os.kill(os.getppid(), signal.SIGTERM)\n    if os.environ.get" in gate.read_text()
    ran = slurm.run_step(["--requeue", "--gate", "--", "torchrun", "train.py"])
    assert ran.launches() == [] and ran.argv("scontrol").count(["requeue", "41"]) == 0, ran.out
    assert "cookbook: got TERM before the launch: not training" in ran.out and ran.status == 143


def test_a_usr1_before_the_gate_is_kept_and_the_ranks_save_at_their_first_step(tmp_path: Path):
    """USR1 while the runtime still asks Slurm about the site (``scontrol show config``, before the gate): the
    handler is in place from the start, so the stop waits for the ranks instead of killing the batch step."""
    from batch_step import FakeSlurm

    slurm = FakeSlurm(tmp_path / "early")
    argv = ["--requeue", "--save-seconds=10", "--", "torchrun", "train.py"]
    ran = slurm.run_step(argv, COOKBOOK_PREFLIGHT="0", FAKE_SIGNAL_AT_CONFIG="USR1", FAKE_SRUN="save-if-stopped")
    assert "cookbook: got USR1" in ran.out and len(ran.launches()) == 1, ran.out
    assert "requeueing job 41 after the stop-save" in ran.out and ran.status == 0, ran.out


def test_the_ranks_get_the_python_the_batch_step_runs_on(tmp_path: Path):
    """`VENV=/shared/env sbatch ...` runs the batch step with that env's python3 (the script's exec line); the
    gate's and the launch's python3 on every node is the same one: its folder leads PATH."""
    import sys

    from batch_step import FakeSlurm

    slurm = FakeSlurm(tmp_path / "venv")
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python3").symlink_to(sys.executable)
    argv = [str(env_bin / "python3"), "-m", "cookbook_runtime.run", "--gate", "--", "torchrun", "train.py"]
    ran = slurm._ran(argv, slurm.env())
    sruns = [c for c in ran.calls if c["cmd"] == "srun"]
    assert len(sruns) == 2, ran.out  # the gate and the launch
    assert all(c["env"]["PATH"].split(":")[0] == str(env_bin) for c in sruns)


def test_ranks_ended_by_a_signal_exit_as_a_shell_would(tmp_path: Path):
    """srun killed by SIGKILL: the batch step exits 137 (128 + 9), as bash did and sacct reports, not -9."""
    from batch_step import FakeSlurm

    argv = ["--", "torchrun", "train.py"]
    ran = FakeSlurm(tmp_path / "killed").run_step(argv, COOKBOOK_PREFLIGHT="0", FAKE_SRUN="killed")
    assert ran.status == 137, ran.out
