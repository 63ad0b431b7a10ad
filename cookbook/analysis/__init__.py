"""Where the GPU-hours went and why a run is slow: goodput ledger, efficiency explainer, stragglers.

    ledger = goodput_ledger(log, slurm_attempts(client, job_id))   # cookbook goodput JOBID; Job.goodput()
    ledger.table(); ledger.plot()
    report = explain_log(log, recipe="llama3_8b_c4", gpu="h100", nodes=4)     # cookbook explain RUN
    stragglers(parse_starts(log, ranks="all"))      # parse_log + a `start` column: step times never span a requeue
    table, fig = goodput_summary(job); table, fig = explain_summary(job)    # one notebook cell each
    table, fig = node_summary(job)                  # each node's GPUs: clocks, temperature, throttles, XIDs, NICs

Each module imports pandas/matplotlib inside its functions, so ``import cookbook.analysis`` stays cheap.
"""

from cookbook.analysis.explain import Evidence, Explanation, explain_log
from cookbook.analysis.goodput import Attempt, Ledger, goodput_ledger, price_per_gpu_hour, slurm_attempts
from cookbook.analysis.report import explain_summary, goodput_summary, node_summary
from cookbook.analysis.starts import parse_starts
from cookbook.analysis.stragglers import Straggler, rank_step_times, stragglers

__all__ = [
    "Attempt",
    "Evidence",
    "Explanation",
    "Ledger",
    "Straggler",
    "explain_log",
    "explain_summary",
    "goodput_ledger",
    "goodput_summary",
    "node_summary",
    "parse_starts",
    "price_per_gpu_hour",
    "rank_step_times",
    "slurm_attempts",
    "stragglers",
]
