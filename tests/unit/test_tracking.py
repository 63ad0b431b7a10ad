"""--tracker (issue 19 item 6) as rendered: every framework's logging switch, the tracker block under bash and
shellcheck, secrets nowhere in what is written, a tracker without its package refused before submission.
(The trackers run for real in tests/cluster/test_bring_your_own_cluster.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from batch_step import runtime_args

from cookbook.cli import main
from cookbook.render import render_job, write_job
from cookbook.spec import TRACKERS, SpecError, make_spec

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"WANDB_API_KEY": "wandb-key-3f9a1c7e", "MLFLOW_TRACKING_PASSWORD": "mlflow-pw-8d2b6e04"}


def _yaml(spec, tmp_path: Path) -> str:
    write_job(spec, tmp_path / "job.sbatch")
    return (tmp_path / "job.yaml").read_text()


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_torchtune_logs_through_its_metric_logger(tmp_path, tracker):
    text = _yaml(make_spec("llama3_3_70b_lora", "local-cpu", tracker=tracker), tmp_path)
    component = {"tensorboard": "TensorBoardLogger", "wandb": "WandBLogger", "mlflow": "MLFlowLogger"}[tracker]
    assert f"_component_: torchtune.training.metric_logging.{component}" in text
    assert "DiskLogger" not in text
    if tracker == "tensorboard":
        assert "log_dir: ${oc.env:COOKBOOK_TB_DIR}" in text and "organize_logs: false" in text
    assert "DiskLogger" in _yaml(make_spec("llama3_3_70b_lora", "local-cpu"), tmp_path / "none")


def test_torchtitan_switches_its_metrics_and_its_trainer_logs_to_mlflow(tmp_path):
    script = render_job(make_spec("llama3_8b_c4", "local-cpu", tracker="tensorboard")).script
    words = runtime_args(script, {"COOKBOOK_RUN_NAME": "tt-7"}).launcher  # the tracker block's name, at run time
    i = words.index("--metrics.enable_tensorboard")
    assert words[i : i + 3] == ["--metrics.enable_tensorboard", "--metrics.save_tb_folder", "tensorboard/tt-7"]
    assert "--metrics.enable_wandb" in render_job(make_spec("llama3_8b_c4", "local-cpu", tracker="wandb")).script
    job = render_job(make_spec("llama3_8b_c4", "local-cpu", tracker="mlflow"))  # the cookbook's trainer logs
    assert (
        "COOKBOOK_TRACKER=mlflow" in job.script and "cookbook_runtime/programs/cookbook_titan_trainer.py" in job.files
    )
    own = tmp_path / "my_titan.py"
    own.write_text(
        "def tiny():\n    from torchtitan.models.llama3.config_registry import llama3_debugmodel\n\n"
        "    return llama3_debugmodel()\n"
    )
    with pytest.raises(SpecError, match="a module of one's own does not use"):
        render_job(make_spec(f"titan:{own}:tiny", "local-cpu", tracker="mlflow"))
    with pytest.raises(SpecError, match="sets metrics.enable_wandb itself"):
        render_job(make_spec("llama3_8b_c4", "local-cpu", tracker="wandb", overrides={"metrics.enable_wandb": "false"}))


def test_the_fsdp_script_gets_its_tracker_flag():
    script = render_job(make_spec("fsdp_llama3_2_1b", "local-cpu", tracker="mlflow")).script
    assert "--tracker=mlflow" in script
    with pytest.raises(SpecError, match="use --tracker"):
        render_job(make_spec("fsdp_llama3_2_1b", "local-cpu", overrides={"tracker": "wandb"}))


def _run_block(script: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The script's tracker block under bash, as a job's batch step runs it (it ends where the launch begins)."""
    block = script.split("# --- experiment tracking", 1)[1].split("\n# --- launch", 1)[0]
    code = f"set -euo pipefail\n# ---{block}\nenv | grep -E '^(COOKBOOK|WANDB|MLFLOW)_' | sort\n"
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "RUN_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)


def test_the_run_name_is_the_job_name_and_the_first_job_id_across_requeues_and_resubmissions(tmp_path):
    script = render_job(make_spec("llama3_3_70b_lora", "local-cpu", tracker="wandb")).script
    first = _run_block(script, tmp_path, {"SLURM_JOB_ID": "41", "SLURM_JOB_NAME": "lora"}).stdout
    assert "WANDB_RUN_ID=lora-41" in first and "WANDB_RESUME=allow" in first and "COOKBOOK_RUN_NAME=lora-41" in first
    assert "WANDB_MODE=offline" in first and 'wandb sync "' in first  # no key anywhere: offline, sync printed
    again = _run_block(script, tmp_path, {"SLURM_JOB_ID": "57", "SLURM_JOB_NAME": "lora", **SECRETS}).stdout
    assert "WANDB_RUN_ID=lora-41" in again and "WANDB_MODE=online" in again  # a resubmission: the same run


def test_mlflow_gets_one_run_in_a_local_file_store(tmp_path, monkeypatch):
    script = render_job(make_spec("fsdp_llama3_2_1b", "local-cpu", tracker="mlflow")).script
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "fs", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    out = _run_block(script, tmp_path, env).stdout
    run_id = (tmp_path / "run" / ".mlflow_run_id").read_text().strip()
    assert f"MLFLOW_RUN_ID={run_id}" in out and f"MLFLOW_TRACKING_URI=file:{tmp_path}/run/mlruns" in out
    assert _run_block(script, tmp_path, {**env, "SLURM_JOB_ID": "8"}).stdout == out  # requeued or resubmitted
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the block exports for a file: store

    run = MlflowClient(f"file:{tmp_path}/run/mlruns").get_run(run_id)
    assert run.info.run_name == "fs-7"


def test_torchtitans_mlflow_logger_continues_the_scripts_run_after_a_requeue(tmp_path, monkeypatch):
    """The MLflow logger of the cookbook's torchtitan trainer (the runtime's cookbook_titan_trainer.py) against the
    local file store the script's tracker block sets up, as two starts of one job log."""
    script = render_job(make_spec("llama3_8b_c4", "local-cpu", tracker="mlflow")).script
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "tt", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    for line in _run_block(script, tmp_path, env).stdout.splitlines():  # the job's environment, as the ranks get it
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, value)
    path = ROOT / "slurm-recipes" / "cookbook_runtime" / "programs" / "cookbook_titan_trainer.py"
    module_spec = importlib.util.spec_from_file_location("cookbook_titan_trainer", path)
    assert module_spec and module_spec.loader
    trainer = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(trainer)
    for steps in ([1, 2], [3]):  # the first start, then the requeued one
        logger = trainer.MLflowLogger()
        for step in steps:
            logger.log({"loss_metrics/global_avg_loss": 3.0 / step, "memory/max_active(GiB)": 0.5, "n": "x"}, step)
        logger.close()
    from mlflow import MlflowClient

    store = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = store.get_run((tmp_path / "run" / ".mlflow_run_id").read_text().strip())
    assert run.info.run_name == "tt-7" and run.info.status == "FINISHED"
    history = store.get_metric_history(run.info.run_id, "loss_metrics/global_avg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 1.5), (3, 1.0)]
    assert set(run.data.metrics) == {"loss_metrics/global_avg_loss", "memory/max_active_GiB_"}


@pytest.mark.parametrize("tracker", TRACKERS)
def test_tracker_scripts_pass_shellcheck_and_carry_no_secret(tmp_path, monkeypatch, tracker):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    for recipe in ("llama3_3_70b_full", "fsdp_llama3_2_1b", "llama3_8b_c4"):
        folder = tmp_path / recipe
        write_job(make_spec(recipe, "local-cpu", tracker=tracker), folder / "job.sbatch")
        for path in (p for p in folder.rglob("*") if p.is_file()):
            assert not any(v in path.read_text() for v in SECRETS.values()), path
    r = subprocess.run(
        ["shellcheck", "--shell=bash", "--severity=style", "--format=gcc", *map(str, tmp_path.glob("*/job.sbatch"))],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_secrets_of_the_trackers_are_refused_as_job_environment(tmp_path, capsys):
    for name in SECRETS:
        assert main(["render", "llama3_3_70b_lora", "--env", f"{name}=x", "-o", str(tmp_path / "x.sbatch")]) == 2
        assert "secrets are never written into scripts" in capsys.readouterr().err


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_a_tracker_without_its_package_is_refused_in_one_line_before_submission(tmp_path, tracker):
    module = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}[tracker]
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"  # Python's way to make a package absent
        "from cookbook.cli import main\n"
        f"sys.exit(main(['render', 'fsdp_llama3_2_1b', '--profile', 'local-cpu', '--tracker', {tracker!r}, "
        f"'-o', {str(tmp_path / 'x.sbatch')!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert f"the {module} package is not installed (pip install" in r.stderr
    assert not (tmp_path / "x.sbatch").exists()


def test_an_unknown_tracker(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["render", "llama3_3_70b_lora", "--tracker", "comet", "-o", str(tmp_path / "x")])
    assert e.value.code == 2 and "invalid choice: 'comet'" in capsys.readouterr().err
    with pytest.raises(SpecError, match="unknown tracker 'comet'"):
        render_job(make_spec("llama3_3_70b_lora", "local-cpu", tracker="comet"))
