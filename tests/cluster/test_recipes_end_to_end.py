"""Every recipe, as the engine renders it (profile local-cpu), trained for real on the 2-node local
cluster with tiny models, and surviving a requeue.

The runs are started together by one module fixture (they share the cluster's nodes) and each test
checks one run's outputs, so the file costs about as much as its slowest run (~110 s on 2 cores). Two
of the runs are the committed copy-paste scripts of slurm-recipes/ sbatched as a user would.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
from cluster_wait import OUTER_LIMIT_S, log_sizes, wait_done

from cookbook.slurm.client import REQUEUE_SETTLE_S, SlurmClient
from cookbook.walkthrough import Job, job_spec, profiling_overrides, submit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# torchtune checkpoints at epoch ends (0.6.1): 2 short epochs give a checkpoint to resume from. Periodic step
# checkpoints (save_every_n_steps) stay off in the interrupted jobs: a preempted run saves at the step it reaches
# (cookbook_tune.py). The uninterrupted full run writes them every TUNE_EVERY steps (cookbook_tune.py's interval).
TUNE_FULL = {"epochs": "2", "max_steps_per_epoch": "4", "throttle_seconds": "0.5"}  # a signal lands mid-run
TUNE_EVERY = 3
TUNE_STEPS_PER_EPOCH = 4
TITAN_STEPS = 10
# profiler: one warm-up step, then step 2 traced (torchtitan writes profiling/traces/iteration_2/rank{R}_...)
PROFILE = {"steps": 1, "warmup": 1, "start_step": 2}


def _submit(slurm: SlurmClient, root: Path, tiny, recipe: str, name: str, overrides: dict[str, str]) -> Job:
    spec = job_spec(recipe, profile="local-cpu", nodes=2, job_name=name, overrides=overrides, assets_dir=str(tiny.root))
    return submit(spec, root=root, client=slurm)


def _requeued(slurm: SlurmClient, job: Job) -> bool:
    """Requeued, and so held back by Slurm (BeginTime a few minutes ahead): the caller lets it start now."""
    return slurm.state(job.job_id).state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


def _segments(log: Path) -> list[str]:
    """The log split at each start of the batch script (a requeued job appends to the same log)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))  # torchtitan colours its lines
    starts = [m.start() for m in re.finditer(r"^job \d+: \d+ node\(s\)", text, flags=re.M)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


@pytest.fixture(scope="module")
def runs(slurm, tiny_assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    titan_overrides = {
        "training.steps": str(TITAN_STEPS),
        "checkpoint.interval": "3",
        "metrics.enable_tensorboard": "True",
        "metrics.log_freq": "1",
        **profiling_overrides("llama3_8b_c4", "local-cpu", **PROFILE),
    }
    jobs = {
        "titan": _submit(slurm, root, tiny_assets, "llama3_8b_c4", "titan-c4", titan_overrides),
        "flux": _submit(
            slurm,
            root,
            tiny_assets,
            "flux_schnell",
            "flux",
            {
                "training.steps": "4",
                "metrics.enable_tensorboard": "True",
                **profiling_overrides("flux_schnell", "local-cpu", **PROFILE),
            },
        ),
    }
    # Save on signal: periodic checkpoints off (interval longer than the run), USR1 mid-run; the copied
    # llama3 script and "flux" above are the uninterrupted runs they are compared with (same seed and data)
    no_periodic = {"training.steps": "4", "checkpoint.interval": "100"}
    jobs["titan_stop"] = _submit(slurm, root, tiny_assets, "llama3_8b_c4", "titan-stop", no_periodic)
    jobs["flux_stop"] = _submit(slurm, root, tiny_assets, "flux_schnell", "flux-stop", no_periodic)
    # The copy-paste scripts of slurm-recipes/ as they are, two at once on the same nodes (fixed names,
    # fixed base port: each job must still get its own rendezvous port).
    jobs.update(_submit_copied_scripts(slurm, root, tiny_assets, ("llama3_8b_c4", "flux_schnell")))
    # the torchtune jobs last (torchtitan's jobs are slow to render: its parser): their 8 steps take about a minute,
    # and the interruptions below must reach them while they train
    jobs.update(
        {
            "full": _submit(
                slurm,
                root,
                tiny_assets,
                "llama3_3_70b_full",
                "tt-full",
                {**TUNE_FULL, "save_every_n_steps": str(TUNE_EVERY)},
            ),
            "full_resumed": _submit(slurm, root, tiny_assets, "llama3_3_70b_full", "tt-full-resumed", TUNE_FULL),
            "lora": _submit(slurm, root, tiny_assets, "llama3_3_70b_lora", "tt-lora", TUNE_FULL),
            "lora_resumed": _submit(slurm, root, tiny_assets, "llama3_3_70b_lora", "tt-lora-resumed", TUNE_FULL),
            "lora_stopped": _submit(slurm, root, tiny_assets, "llama3_3_70b_lora", "tt-lora-stopped", TUNE_FULL),
        }
    )
    interruptions: dict[str, str] = {}

    # Each interruption fires as soon as its job is ready for it (the jobs run side by side):
    # - preemption: USR1 to the batch shell (what --signal=B:USR1@N sends before the time limit); the
    #   script's trap asks the ranks to save at their next step boundary, then requeues the job, which resumes
    #   there (torchtune full in its second epoch, LoRA in its first);
    # - node failure / admin: `scontrol requeue` kills the LoRA job in its second epoch and the torchtitan
    #   job once its first checkpoint is complete.
    # - save on signal (torchtitan, FLUX): USR1 to the batch shell once training has started (before step 1
    #   ends); every rank saves a full checkpoint at the next step boundary, the job requeues and resumes there.
    full, lora, titan, lora_stop = jobs["full_resumed"], jobs["lora_resumed"], jobs["titan"], jobs["lora_stopped"]
    plan = {
        "full_resumed": (
            lambda: (full.run_dir / "epoch_0").is_dir() and _step_done(full, 5),
            lambda: slurm.run("scancel", "--signal=USR1", "--batch", full.job_id),
            "USR1",
        ),
        "lora_stopped": (
            lambda: _step_done(lora_stop, 2),
            lambda: slurm.run("scancel", "--signal=USR1", "--batch", lora_stop.job_id),
            "USR1",
        ),
        "lora_resumed": (
            lambda: (lora.run_dir / "recipe_state" / "recipe_state.pt").is_file() and _step_done(lora, 5),
            lambda: slurm.requeue(lora.job_id),
            "requeue",
        ),
        "titan": (
            lambda: any((titan.run_dir / "checkpoint").glob("step-*/.metadata")),
            lambda: slurm.requeue(titan.job_id),
            "requeue",
        ),
        **{
            key: (
                lambda job=jobs[key]: (
                    job.log.is_file() and "Training starts at step 1" in job.log.read_text("utf-8", "replace")
                ),
                lambda job=jobs[key]: slurm.run("scancel", "--signal=USR1", "--batch", job.job_id),
                "USR1 stop-save",
            )
            for key in ("titan_stop", "flux_stop")
        },
    }
    # no fixed deadline (a loaded machine stretches every job): only 10 minutes in which no log grows fails
    started = last_change = time.monotonic()
    sizes = log_sizes(j.log for j in jobs.values())
    # interrupted, not yet released: released without blocking the other jobs' turns, a few seconds after the requeue
    # (started at once, slurmd may still hold the previous start's credential revoked: "Killing non-startable batch
    # job: Job credential revoked", and the job ends FAILED)
    releasing: set[str] = set()
    pending_since: dict[str, float] = {}
    while len(interruptions) < len(plan) or releasing:
        now = time.monotonic()
        if (grown := log_sizes(j.log for j in jobs.values())) != sizes:
            sizes, last_change = grown, now
        assert now - last_change < 600 and now - started < OUTER_LIMIT_S, (
            f"no job's log grew for {now - last_change:.0f} s; interrupted so far: {interruptions}, releasing "
            f"{releasing}, waiting for {sorted(set(plan) - set(interruptions))}"
        )
        for key, (ready, interrupt, how) in plan.items():
            if key not in interruptions and ready():
                interrupt()
                interruptions[key] = how
                releasing.add(key)
        for key in sorted(releasing):
            if key not in pending_since and _requeued(slurm, jobs[key]):
                pending_since[key] = time.monotonic()
            if key in pending_since and time.monotonic() - pending_since[key] > REQUEUE_SETTLE_S:
                slurm.run("scontrol", "update", f"JobId={jobs[key].job_id}", "StartTime=now")
                releasing.discard(key)
        time.sleep(0.2)

    for job in jobs.values():
        info = wait_done(slurm, job.job_id, job.log)
        assert info.state == "COMPLETED", f"{job.name}: {info.state}\n{job.explain()}"
    return jobs, interruptions


def _submit_copied_scripts(slurm: SlurmClient, root: Path, tiny, recipes: tuple[str, ...]) -> dict[str, Job]:
    """sbatch copies of slurm-recipes/torchtitan/RECIPE.local-cpu.sbatch from a checkout-like folder.

    The scripts find the venv and the tiny assets at ../../.venv and ../../.cache/tiny (symlinked here)."""
    import shutil
    import subprocess
    import sys

    checkout = root / "checkout"
    (checkout / ".cache").mkdir(parents=True)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (checkout / ".cache" / "tiny").symlink_to(tiny.root)
    folder = checkout / "slurm-recipes" / "torchtitan"
    recipes_root = Path(__file__).resolve().parents[2] / "slurm-recipes"
    shutil.copytree(recipes_root / "torchtitan", folder)
    shutil.copytree(recipes_root / "cookbook_runtime", folder.parent / "cookbook_runtime")  # beside it, as shipped
    jobs = {}  # no folder to create first: the log goes where sbatch runs
    for recipe in recipes:
        script, name = folder / f"{recipe}.local-cpu.sbatch", f"{recipe}-local-cpu".replace("_", "-")
        # as the README says: sbatch from the script's folder ($SLURM_SUBMIT_DIR is where sbatch ran, which
        # --chdir does not change, and the scripts find their configs through it)
        r = subprocess.run(
            ["sbatch", "--parsable", script.name], cwd=folder, env=slurm.env, capture_output=True, text=True, check=True
        )
        job_id = r.stdout.strip().split(";")[0]
        jobs[f"copied {recipe}"] = Job(
            job_id,
            script,
            folder / f"{name}-{job_id}.out",
            folder / "runs" / name,
            recipe,
            "local-cpu",
            name,
            client=slurm,
        )
    return jobs


def _step_done(job: Job, step: int) -> bool:
    """torchtune's DiskLogger (flushed every step) has the step. (Its progress bar in the job's log is not a
    clock: srun relays whole lines, and the bar ends its updates with \\r, so they arrive with the next \\n.)"""
    return any(f"Step {step} |" in p.read_text(errors="replace") for p in job.run_dir.glob("logs/log_*.txt"))


def _traces(job: Job) -> list[Path]:
    """Both ranks' traces, exactly where the profiling overrides said they would be."""
    from cookbook.profiling.enable import schedule
    from cookbook.recipes import get_recipe

    iteration = f"iteration_{schedule(**PROFILE).trace_iteration}"
    folder = job.run_dir / get_recipe("llama3_8b_c4").trace_subdir / iteration
    return [folder / f"rank{rank}_trace.json.gz" for rank in (0, 1)]


def _tensorboard_steps(job: Job) -> set[int]:
    """Steps logged to TensorBoard (every tb/<minute>/ folder: a requeued run may start a new one)."""
    from cookbook.metrics import parse_log

    folders = sorted({p.parent for p in job.run_dir.rglob("events.out.tfevents.*")})
    assert folders, "TensorBoard event files"
    steps: set[int] = set()
    for folder in folders:
        df = parse_log(folder)
        assert df["loss"].map(math.isfinite).all()
        steps |= {int(s) for s in df["step"]}
    return steps


def _losses(job: Job) -> list[float]:
    df = job.metrics()
    df = df[df.get("split", "train") == "train"] if "split" in df else df
    return df.sort_values("step")["loss"].tolist()


def test_torchtune_full_finetune_trains_checkpoints_and_the_output_loads(runs):
    jobs, _ = runs
    job = jobs["full"]
    losses = _losses(job)
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0]
    final = job.run_dir / "epoch_1"
    assert (final / "model-00001-of-00001.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.num_hidden_layers == 2
    log = job.log.read_text()
    assert re.search(rf"^job {job.job_id}: 2 node\(s\) \[n\[1-2\]\]", log, flags=re.M)
    # save_every_n_steps: a complete step_N folder (the line comes after its rename from .step_N.partial) at steps
    # 3 and 6, one per epoch of 4 steps; each epoch's checkpoint then supersedes it and removes it
    saved = re.findall(r"cookbook: checkpoint at step (\d+) \(epoch (\d+)\): (\S+)", log)
    assert [(int(s), int(e)) for s, e, _ in saved] == [(3, 1), (6, 2)], log[-3000:]
    assert [Path(p).name for _, _, p in saved] == ["step_3", "step_6"]
    assert {Path(p).parent.resolve() for _, _, p in saved} == {job.run_dir.resolve()}
    assert not list(job.run_dir.glob("step_*")) and not list(job.run_dir.glob(".step_*"))


def test_torchtune_lora_writes_an_adapter_that_loads(runs, tiny_assets):
    import json

    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import load_file
    from torchtune import config as tt_config
    from torchtune.models.convert_weights import hf_to_tune

    jobs, _ = runs
    job = jobs["lora"]
    assert re.search(rf"^job {job.job_id}: 2 node\(s\)", job.log.read_text(), flags=re.M)
    losses = _losses(job)
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    out = job.run_dir / "epoch_1"
    weights = load_file(out / "adapter_model.safetensors")  # PEFT layout, for Hugging Face users
    assert weights and all("lora" in k for k in weights), list(weights)[:5]
    # The adapter loads, strictly, into the recipe's own LoRA model on top of the base weights it was
    # trained from, and changes what the model computes.
    cfg = OmegaConf.load(next(job.script.parent.glob("*.yaml")))
    model = tt_config.instantiate(OmegaConf.create(OmegaConf.to_container(cfg.model)))
    base_dir = tiny_assets.root / "llama3"
    hf = json.loads((base_dir / "config.json").read_text())
    base = hf_to_tune(
        load_file(next(base_dir.glob("*.safetensors"))),
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        dim=hf["hidden_size"],
    )
    adapter = torch.load(out / "adapter_model.pt", weights_only=True)
    model.load_state_dict({**base, **adapter}, strict=True)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == cfg.model.lora_rank
    tokens = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        tuned = model(tokens)
        model.load_state_dict({**base, **{k: torch.zeros_like(v) for k, v in adapter.items()}}, strict=True)
        assert (tuned - model(tokens)).abs().max() > 1e-3


def _tune_steps(segment: str) -> set[int]:
    """Steps torchtune's progress bar (rank 0) reports done in one start of the job."""
    return {int(s) for s in re.findall(r"\|(\d+)\|Loss", segment)}


def _stopped_and_resumed(job: Job) -> tuple[int, set[int], set[int]]:
    """A USR1 stop: the step saved at, and the steps trained before and after the requeue (checked: the stop
    was saved, the resume started from that checkpoint)."""
    first, second = _segments(job.log)[:2]
    assert first.startswith(f"job {job.job_id}:") and second.startswith(f"job {job.job_id}:")
    assert "cookbook: got USR1" in first
    saved = re.search(r"cookbook: saved at step (\d+) for preemption: (\S+)", first)
    assert saved, first[-3000:]
    step, path = int(saved.group(1)), saved.group(2)
    assert f"resuming from {path}" in second, second[:3000]
    if "/step_" in path:  # mid-epoch: the recipe subclass restored the data position and the step
        assert f"cookbook: resumed at step {step} " in second
    before, after = _tune_steps(first), _tune_steps(second)
    assert max(before) == step and after == set(range(step + 1, 2 * TUNE_STEPS_PER_EPOCH + 1)), (before, after)
    return step, before, after


def test_a_finished_torchtune_run_submitted_again_says_so_and_does_nothing(runs, slurm):
    """Problem 12 of issue #29: torchtune alone would train again from step 1 and overwrite epoch_0."""
    from cookbook.render import log_dir_of
    from cookbook.slurm.client import read_output

    jobs, _ = runs
    job = jobs["lora"]
    outputs = {p: p.stat().st_mtime_ns for p in job.run_dir.glob("epoch_*/*")}
    again = slurm.submit(job.script, cwd=job.script.parent)
    info = slurm.wait(again, timeout=300)
    folder = log_dir_of(job.script) or job.script.parent
    log = read_output(next((job.script.parent / folder).glob(f"*-{again}.out")))
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
    assert re.search(rf"cookbook: the run in \S+ is complete \(job {job.job_id} finished it", log), log[-3000:]
    assert "nothing to do" in log and "Step 1 |" not in log and "launching" not in log
    assert outputs and {p: p.stat().st_mtime_ns for p in job.run_dir.glob("epoch_*/*")} == outputs


def test_preempted_torchtune_full_job_saves_mid_epoch_and_resumes_at_that_step_with_the_same_final_loss(runs):
    jobs, interruptions = runs
    assert interruptions["full_resumed"] == "USR1"
    job, reference = jobs["full_resumed"], jobs["full"]
    step, before, after = _stopped_and_resumed(job)
    assert TUNE_STEPS_PER_EPOCH < step < 2 * TUNE_STEPS_PER_EPOCH  # USR1 after step 5: inside the last epoch
    redone = before & after
    print(f"torchtune full: stopped at step {step}, steps redone {len(redone)} (epoch resume: {step - 4})")
    assert len(redone) <= 1
    assert _losses(job)[-1] == pytest.approx(_losses(reference)[-1], rel=1e-6)
    assert not list(job.run_dir.glob("step_*")), "the final epoch's checkpoint supersedes the step checkpoint"
    from cookbook.analysis.preemption import preemption_report  # notebook 02's cell

    report = preemption_report(job.log)
    assert f"USR1: saved at step {step}" in report and f"steps redone after a resume: {len(redone)}" in report, report


def test_preempted_torchtune_lora_job_saves_mid_epoch_and_resumes_at_that_step_with_the_same_final_loss(runs):
    jobs, interruptions = runs
    assert interruptions["lora_stopped"] == "USR1"
    job, reference = jobs["lora_stopped"], jobs["lora"]
    step, before, after = _stopped_and_resumed(job)
    # USR1 after step 2; the tiny LoRA steps take ~0.3 s, so the stop lands a few steps later, in either epoch,
    # before the run ends (a stop at step 5 resumes "at step 5 (epoch 2, 1 of 4 steps done in it)")
    assert 2 <= step < 2 * TUNE_STEPS_PER_EPOCH
    redone = before & after
    print(f"torchtune LoRA: stopped at step {step}, steps redone {len(redone)} (epoch resume: {step})")
    assert len(redone) <= 1
    assert _losses(job)[-1] == pytest.approx(_losses(reference)[-1], rel=1e-6)
    assert (job.run_dir / "epoch_1" / "adapter_model.safetensors").is_file()


def test_requeued_lora_job_resumes_its_adapter_with_the_same_final_loss(runs):
    jobs, interruptions = runs
    assert interruptions["lora_resumed"] == "requeue"
    job, reference = jobs["lora_resumed"], jobs["lora"]
    first, second = _segments(job.log)[:2]
    resumed = second.split("resuming from ")[1].split()[0]
    # the requeue's SIGTERM reaches the ranks (KillWait): they save at their next step boundary if they can,
    # else the job resumes from its epoch checkpoint
    saved = re.search(r"cookbook: saved at step (\d+) for preemption: (\S+)", first)
    assert resumed == (saved.group(2) if saved else str(job.run_dir / "epoch_0")), resumed
    after = _tune_steps(second)
    assert min(after) == (int(saved.group(1)) + 1 if saved else 5) and max(after) == 8, after
    assert _losses(job)[-1] == pytest.approx(_losses(reference)[-1], rel=1e-6)
    assert (job.run_dir / "epoch_1" / "adapter_model.safetensors").is_file()


def test_torchtitan_llama3_c4_requeued_mid_run_resumes_without_losing_a_step(runs):
    jobs, interruptions = runs
    job = jobs["titan"]
    assert interruptions["titan"] == "requeue"
    segments = _segments(job.log)
    assert len(segments) >= 2
    resumed_from = int(re.search(r"resuming from .*step-(\d+)", segments[-1]).group(1))
    # both ranks print every step (no rank prefix; two nodes' output may interleave): each step after the
    # checkpoint exactly twice, none before it
    steps_after = sorted(int(s) for s in re.findall(r"step:\s+(\d+)\s+loss", segments[-1]))
    assert steps_after == [s for s in range(resumed_from + 1, TITAN_STEPS + 1) for _rank in (0, 1)], resumed_from
    steps_before = {int(s) for s in re.findall(r"step:\s+(\d+)\s+loss", segments[0])}
    assert set(range(1, resumed_from + 1)) <= steps_before, "every step up to the checkpoint ran once before"
    df = job.metrics()
    train = df[df["split"] == "train"] if "split" in df else df
    assert sorted(train["step"]) == list(range(1, TITAN_STEPS + 1))
    assert train["loss"].map(math.isfinite).all()
    assert (job.run_dir / "checkpoint" / f"step-{TITAN_STEPS}").is_dir() or any(
        (job.run_dir / "checkpoint").glob("step-*")
    )
    assert all(seg.startswith(f"job {job.job_id}:") for seg in segments), "the same job id ran again"
    assert all(t.is_file() and t.stat().st_size > 0 for t in _traces(job)), _traces(job)
    assert _tensorboard_steps(job) == set(range(1, TITAN_STEPS + 1))


def test_torchtitan_flux_runs_with_checkpoints_profiling_and_tensorboard(runs):
    jobs, _ = runs
    job = jobs["flux"]
    df = job.metrics()
    train = df[df["split"] == "train"] if "split" in df else df
    assert sorted(train["step"]) == [1, 2, 3, 4]
    assert train["loss"].map(math.isfinite).all()
    assert any((job.run_dir / "checkpoint").glob("step-*/.metadata")), "no complete checkpoint"
    assert all(t.is_file() and t.stat().st_size > 0 for t in _traces(job)), _traces(job)
    assert _tensorboard_steps(job) == {1, 2, 3, 4}


def test_the_copy_paste_scripts_run_side_by_side_on_their_own_rendezvous_ports(runs):
    jobs, _ = runs
    copied = [job for key, job in jobs.items() if key.startswith("copied ")]
    ports = {re.search(r"rendezvous \S+:(\d+)", job.log.read_text()).group(1) for job in copied}
    assert len(copied) == 2 and len(ports) == 2, ports
    for job in copied:
        df = job.metrics()
        train = df[df["split"] == "train"] if "split" in df else df
        assert sorted(train["step"]) == [1, 2, 3, 4] and train["loss"].map(math.isfinite).all(), job.name
        assert (job.run_dir / "checkpoint" / "step-4" / ".metadata").is_file(), job.name


SAVED = re.compile(r"cookbook: saved at step (\d+) for preemption: (\S+)")
TITAN_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([\d.]+)")


def _titan_losses(segment: str) -> dict[int, float]:
    """``{step: loss}`` of torchtitan's step lines (both ranks print them, with the same global loss)."""
    return {int(s): float(v) for s, v in TITAN_STEP.findall(segment)}


@pytest.mark.parametrize(("key", "reference"), [("titan_stop", "copied llama3_8b_c4"), ("flux_stop", "flux")])
def test_torchtitan_saves_on_usr1_at_the_step_boundary_and_resumes_there(runs, key, reference):
    """llama3 and FLUX: the stop-save is a full checkpoint at the step the ranks agreed on (periodic ones
    are off), the job requeues, the resume redoes no step and ends at the uninterrupted run's loss."""
    jobs, interruptions = runs
    job = jobs[key]
    assert interruptions[key] == "USR1 stop-save"
    segments = _segments(job.log)
    assert len(segments) == 2, segments[-1][-3000:]
    first, second = segments
    saved = SAVED.search(first)
    assert saved, first[-3000:]
    step = int(saved.group(1))
    assert "cookbook: got USR1" in first and f"cookbook: requeueing job {job.job_id}" in first
    assert "Saving a full checkpoint at last step, step" in first  # not torchtitan's model-only last save
    assert Path(saved.group(2)) == job.run_dir / "checkpoint" / f"step-{step}"
    before, after = _titan_losses(first), _titan_losses(second)
    assert max(before) == step and 1 <= step < 4, "the ranks stopped at the step they saved"
    assert re.search(rf"Loading the checkpoint from \S*/step-{step}\.", second), second[-3000:]
    assert sorted(after) == list(range(step + 1, 5))
    redone = len(set(before) & set(after))
    assert redone <= 1
    # the same run as the uninterrupted one: every step after the resume has its loss (data position, RNG)
    expected = _titan_losses(_segments(jobs[reference].log)[-1])
    for s in after:
        assert after[s] == pytest.approx(expected[s], rel=1e-5), (s, after, expected)
    print(f"{key}: saved at step {step}, steps redone after the resume: {redone}")


def test_the_use_jobs_generate_evaluate_merge_and_sample_from_the_trained_runs(runs, slurm, tiny_assets, tmp_path):
    """The *_use recipes (rendered and submitted like training) on this module's finished runs: base vs
    fine-tuned generations and held-out loss for the full and the LoRA fine-tune, the LoRA merge loaded by
    transformers, FLUX images sampled from the torchtitan checkpoint; `cookbook outputs` on each run."""
    from cookbook.use.outputs import describe
    from cookbook.use.report import UseResult, image_grid, loads_with_transformers

    jobs, _ = runs

    def use(recipe: str, name: str, overrides: dict[str, str]) -> Job:
        spec = job_spec(
            recipe, profile="local-cpu", nodes=1, job_name=name, overrides=overrides, assets_dir=str(tiny_assets.root)
        )
        return submit(spec, root=tmp_path, client=slurm)

    used = {
        "lora": use(
            "llama3_3_70b_lora_use",
            "use-lora",
            {"trained": str(jobs["lora"].run_dir), "merge": "$RUN_DIR/merged", "rows": "3"},
        ),
        "full": use("llama3_3_70b_full_use", "use-full", {"trained": str(jobs["full"].run_dir), "rows": "3"}),
        "flux": use("flux_schnell_use", "use-flux", {"dump_folder": str(jobs["flux"].run_dir)}),
    }
    for job in used.values():
        info = wait_done(slurm, job.job_id, job.log)
        assert info.state == "COMPLETED", f"{job.name}: {info.state}\n{job.explain()}"
    for kind in ("lora", "full"):
        result = UseResult.load(used[kind].run_dir)
        assert result.data["kind"] == kind and result.data["checkpoint"].endswith("epoch_1")
        gens = result.generations()
        assert len(gens) == 3 and (gens["base"] != gens["fine-tuned"]).any(), gens
        assert all(gens["prompt"].str.len() > 0) and all(gens["reference"].str.len() > 0)
        h = result.heldout()
        assert h.loc["fine-tuned", "held-out loss"] < h.loc["base", "held-out loss"], h
        assert "held-out train[90%:]" in used[kind].log.read_text()
    merged = UseResult.load(used["lora"].run_dir).merged
    assert merged is not None and "transformers loads it as LlamaForCausalLM" in loads_with_transformers(merged)
    log = used["flux"].log.read_text()
    assert f"Loading the checkpoint from {jobs['flux'].run_dir}/checkpoint/step-4" in log
    image_grid(used["flux"].run_dir)
    assert len(list((used["flux"].run_dir / "images").glob("image_prompt*_rank0.png"))) == 8
    assert (used["flux"].run_dir / "images" / "grid.png").is_file()
    assert describe(jobs["lora"].script.parent).kind == "lora" and describe(jobs["full"].run_dir).kind == "full"
    assert describe(jobs["flux"].run_dir).kind == "dcp"
