"""Source of the walkthrough notebooks: `python notebooks/build_notebooks.py` writes every .ipynb here.

Edit the notebooks HERE (diff-friendly), then regenerate; a test fails when the committed .ipynb
files drift from this source or carry outputs. Each notebook: prose first, one step per code cell,
every step a call into the `cookbook` package, a `parameters` cell (papermill) whose defaults are the
real recipe on a real cluster. The embedded local cluster runs the same notebooks with
`profile="local-cpu"` and tiny models (see cookbook/notebook_runner.py: LOCAL_PARAMETERS).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
Cell = tuple[str, str]          # ("md" | "code" | "params", source)


def md(text: str) -> Cell:
    return ("md", text.strip("\n"))


def code(text: str) -> Cell:
    return ("code", text.strip("\n"))


def params(text: str) -> Cell:
    return ("params", text.strip("\n"))


# ----------------------------------------------------------------------------------------- shared
CLUSTER_PARAMS = '''
# Parameters (papermill). Defaults: the real recipe on a real GPU cluster.
# On the embedded local cluster: profile="local-cpu", gpus_per_node=0 (tiny model, CPU).
profile = "generic"          # cluster profile: generic, nebius, crusoe, aws-efa, local-cpu
nodes = 2                    # written once; torchrun reads $SLURM_JOB_NUM_NODES
gpus_per_node = 8
partition = None             # None: the cluster's default partition
time_limit = "04:00:00"
container_image = None       # e.g. "nvcr.io#nvidia/pytorch:25.01-py3" (pyxis/enroot)
overrides = {}               # recipe config keys, e.g. {"batch_size": 2}
gpu = "H100"                 # GPU kind, for the planner's estimate
run_root = "runs"            # each submission gets its own folder here
'''

SETUP_IMPORTS = code('''
from cookbook import walkthrough as wt
from cookbook.widgets import JobMonitor
''')


def check_cells(what: str) -> list[Cell]:
    return [
        md(f'''
## Check the job before it queues

`check_job` runs every rule of the recipe engine ({what}) and then asks Slurm whether the
partition has the nodes and GPUs the job wants. A wrong job stops **here**, in seconds, with what to
change, instead of failing after an hour in the queue. On a machine without GPU nodes the real
defaults stop here too, with the parameters to use instead.
'''),
        code("wt.check_job(spec)"),
        md('''
## Rehearse it on the cluster

`rehearse_job` submits the job's own script to the same nodes, with the launcher swapped for a check
that runs on every node for about a minute: GPUs and CPUs the launcher gets, the rendezvous address
reachable from every node, every file the job reads present (model, tokenizer, dataset), the config
parsed by the framework's own parser, the network interface NCCL is told to use. One table row per
node; a node that cannot run the job stops the notebook with what to change (`cookbook rehearse
job.sbatch` does the same from a terminal).
'''),
        code("wt.rehearse_job(spec, run_root)"),
    ]


def run_cells(monitor_note: str = "") -> list[Cell]:
    return [
        md('''
## Look at the script

The job renders into its own folder: the sbatch script (node count written once, head-node address
resolved robustly, every value shell-quoted, no secrets) and its config next to it. This is the same
file `cookbook render` writes; nothing is hidden in the notebook.
'''),
        code('''
job = wt.submit(spec, run_root)
print(job.script.read_text())
'''),
        md(f'''
## Watch it train

The monitor follows the job's log live: Slurm state, progress and ETA, loss and throughput plotted as
they arrive, the log's last lines and, if something goes wrong, a diagnosis with what to do (NCCL
timeout, out of memory, rendezvous failure, gated model...). *Cancel job* calls `scancel`. {monitor_note}
'''),
        code("JobMonitor(job)"),
        md('''
`job.wait()` blocks until the job ends and prints progress meanwhile. If the job does not end
`COMPLETED`, it stops the notebook with the diagnosis from the log.
'''),
        code("job.wait()"),
    ]


def metrics_cells(look: str) -> list[Cell]:
    return [
        md('''
## The run's metrics

`job.metrics()` turns the log into a table, one row per step (`cookbook metrics LOG` does the same on
the command line). The plot shows the raw loss (faint), its smoothed curve and the throughput.
'''),
        code("metrics = job.metrics()\nmetrics.tail()"),
        code("job.plot()"),
        code("print(wt.run_summary(metrics))"),
        md("## What to look at\n\n" + look.strip("\n")),
    ]


# ----------------------------------------------------------------------------------------- 00
NB00 = [
    md('''
# 0. Set up: is this cluster ready to train?

Before any training job, check the environment once: the Python stack, Slurm, the partition's nodes
and GPUs, the shared filesystem, and the Hugging Face token. Then get the model onto the shared
filesystem (or, on the embedded local cluster, build the tiny stand-in models).

This notebook runs on the cluster's **login node**: `make lab` starts JupyterLab there and prints the
`ssh -N -L` command for your laptop.
'''),
    params('''
# Parameters (papermill). Defaults: a real GPU cluster and the Llama-3.3-70B model.
profile = "generic"                         # generic, nebius, crusoe, aws-efa, local-cpu
partition = None                            # None: the cluster's default partition
probe = True                                # submit a tiny probe job to every node of the partition
model_repo = "meta-llama/Llama-3.3-70B-Instruct"
model_dir = None                            # None: models/<name> beside run folders (shared storage)
download = False                            # True: download now (about 140 GB for 70B)
'''),
    SETUP_IMPORTS,
    md('''
## Check the environment

This is `cookbook doctor --probe`: versions (torch, torchtune, torchtitan and torchao must be a
combination known to work), Slurm reachable, partition and GPUs per node, and a probe job on every
node that looks for GPUs, NCCL/EFA libraries, the shared folder and free disk. The HF token is only
reported as present or absent, never shown.

A failed check stops the notebook with what to do.
'''),
    md('''
The model must live on storage **every node** mounts (`/tmp` is node-local everywhere). With
`model_dir=None` it goes to `models/<name>` beside the `runs/` folder, which is where your jobs write
checkpoints too; the probe below checks that every node sees that folder.
'''),
    code("model_dir = model_dir or wt.default_model_dir(model_repo)\nprint(model_dir)"),
    code("checks = wt.setup_checks(profile, partition, probe=probe, model_dir=model_dir)"),
    md('''
## Get the model

Gated models (Llama) need your HF token with access granted on the model's page. The download skips
Meta's duplicate `original/consolidated*` shards, resumes when re-run, and writes
`original_repo_id.json` as torchtune expects. With `download=False` this only lists what it would
fetch. On the local cluster it builds the tiny assets instead (seconds, cached).
'''),
    code("model = wt.prepare_model(profile, model_repo, model_dir, download=download)\nmodel"),
    md('''
## What to look at

- Every line of the table should be PASS; WARN lines say what is unusual (e.g. a CPU-only partition).
- The probe's per-node lines: the same GPU count on every node, NCCL found, the shared folder seen
  from every node. A node that does not see the shared folder will fail a multi-node job later.
- Next: `01_plug_in_your_dataset` to check your data, then a training notebook.
'''),
]

# ----------------------------------------------------------------------------------------- 01
NB01 = [
    md('''
# 1. Plug in your dataset, and check it with the model's real tokenizer

The seeds say "the tokenizer's vocabulary and special tokens must match your model and dataset" in
bold, and leave it to you. Here we check it: the rows are read and validated (a bad row is named,
not skipped), every sample is tokenized by torchtune's own dataset builder with the model's own
tokenizer, and you see how long the samples are, how many are truncated, how well they pack, and
whether tokenizer and model agree. Then the dataset goes into the recipe as overrides, and a short
run proves it trains.
'''),
    params('''
# Parameters (papermill). Defaults: the seeds' example dataset with Llama-3.3-70B.
profile = "generic"
model_dir = None                                           # the downloaded model (00_setup); None: its default
dataset = "NewEden/xlam-function-calling-60k-shareGPT"     # a Hub name or a local .json/.jsonl/.csv/.parquet
style = "sharegpt"                                         # sharegpt, openai, alpaca, instruct, text
column_map = {}                                            # e.g. {"conversations": "dialog"}
max_seq_len = 2048
recipe = "llama3_3_70b_lora"                               # the recipe to plug the dataset into
nodes = 2
gpus_per_node = 8
partition = None
time_limit = "04:00:00"
container_image = None                                     # e.g. "nvcr.io#nvidia/pytorch:25.01-py3" (pyxis/enroot)
overrides = {"max_steps_per_epoch": 20}                    # a short proof run; {} trains the full recipe
run_root = "runs"
'''),
    SETUP_IMPORTS,
    md('''
## Check the dataset

`check_dataset` reads the rows (from the Hub or your file), checks each one for the style (roles,
empty messages, missing columns, broken JSON lines), then builds the dataset exactly as the recipe's
`dataset:` block would and tokenizes a sample. Problems stop here with the row number.
'''),
    code("model_dir = wt.model_dir_for(recipe, model_dir, run_root)   # where 00_setup put the model\n"
         "report = wt.check_dataset(dataset, style, model_dir, column_map=column_map, max_seq_len=max_seq_len)\n"
         "print(report.render())"),
    md('''
## How long are the samples?

Samples longer than `max_seq_len` are truncated (the end of the answer is lost). If many are, raise
`max_seq_len` (memory grows with it) or filter them out. Many short samples waste compute on padding:
packing (`dataset.packed=True`) fills each sequence with several samples.
'''),
    code("report.plot()"),
    md('''
## Put it into the recipe

These overrides replace the recipe's `dataset:` block. They are plain `key=value` pairs: the same ones
work with `cookbook render RECIPE --set KEY=VALUE` and in the job builder.
'''),
    code("data_overrides = wt.dataset_overrides(dataset, style, column_map, max_seq_len=max_seq_len)\n"
         "data_overrides"),
    md('''
## Train on it, briefly

A short run with the dataset plugged in: `overrides` (a parameter) keeps it to a few steps per epoch
(`max_steps_per_epoch`); set it to `{}` for the full recipe. On the local cluster it is the tiny model.
'''),
    code('''
spec = wt.job_spec(recipe, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                   time=time_limit, container_image=container_image,
                   overrides={**wt.model_overrides(recipe, model_dir, profile), **data_overrides, **overrides})
wt.check_job(spec)
'''),
    code('''
job = wt.submit(spec, run_root)
JobMonitor(job)
'''),
    code("job.wait()"),
    code("job.plot()"),
    md('''
## What to look at

- **truncated**: a few percent is fine; a large share means the model never sees the ends of answers.
- **vocab**: must say `ok`. A mismatch means the tokenizer is not the model's: special tokens would
  map to the wrong embeddings and the loss would look fine while the model learns garbage.
- **packed sequences**: with packing, steps per epoch drop roughly by the packing factor.
- The run's loss should go down from its first steps; a flat or rising loss with this dataset (and not
  with the recipe's default one) points at the data: roles, masking (`train_on_input`), or truncation.
'''),
]

# ----------------------------------------------------------------------------------------- 02 / 03
MODEL_PARAM = 'model_dir = None   # the downloaded model (00_setup); None: models/<name> beside run_root\n'


def torchtune_notebook(number: int, title: str, recipe: str, intro: str, look: str) -> list[Cell]:
    return [
        md(f"# {number}. {title}\n\n" + intro.strip("\n")),
        params(CLUSTER_PARAMS.strip("\n") + "\n" + MODEL_PARAM),
        SETUP_IMPORTS,
        md(f'''
## Describe the job

One spec holds everything Slurm and the recipe need. The model overrides point **both** the
checkpointer and the tokenizer at your download (`checkpointer.checkpoint_dir`, `tokenizer.path`):
the seeds' top-level `checkpoint_dir=` is silently ignored by the 70B configs, and the job then dies
an hour later looking for `/tmp/Llama-3.3-70B-Instruct/config.json`.
'''),
        code(f'''
RECIPE = "{recipe}"
spec = wt.job_spec(RECIPE, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                   time=time_limit, container_image=container_image,
                   overrides={{**wt.model_overrides(RECIPE, model_dir, profile, run_root), **overrides}})
spec
'''),
        md('''
## Will it fit?

The planner estimates memory per GPU and throughput from the model's shape and the recipe's settings,
before you spend GPU hours finding out.
'''),
        code("print(wt.plan_for(spec, gpu))"),
        *check_cells("override keys must exist in torchtune's real config, tensor-parallel degree must "
                     "divide GPUs per node, batch sizes sane, model paths present"),
        *run_cells(),
        *metrics_cells(look),
    ]


NB02 = torchtune_notebook(
    2, "Llama-3.3-70B full finetune on 2 nodes x 8 GPUs (torchtune)", "llama3_3_70b_full", '''
Full finetuning updates all 70 billion parameters. torchtune's `full_finetune_distributed` recipe
shards parameters, gradients and optimizer state over all GPUs of both nodes (FSDP2), so each GPU
holds 1/16th of them. This notebook replaces the Nebius walkthrough: same recipe, same built-in config
(`llama3_3/70B_full_multinode`), but the job is checked before it queues and watched while it runs.

Steps: describe the job, estimate its memory, check it, submit, watch, read the metrics.
''', '''
- **Loss**: the smoothed curve should fall over the first few hundred steps. Spikes that do not
  recover usually mean a learning rate too high for the batch size.
- **tokens/s/GPU**: steady after warm-up. Around 850-900 tokens/s/GPU is what 2 x 8 H100 reach on this
  recipe; much less points at the network (check NCCL picked InfiniBand: `NCCL_DEBUG=INFO`).
- **Checkpoint**: `job.outputs()` lists `epoch_N/` with the model in Hugging Face format. A requeued
  job (preemption, node failure) resumes from the newest one.
''')

NB03 = torchtune_notebook(
    3, "Llama-3.3-70B LoRA finetune (torchtune)", "llama3_3_70b_lora", '''
LoRA freezes the 70B base weights and trains small low-rank adapters next to the attention and MLP
projections: a fraction of a percent of the parameters, so optimizer state and gradients almost
vanish and the run needs far less memory than a full finetune. The output is an adapter of a few
hundred MB, not a new 140 GB model.

Steps: describe the job, estimate its memory, check it, submit, watch, read the metrics. To compare
LoRA ranks, see `07_sweep_lora_rank`, which runs this notebook once per rank.
''', '''
- **Loss**: LoRA loss falls more slowly than a full finetune's at the same learning rate; LoRA
  usually wants a higher one (torchtune's default 3e-4).
- **tokens/s/GPU**: higher than the full finetune's (no optimizer step over 70B parameters).
- **Adapter**: `job.outputs()` lists `epoch_N/adapter_model.safetensors` and `adapter_config.json`;
  load it with PEFT on top of the base model, or merge it.
''') + [code("job.outputs()")]

# ----------------------------------------------------------------------------------------- 04
NB04 = [
    md('''
# 4. FLUX.1-schnell training (torchtitan)

FLUX is a 12B-parameter diffusion transformer for images. torchtitan trains it with FSDP2 (the
Nebius seed uses HSDP: shards inside a node, replicas across nodes). The text encoders (T5, CLIP) and
the autoencoder are frozen and only encode the data; the transformer learns to denoise.

torchtitan prints `tflops: 0.00 mfu: 0.00%` for FLUX (its FLOP counter for FLUX is a TODO upstream);
the cookbook computes them from the model's shape and your GPU kind: `cookbook metrics LOG --gpu h100
--model flux_schnell` in a terminal, or `cookbook.metrics.add_derived` in Python.
'''),
    params(CLUSTER_PARAMS),
    SETUP_IMPORTS,
    md('''
## Describe the job

The recipe is torchtitan's `flux_schnell` config with checkpointing on. Overrides are torchtitan's own
`section.key` fields, e.g. `{"training.steps": 1000, "training.local_batch_size": 32}`.
'''),
    code('''
RECIPE = "flux_schnell"
spec = wt.job_spec(RECIPE, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                   time=time_limit, container_image=container_image, overrides=overrides)
spec
'''),
    code("print(wt.plan_for(spec, gpu))"),
    *check_cells("every override is parsed by torchtitan's own config parser, parallel degrees must "
                 "fit the GPUs, batch sizes must divide"),
    *run_cells(),
    *metrics_cells('''
- **Loss**: diffusion loss is noisy by nature (each step samples new noise levels); read the smoothed
  curve, and expect a slow decline rather than the steep drop of language-model finetuning.
- **Throughput**: torchtitan logs tokens per second (image latents are patchified into tokens). The
  Nebius seed reaches about 1.5M tps on 2 x 8 H100.
- **Memory**: torchtitan prints the peak reserved memory per GPU; close to 100% means the next bigger
  batch will not fit.
'''),
]

# ----------------------------------------------------------------------------------------- 05
NB05 = [
    md('''
# 5. Profiling a multi-node run: capture, collect, read

The seeds say: turn the profiler on, find `iteration_N`, copy a few ranks' `.pt.trace.json.gz` by hand,
start TensorBoard, port-forward. Traces are often too large for TensorBoard, and nobody says what to
look at. Here: the profiler is switched on with safe defaults (a couple of steps, after warm-up), the
traces of every rank are found and copied into one view folder, and a summary is read from the traces
themselves: step time, where the time goes (compute, communication, idle) per rank, the slowest rank,
and the top operators.
'''),
    params(CLUSTER_PARAMS.strip("\n") + "\n" + MODEL_PARAM),
    SETUP_IMPORTS,
    md('''
## Describe a job with profiling on

The LoRA recipe with the profiler enabled: one warm-up step, then two traced steps. Tracing is
cheap for these few steps, and the trace files stay small.
'''),
    code('''
RECIPE = "llama3_3_70b_lora"
spec = wt.job_spec(RECIPE, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                   time=time_limit, container_image=container_image,
                   overrides={**wt.model_overrides(RECIPE, model_dir, profile, run_root), **wt.profiling_overrides(RECIPE, profile),
                              **overrides})
{k: v for k, v in spec.overrides.items() if k.startswith("profiler")}
'''),
    *check_cells("the profiler keys must exist in torchtune's config"),
    *run_cells(),
    md('''
## Collect the traces

torchtune names the traces of every rank alike (`r0-...`); they are told apart by their content and
copied into one folder as `rank{R}_iter{N}.pt.trace.json.gz`, with their sizes.
'''),
    code('''
from cookbook.profiling.collect import collect

view_dir = job.script.parent / "profile-view"
collected = collect(job.run_dir, view_dir)
collected
'''),
    md('''
## Read them

Per rank: mean and worst step time and the share of compute, communication and idle time. The
slowest rank sets the pace of every collective; the rank that waits least on communication is the one
the others wait for.
'''),
    code('''
from cookbook.profiling.summarize import plot_summary, summarize

summary = summarize(sorted(view_dir.glob("*.pt.trace.json*")))
print(summary.render())
'''),
    code("plot_summary(summary)"),
    md('''
## View them yourself

TensorBoard's profiler plugin needs the internet for its charts, so open a trace in Perfetto instead
(it stays in your browser). The command below copies the view folder to your laptop.
'''),
    code('''
from cookbook.profiling.view import viewing_instructions

print(viewing_instructions(view_dir))
'''),
    *metrics_cells('''
- **Step time per rank**: ranks within a few percent of each other are healthy; one slow rank (a bad
  node, a throttled GPU) slows every rank down.
- **Communication share**: high exposed communication on GPUs means the network is the bottleneck
  (check that NCCL uses InfiniBand/EFA, not TCP sockets). On the CPU cluster the gloo collectives are
  visible the same way.
- **Top operators**: on GPUs, the matmuls (`aten::mm`, attention kernels) should dominate; if copies,
  `cudaStreamSynchronize` or the optimizer lead, fix those first.
'''),
]

# ----------------------------------------------------------------------------------------- 06
NB06 = [
    md('''
# 6. Llama-3.1-8B pretraining on C4 (torchtitan)

torchtitan is PyTorch's reference for large-scale pretraining: FSDP2, tensor/pipeline/context
parallelism, `torch.compile` and float8, composed from one config. This is the Crusoe / AWS seed's
job: Llama-3.1-8B from scratch on the C4 dataset, 2 nodes x 8 GPUs.

torchtitan 0.3.0 configures jobs with Python functions (no TOML any more); the cookbook's recipe
passes `--module cookbook_titan --config llama3_8b_c4`, and overrides are torchtitan's own fields
(the seeds' TOML keys map one to one: `[training] steps` is `training.steps`).
'''),
    params(CLUSTER_PARAMS),
    SETUP_IMPORTS,
    md('''
## Describe the job

Useful overrides: `training.steps`, `training.local_batch_size`, `parallelism.tensor_parallel_degree`
(must divide the GPUs per node), `compile.enable`, `checkpoint.interval`.
'''),
    code('''
RECIPE = "llama3_8b_c4"
spec = wt.job_spec(RECIPE, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                   time=time_limit, container_image=container_image, overrides=overrides)
spec
'''),
    code("print(wt.plan_for(spec, gpu))"),
    *check_cells("every override is parsed by torchtitan's own config parser; parallel degrees must "
                 "fit the world size"),
    *run_cells(),
    *metrics_cells('''
- **Loss**: pretraining from scratch starts near ln(vocabulary size) (about 11.8 for Llama 3's 128K
  vocabulary) and falls fast during the first few hundred steps.
- **tps and MFU**: torchtitan prints both per GPU. For 8B on H100, 5,700-6,700 tokens/s/GPU and
  33-40% MFU without float8 are typical; Crusoe reports ~51% MFU on 2 nodes with tuning.
- **Memory %**: torchtitan's peak reserved memory per GPU; room left means a larger
  `training.local_batch_size` (or less activation checkpointing) can buy throughput.
'''),
    md('''
## Where did the GPU-hours go?

The goodput ledger splits the run's allocation (every start of the job, requeues included) into queue
wait, start-up, productive steps, steps redone after a resume, checkpoint saves and failures, with
GPU-hours, cost and the planner's forecast (`cookbook goodput RUN` on the command line).
'''),
    code("from cookbook.analysis import explain_summary, goodput_summary\n\n"
         "gpu_kind = None if profile == \"local-cpu\" else gpu.lower()\n"
         "ledger, ledger_fig = goodput_summary(job, gpu=gpu_kind)\nledger"),
    md('''
## Why is MFU what it is?

`explain` compares the measured MFU with the planner's expectation for the same shape and ranks the
evidence by its likely cost, each with the fix: NCCL on TCP sockets where InfiniBand/EFA was expected,
a straggler rank, data-loader stalls, CPU binding, activation checkpointing heavier than needed
(`cookbook explain RUN`).
'''),
    code("evidence, evidence_fig = explain_summary(job, gpu=gpu_kind)\nevidence"),
    md('''
On the local cluster most of the allocation is start-up (tiny models train in seconds); on a real run the
productive share should dominate. A large "redone" part means checkpoints are too far apart for how often
the job is preempted; evidence at the top of the table is where the next hour of tuning pays most.
'''),
]

# ----------------------------------------------------------------------------------------- 07
NB07 = [
    md('''
# 7. Compare LoRA ranks with a papermill sweep

A notebook with a `parameters` cell is a function: papermill runs it with other parameter values and
keeps each executed copy. Here `03_llama3_3_70b_lora` runs once per LoRA rank (each run its own job
and folder), and the runs' metrics are overlaid on one plot.
'''),
    params('''
# Parameters (papermill). Defaults: a real GPU cluster.
ranks = [8, 16, 64]          # LoRA ranks to compare (model.lora_rank); alpha is kept at 2 x rank
base_parameters = {}         # parameters passed to every run, e.g. {"profile": "nebius"}
out_dir = "sweeps/lora_rank"
parallel = 2                 # runs executed at the same time
'''),
    code("from cookbook import notebook_runner as nr"),
    md('''
## Run the sweep

Each run is a full execution of notebook 03 with `overrides={"model.lora_rank": R, "model.lora_alpha": 2R}`.
A run that stops (a failed check, a failed job) is reported, not hidden.
'''),
    code('''
runs = {f"rank {r}": {"model.lora_rank": r, "model.lora_alpha": 2 * r} for r in ranks}
sweep = nr.sweep("03_llama3_3_70b_lora.ipynb", runs, out_dir=out_dir, base_parameters=base_parameters,
                 parallel=parallel)
sweep.table()
'''),
    md("## Compare the runs"),
    code("sweep.plot()"),
    md('''
## What to look at

- **Loss**: a higher rank gives the adapter more capacity; if rank 64 is no better than rank 8, the
  smaller adapter is the better choice (less memory, faster, smaller file).
- **Throughput**: it drops only a little with rank: the adapters are tiny next to the frozen model.
- Every executed notebook is kept under `out_dir`, so any run can be opened and read in full.
'''),
]

# ----------------------------------------------------------------------------------------- 08
NB08 = [
    md('''
# 8. Build, submit and watch any job with widgets

The same recipe engine as the other notebooks, behind a form. Pick a recipe, the cluster profile,
nodes and GPUs, partition, time limit, container and overrides: every change is validated at once
and the problems are listed with what to change (a tensor-parallel degree that does not divide the
GPUs, an override key the config does not have, GPUs on a CPU profile...). *Render* shows the sbatch
script; *Submit* checks the job against the cluster, submits it and opens a live monitor below it:
state, progress and ETA, loss and throughput as they are logged, the log's last lines, a diagnosis
when something fails, and a cancel button.
'''),
    params('''
# Parameters (papermill): the builder's starting values. Defaults: a real GPU cluster.
recipe = "llama3_3_70b_lora"
profile = "generic"          # generic, nebius, crusoe, aws-efa, local-cpu
nodes = 2
gpus_per_node = 8
partition = None
time_limit = "04:00:00"
overrides = {}
run_root = "runs"
'''),
    SETUP_IMPORTS,
    code("from cookbook.widgets import JobBuilder"),
    md('''
## Can this cluster run the starting job?

The form starts from the parameters above; this checks them against the cluster once (the form
checks the recipe rules live, and the cluster again when you press *Submit*).
'''),
    code('''
wt.check_job(wt.job_spec(recipe, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
                         time=time_limit, overrides=overrides))
'''),
    md('''
## The job builder

Change a value and watch the status line; press *Render* to read the script, *Submit* to run it.
'''),
    code('''
builder = JobBuilder(recipe, profile=profile, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition or "",
                     time=time_limit, overrides=overrides, run_root=run_root)
builder
'''),
    md('''
## What to look at

- The status line under the form: the job is submittable only when it says **valid**.
- After *Submit*: the monitor's state goes PENDING, RUNNING, COMPLETED; the loss plot fills in as
  steps are logged; on a failure the diagnosis names it (out of memory, NCCL timeout, missing
  checkpoint...) and the log tail shows the lines around it.
- `builder.job` is the submitted job: `builder.job.metrics()`, `builder.job.plot()` work as in the
  other notebooks.
'''),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "00_setup": NB00,
    "01_plug_in_your_dataset": NB01,
    "02_llama3_3_70b_full_finetune": NB02,
    "03_llama3_3_70b_lora": NB03,
    "04_flux_schnell_pretraining": NB04,
    "05_profiling": NB05,
    "06_llama3_8b_c4_torchtitan": NB06,
    "07_sweep_lora_rank": NB07,
    "08_job_builder": NB08,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (no outputs, parameters cell tagged)."""
    cells = []
    for kind, src in NOTEBOOKS[name]:
        if kind == "md":
            cells.append(new_markdown_cell(src))
        else:
            cell = new_code_cell(src)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
        "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):        # stable ids: regenerating gives identical files
        cell["id"] = f"{name[:2]}-{i:02d}"
    return nb


def text(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def write_all(folder: Path = HERE) -> list[Path]:
    paths = []
    for name in NOTEBOOKS:
        path = folder / f"{name}.ipynb"
        path.write_text(text(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
