"""One-line notebook cells: a table and a figure for a run's goodput ledger and its efficiency explanation.

table, fig = goodput_summary(job)        # job: a walkthrough.Job, a run folder, a log or a job id
table, fig = explain_summary(job, gpu="h100")
table, fig = node_summary(job)           # what each node's GPUs did: clocks, temperature, throttles, errors
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _target(run: Any) -> str:
    script = getattr(run, "script", None)  # a walkthrough.Job
    return str(Path(script).parent) if script is not None else str(run)


def goodput_summary(run: Any, gpu: str | None = None, price: float | None = None, echo: Any = print) -> tuple[Any, Any]:
    """The run's goodput ledger as (DataFrame, matplotlib Figure); prints the text summary with ``echo``."""
    from cookbook.analysis.goodput import resolve_run, run_ledger

    client = getattr(run, "client", None)
    ledger = run_ledger(resolve_run(_target(run), client=client), client, gpu=gpu, price=price)
    if echo:
        echo(ledger.render().split("\n")[0])
    return ledger.table(), ledger.plot()


def explain_summary(run: Any, gpu: str | None = None, echo: Any = print, **kwargs: Any) -> tuple[Any, Any]:
    """The run's efficiency explanation as (DataFrame of evidence, Figure); ``kwargs`` go to explain_log."""
    from cookbook.analysis.explain import expects_fabric, explain_log, explain_plot
    from cookbook.analysis.goodput import resolve_run
    from cookbook.analysis.stragglers import job_hosts
    from cookbook.metrics.telemetry import read_telemetry, telemetry_from_log

    client = getattr(run, "client", None)
    ref = resolve_run(_target(run), client=client)
    script = Path(_target(run)) / "job.sbatch"
    kwargs.setdefault("expects_fabric", expects_fabric(ref.profile, gpu is not None))
    kwargs.setdefault("hosts", job_hosts(ref.log, ref.job_id, client))
    kwargs.setdefault("telemetry", read_telemetry(ref.run_dir) if ref.run_dir else telemetry_from_log(ref.log))
    report = explain_log(
        ref.log,
        recipe=ref.recipe,
        gpu=gpu,
        nodes=ref.nodes,
        gpus_per_node=ref.gpus_per_node,
        script=script if script.exists() else None,
        procs_per_node=ref.gpus_per_node or None,
        **kwargs,
    )
    if echo:
        echo(report.render())
    return report.table(), explain_plot(report)


def node_summary(run: Any, echo: Any = print) -> tuple[Any, Any]:
    """Each node's GPUs over the run (the telemetry the runtime wrote beside the launchers) as (DataFrame of the
    GPU and NIC findings, Figure of SM clock and temperature per node and GPU); prints a line per node with
    ``echo``."""
    import pandas as pd

    from cookbook.analysis.goodput import resolve_run
    from cookbook.metrics.telemetry import findings, node_lines, plot_nodes, read_telemetry, telemetry_from_log

    ref = resolve_run(_target(run), client=getattr(run, "client", None))
    df = read_telemetry(ref.run_dir) if ref.run_dir else telemetry_from_log(ref.log)
    if echo:
        for line in node_lines(df) or ["no telemetry for this run (COOKBOOK_TELEMETRY_S=0, or an older runtime)"]:
            echo(line)
    table = pd.DataFrame([vars(f) for f in findings(df)], columns=["kind", "node", "device", "share", "finding", "fix"])
    return table, plot_nodes(df)
