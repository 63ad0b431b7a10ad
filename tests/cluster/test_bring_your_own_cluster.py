"""Bring your own (issue 19 item 5) and --tracker (item 6), trained for real on the 2-node local cluster.

One module fixture starts six jobs side by side (tiny models, a few steps), each a bring-your-own recipe or a
tracker the others do not cover:
- a torchtune YAML of one's own (derived from the tiny full-finetune config) with TensorBoard, read back with
  TensorBoard's own reader;
- a torchtune built-in config (``tune:llama3_2/1B_full``) pointed at the tiny model, tokenizer and data with
  --set, as a user points it at a download, with W&B in offline mode (the printed sync command names its run);
- a torchtitan config module of one's own with W&B in offline mode (the printed sync command names its run);
- one's own torchrun script with MLflow's local file store, requeued mid-run: the second start logs into the
  same MLflow run, named <job name>-<first job id>;
- the FSDP script on one node with MLflow;
- torchtitan's llama3 recipe (the cookbook's trainer) on one node with MLflow (torchtitan has no MLflow logger).
Known W&B and MLflow secrets are in the submission's environment: Slurm never gets them (the client drops
`spec.SECRET_NAMES` from every Slurm command; the trackers read their keys from their own files on the nodes), so
they are in no environment Slurm keeps of the live jobs, no file the jobs wrote, no log, and no process's argument
list (both sampled while the jobs run).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from cluster_wait import wait_for as _wait_for

from cookbook.executor import Executor, Job
from cookbook.slurm.client import SlurmClient

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"WANDB_API_KEY": "byo-wandb-key-5c0ffee1", "MLFLOW_TRACKING_PASSWORD": "byo-mlflow-pw-d00dfeed"}
SCRIPT_STEPS = 8
FSDP_STEPS = 6

TRAIN_PY = '''"""One's own torchrun program: a linear model, gradients averaged over the ranks, a checkpoint per step in
$RUN_DIR, resumed after a requeue; rank 0 prints the loss and logs it to MLflow when the job asks."""
import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--sleep", type=float, default=0.0)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ckpt = Path(os.environ["RUN_DIR"]) / "ckpt.pt"
start = 0
if ckpt.exists():
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    print(f"resumed after step {start}", flush=True)
run = None
if rank == 0 and os.environ.get("COOKBOOK_TRACKER") == "mlflow":
    import mlflow

    run = mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
x = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
y = x.sum(1, keepdim=True)
for step in range(start + 1, args.steps + 1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= world
    opt.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.5f}", flush=True)
        if run is not None:
            mlflow.log_metric("loss", loss.item(), step=step)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, str(ckpt) + ".tmp")
        os.replace(str(ckpt) + ".tmp", ckpt)
    dist.barrier()
    time.sleep(args.sleep)
if run is not None:
    mlflow.end_run()
dist.destroy_process_group()
'''

TITAN_MODULE = '''"""A torchtitan config module of one's own: the debug Llama on the tiny C4-like folder."""
import os


def tiny():
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    tiny_dir = os.environ.get("TINY_DIR", ".cache/tiny")
    cfg = llama3_debugmodel()
    cfg.hf_assets_path = f"{tiny_dir}/hf_tokenizer"
    cfg.dataloader.dataset = "c4"
    cfg.dataloader.dataset_path = f"{tiny_dir}/c4"
    cfg.training.local_batch_size = 2
    cfg.training.seq_len = 64
    cfg.training.steps = 3
    cfg.validator.enable = False
    cfg.metrics.log_freq = 1
    return cfg
'''


def _own_tune_yaml(path: Path) -> Path:
    """A torchtune config of one's own: the tiny full-finetune config, 3 steps of one epoch, smaller batches."""
    text = (ROOT / "cookbook" / "recipes" / "configs" / "tiny_full.yaml").read_text()
    text = text.replace("max_steps_per_epoch: null", "max_steps_per_epoch: 3").replace("batch_size: 2", "batch_size: 1")
    path.write_text("# my own tiny torchtune config\n" + text)
    return path


TUNE_BUILTIN_STEPS = 3


def _tiny_builtin_overrides() -> dict[str, str]:
    """--set overrides pointing torchtune's built-in ``llama3_2/1B_full`` at the tiny assets: the model,
    tokenizer, dataset and checkpoint of the local-cpu tiny config (its ``${oc.env:TINY_DIR}`` paths: the
    local-cpu script sets TINY_DIR), on CPU in fp32, a few steps."""
    from omegaconf import OmegaConf

    def dotted(node: dict, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    tiny = OmegaConf.to_container(OmegaConf.load(ROOT / "cookbook/recipes/configs/tiny_full.yaml"), resolve=False)
    keep = ("model.", "tokenizer.", "dataset.", "checkpointer.checkpoint_dir", "checkpointer.model_type")
    keep += ("device", "dtype", "optimizer.fused")
    out = {k: str(v) for k, v in dotted(tiny).items() if k.startswith(keep)}  # type: ignore[arg-type]
    out["checkpointer.checkpoint_files"] = "[model-00001-of-00001.safetensors]"  # the built-in lists its file
    steps = {"max_steps_per_epoch": str(TUNE_BUILTIN_STEPS), "gradient_accumulation_steps": "1", "seed": "0"}
    return {**out, **steps, "batch_size": "2"}


def _argv_hits(state: Path) -> list[str]:
    """Command lines of every process on the machine (the nodes are namespaces of it) and environments Slurm keeps of
    live jobs (``state``: the controller's StateSaveLocation, ``hash.N/job.ID/environment``) holding a secret."""
    hits = []
    for env in state.rglob("environment"):
        try:
            text = env.read_bytes().decode(errors="replace")
        except OSError:
            continue  # the job ended meanwhile
        hits += [f"{env}: a secret in Slurm's record of the job" for v in SECRETS.values() if v in text]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        hits += [f"{cmdline.parent.name}: {text[:200]}" for v in SECRETS.values() if v in text]
    return hits


@pytest.fixture(scope="module")
def runs(slurm, local_cluster, tiny_assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("byo")
    (root / "train.py").write_text(TRAIN_PY)
    (root / "my_titan.py").write_text(TITAN_MODULE)
    own_yaml = _own_tune_yaml(root / "my_tiny_full.yaml")
    client = SlurmClient({**slurm.env, **SECRETS, "WANDB_MODE": "offline"})

    def submit(recipe: str, name: str, overrides: dict[str, str] | None = None, **parameters) -> Job:
        executor = Executor(root / "jobs", "local-cpu", client)
        executor.update_parameters(**{"nodes": 2, "job_name": name, "assets_dir": str(tiny_assets.root), **parameters})
        return executor.submit(recipe, **(overrides or {}))

    jobs = {
        "tune": submit(f"tune:full_finetune_distributed:{own_yaml}", "byo-tune", tracker="tensorboard"),
        "tune_builtin": submit("tune:llama3_2/1B_full", "byo-tune-builtin", _tiny_builtin_overrides(), tracker="wandb"),
        "titan": submit(f"titan:{root / 'my_titan.py'}:tiny", "byo-titan", tracker="wandb"),
        "script": submit(
            f"script:{root / 'train.py'}",
            "byo-script",
            tracker="mlflow",
            program_args=["--steps", str(SCRIPT_STEPS), "--sleep", "1"],
        ),
        "fsdp": submit("fsdp_llama3_2_1b", "byo-fsdp", {"max_steps": str(FSDP_STEPS)}, nodes=1, tracker="mlflow"),
        "titan_mlflow": submit(
            "llama3_8b_c4", "byo-titan-mlflow", {"metrics.log_freq": "1"}, nodes=1, tracker="mlflow"
        ),
    }
    # the script's job is requeued (a node failure, an admin) once it has checkpointed step 3
    script = jobs["script"]
    argv_hits: list[str] = []
    state = local_cluster.cfg.root / "state"
    assert any(state.rglob("environment")), "the controller keeps live jobs' environments here"

    def checkpointed() -> bool:
        argv_hits.extend(_argv_hits(state))
        return script.log.is_file() and "step 3 loss" in script.log.read_text()

    _wait_for(checkpointed, 300, "the script job's step 3")
    client.requeue(script.job_id)
    client.release_requeued(script.job_id)  # Slurm holds requeued jobs back
    end = time.monotonic() + 600
    while not all(client.state(j.job_id).done for j in jobs.values()):
        assert time.monotonic() < end, "timed out waiting for the jobs"
        argv_hits.extend(_argv_hits(state))
        time.sleep(1)
    for job in jobs.values():
        info = client.state(job.job_id)
        assert info.state == "COMPLETED", f"{job.name}: {info.state}\n{job.tail(40)}"
    return root, jobs, argv_hits


def _run_name(job: Job) -> str:
    return f"{job.name}-{job.job_id}"


def _wandb_sync_targets(log: str) -> list[Path]:
    """What the ``wandb sync`` command the job printed names, its glob expanded by bash as a user's shell would."""
    lines = [line for line in log.splitlines() if "wandb sync " in line]
    assert lines, "no wandb sync command in the log"
    pattern = lines[-1].split("wandb sync ", 1)[1]
    code = f'shopt -s nullglob; for p in {pattern}; do printf "%s\\n" "$p"; done'
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True).stdout
    return [Path(p) for p in out.splitlines()]


def test_a_torchtune_yaml_of_ones_own_logs_to_tensorboard(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    _, jobs, _ = runs
    job = jobs["tune"]
    assert "torchtune full_finetune_distributed" in job.script.read_text()
    assert "my own tiny torchtune config" not in job.script.read_text()
    folder = job.run_dir / "tensorboard" / _run_name(job)
    assert f"tracker: TensorBoard run {_run_name(job)}" in job.log.read_text()
    events = EventAccumulator(str(folder))
    events.Reload()
    # torch's SummaryWriter writes scalars as tensor summaries: read them as TensorBoard's scalar plugin does
    losses = [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors("loss")]
    assert [step for step, _ in losses] == [1, 2, 3]
    assert all(0 < loss < 20 for _, loss in losses)
    assert {"lr", "tokens_per_second_per_gpu"} <= set(events.Tags()["tensors"])


def test_a_torchtune_builtin_config_trains_and_logs_to_wandb_offline(runs):
    _, jobs, _ = runs
    job = jobs["tune_builtin"]
    assert "torchtune llama3_2/1B_full + overrides" in (job.script.parent / f"{job.script.stem}.yaml").read_text()
    df = job.metrics()
    assert sorted(set(df["step"])) == list(range(1, TUNE_BUILTIN_STEPS + 1))
    assert df["loss"].between(0, 20).all()
    log = job.log.read_text()
    assert f"tracker: W&B run {_run_name(job)} in project cookbook (offline)" in log
    (run,) = job.run_dir.glob(f"wandb/offline-run-*-{_run_name(job)}")  # torchtune's WandBLogger: $WANDB_DIR
    assert _wandb_sync_targets(log) == [run]
    (records,) = run.glob("run-*.wandb")
    assert b"loss" in records.read_bytes()


def test_a_torchtitan_module_of_ones_own_logs_to_wandb_offline(runs):
    _, jobs, _ = runs
    job = jobs["titan"]
    log = re.sub(r"\x1b\[[0-9;]*m", "", job.log.read_text())
    assert f"tracker: W&B run {_run_name(job)} in project cookbook (offline)" in log
    (run,) = job.run_dir.glob(f"wandb/*/wandb/offline-run-*-{_run_name(job)}")
    assert _wandb_sync_targets(log) == [run]  # the printed command uploads the run torchtitan wrote
    (records,) = run.glob("run-*.wandb")
    data = records.read_bytes()
    assert _run_name(job).encode() in data and b"loss_metrics/global_avg_loss" in data


def test_ones_own_script_requeued_continues_its_mlflow_run(runs, monkeypatch):
    from mlflow import MlflowClient

    _, jobs, _ = runs
    job = jobs["script"]
    log = job.log.read_text()
    assert log.count(f"tracker: MLflow run {_run_name(job)} (") == 2  # both starts, one run
    assert re.search(r"resumed after step [3-9]", log)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = MlflowClient(f"file:{job.run_dir}/mlruns")
    (run,) = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert run.info.run_name == _run_name(job)
    assert run.info.run_id == (job.run_dir / ".mlflow_run_id").read_text().strip()
    steps = {m.step for m in store.get_metric_history(run.info.run_id, "loss")}
    assert steps == set(range(1, SCRIPT_STEPS + 1))


def test_the_fsdp_script_logs_to_mlflow(runs, monkeypatch):
    from mlflow import MlflowClient

    _, jobs, _ = runs
    job = jobs["fsdp"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = MlflowClient(f"file:{job.run_dir}/mlruns")
    (run,) = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert run.info.run_name == _run_name(job)
    history = store.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == list(range(1, FSDP_STEPS + 1))
    assert {"lr", "tokens_per_second_per_gpu"} <= set(run.data.metrics)


def test_the_torchtitan_trainer_logs_to_mlflow(runs, monkeypatch):
    from mlflow import MlflowClient

    _, jobs, _ = runs
    job = jobs["titan_mlflow"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = MlflowClient(f"file:{job.run_dir}/mlruns")
    (run,) = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert run.info.run_name == _run_name(job) and run.info.status == "FINISHED"
    history = store.get_metric_history(run.info.run_id, "loss_metrics/global_avg_loss")
    assert [m.step for m in history] == [1, 2, 3, 4]  # llama3_8b_c4_tiny: 4 steps, each logged
    assert all(0 < m.value < 20 for m in history)
    assert "grad_norm" in run.data.metrics


def test_no_secret_in_any_file_log_or_argument_list(runs):
    root, _, argv_hits = runs
    assert argv_hits == []
    leaked = [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and any(v.encode() in p.read_bytes() for v in SECRETS.values())
    ]
    assert leaked == []
