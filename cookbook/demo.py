"""``python -m cookbook.demo`` (``make demo``): the whole walkthrough on the embedded local cluster.

1. starts the local Slurm cluster (2 nodes) unless it is up;
2. builds the tiny assets (a Llama-3-architecture model, tokenizers, datasets, FLUX encoders);
3. runs every notebook (00-08) with papermill (profile ``local-cpu``: tiny models, real training loops, real
   Slurm jobs), 07 being the LoRA-rank sweep as one Slurm array compared on one plot;
4. writes the executed notebooks and the plots under ``out/demo/`` and prints where they are and how
   to open JupyterLab (``make lab``) through an SSH tunnel.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cookbook.paths import output_dir

if TYPE_CHECKING:
    from cookbook.local.assets.tiny import TinyAssets


def _step(n: int, total: int, text: str) -> float:
    print(f"[{n}/{total}] {text}", flush=True)
    return time.monotonic()


def _done(t0: float, detail: str = "") -> None:
    print(f"      done in {time.monotonic() - t0:.0f} s{': ' + detail if detail else ''}", flush=True)


def _keep_previous(out: Path) -> None:
    """Move the last demo's outputs to ``OUT.previous`` (replacing an older one), so this run's folder
    holds only this run's notebooks, runs and plots."""
    import shutil

    if out.exists():
        previous = out.with_name(out.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)


Result = tuple[str, str, float]  # (step, "ok: ..." or what went wrong, seconds)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``--out``, ``--notebooks``, ``--no-sweep``."""
    from cookbook import notebook_runner as nr

    ap = argparse.ArgumentParser(prog="python -m cookbook.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="output folder (default: out/demo)")
    ap.add_argument(
        "--notebooks", nargs="*", default=list(nr.QUICKSTART), help="notebooks to run (default: all, 00-08)"
    )
    ap.add_argument("--no-sweep", action="store_true", help="skip the LoRA-rank sweep (notebook 07)")
    args = ap.parse_args(argv)
    if args.no_sweep:
        args.notebooks = [n for n in args.notebooks if nr.notebook_name(n) != "07_sweep_lora_rank"]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the demo's steps; 1 when a notebook stopped."""
    args = _parse_args(argv)
    out = Path(args.out) if args.out else output_dir() / "demo"
    _keep_previous(out)
    nb_out, plots = out / "notebooks", out / "plots"
    total = 3 + len(args.notebooks)
    env = _cluster_env(1, total)
    assets = _tiny_assets(2, total)
    results = [_run_notebook(3 + i, total, name, nb_out, plots, assets, env) for i, name in enumerate(args.notebooks)]
    n = 2 + len(args.notebooks)
    return _summary(n + 1, total, results, nb_out, plots)


def _cluster_env(n: int, total: int) -> dict[str, str]:
    """Start the local cluster unless it is up; its clients' environment."""
    t0 = _step(n, total, "local Slurm cluster (2 nodes, real slurmctld/slurmd)")
    from cookbook.local.cluster import LocalCluster

    cluster = LocalCluster()
    status = cluster.status()
    if not status.up:
        status = cluster.up()
    env = cluster.env()
    _done(t0, env.get("SLURM_CONF", ""))
    return env


def _tiny_assets(n: int, total: int) -> TinyAssets:
    """Build (or find) the tiny models, tokenizers and datasets."""
    t0 = _step(n, total, "tiny assets")
    from cookbook.local.assets.tiny import ensure_tiny_assets

    assets = ensure_tiny_assets()
    _done(t0, str(assets.root))
    return assets


def _run_notebook(
    n: int, total: int, name: str, nb_out: Path, plots: Path, assets: TinyAssets, env: dict[str, str]
) -> Result:
    """Run one notebook with papermill on the local profile, copying its plots; what came of it."""
    from cookbook import notebook_runner as nr

    t0 = _step(n, total, f"notebook {name} (papermill, profile local-cpu)")
    try:
        executed = nr.run_notebook(name, nb_out, nr.local_parameters(name, assets), env=env)
        copied = nr.executed_plots(executed, plots)
        result = (name, f"ok: {executed}" + (f" (+{len(copied)} plot)" if copied else ""), time.monotonic() - t0)
    except nr.NotebookStopped as e:
        result = (name, f"STOPPED at cell {e.cell}: {e.evalue.splitlines()[0]} ({e.path})", time.monotonic() - t0)
    print(f"      {result[1]} [{result[2]:.0f} s]", flush=True)
    return result


def _summary(n: int, total: int, results: list[Result], nb_out: Path, plots: Path) -> int:
    """Print each step's outcome and where the outputs are; 1 if any step did not end ok."""
    _step(n, total, "summary")
    width = max(len(r[0]) for r in results) if results else 10
    for name, what, secs in results:
        print(f"  {name:<{width}}  {secs:5.0f} s  {what}")
    print(f"\nExecuted notebooks: {nb_out}\nPlots:              {plots}")
    print(
        "\nOpen the notebooks in JupyterLab on this machine:\n"
        "  make lab            (prints the ssh line to run on your laptop and the URL with its one-time token)"
    )
    failed = [r for r in results if not r[1].startswith("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
