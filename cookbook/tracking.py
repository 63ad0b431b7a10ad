"""Experiment tracking (``JobSpec.tracker``): what every framework shares.

The script's tracker block (template ``tracker.sh.j2``) names the tracker run ``<job name>-<first job id>`` and
exports it as ``COOKBOOK_RUN_NAME`` (with ``COOKBOOK_TRACKER``; ``COOKBOOK_TB_DIR`` for TensorBoard): a
requeued job keeps its id, a resubmission into the same run folder reads the first one back from
``$RUN_DIR/.first_job_id``, so every start logs into the same tracker run. W&B gets it as ``WANDB_RUN_ID``
with ``WANDB_RESUME=allow``, MLflow as the run ``MLFLOW_RUN_ID`` names (created once, its id kept in the run
folder). Keys and credentials are read on the node from the trackers' own files (``~/.netrc``,
``~/.mlflow/credentials``; Slurm is given no secret, see ``cookbook.slurm.client.without_secrets``): nothing
secret is written into the script, its arguments or its configs. How each framework is told to log lives in
its recipe module (torchtune's ``metric_logger``, torchtitan's ``metrics.*``, the FSDP script's ``--tracker``);
the script recipe's program reads the variables above itself.
"""

from __future__ import annotations

import importlib.util

from cookbook.spec import JobSpec
from cookbook.templating import render_template

#: the package each tracker needs where the job runs (checked here, before submission) and how to get it
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow-skinny (the client; a local file store needs no server)"),
}
#: W&B project / MLflow experiment unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME say otherwise
DEFAULT_PROJECT = "cookbook"
#: script variables the tracker block sets, usable in recipe arguments (``$COOKBOOK_TB_DIR``)
VARIABLES = ("COOKBOOK_RUN_NAME", "COOKBOOK_TB_DIR")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (a module blocked with ``sys.modules[name] = None`` cannot)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def tracker_problems(spec: JobSpec) -> list[str]:
    """The tracker's package missing here: one line naming the install (checked before anything is submitted)."""
    if spec.tracker not in PACKAGES:
        return []
    module, install = PACKAGES[spec.tracker]
    if installed(module):
        return []
    return [f"tracker {spec.tracker}: the {module} package is not installed ({install}), or use --tracker none"]


def tracker_block(spec: JobSpec, wandb_runs: str) -> str:
    """The script's tracker block ('' for ``none``); ``wandb_runs``: the bash glob of the framework's offline
    W&B runs (``Recipe.wandb_offline_runs``), printed as the ``wandb sync`` command."""
    if spec.tracker in ("", "none"):
        return ""
    return render_template(
        "tracker.sh.j2", tracker=spec.tracker, project=DEFAULT_PROJECT, wandb_runs=wandb_runs
    ).rstrip()
