"""The job runtime's load on the shared filesystem and the gate's time per start (issue #41 items 5 and 6).

    python benchmarks/runtime_files.py [--out out/benchmarks] [--runtime DIR] [--parts files,gate]

Real parts: the batch step (``cookbook_runtime.run``), the gate (``nodecheck``, torch on CPU, gloo), the launcher,
torchrun and the ranks (a tiny loop calling the hang watch at each step), all of this machine; only Slurm is the
unit tests' stand-in (``tests/unit/batch_step.py``'s ``FakeSlurm``, ``FAKE_SRUN=nodes``): each "node" is one
process tree here with its own ``SLURMD_NODENAME``, started side by side.

``files``: one start (gate + training, ~6 s of steps, the hang watch polling every second) of 1 node x 2 ranks,
2 x 2 and 2 x 4 under ``strace -f -e trace=%file``: the files the start left in RUN_DIR (an audit before/after),
the create calls (``open*`` with ``O_CREAT``, ``mkdir``) and the stat calls (``*stat*``, ``access``) on paths in
RUN_DIR, and the stats of ``HANG`` and of the gate's ``<node>.probe`` files. Each count is fitted as ``a + b x nodes
+ c x ranks`` over the three starts and extrapolated to 1,000 nodes x 8 ranks (before c30d63d the probes' stats grew
as nodes x ranks, every gate rank looking for every node's, which the fit cannot see: the README counts them apart;
since, local rank 0 lists the folder once a node and the count is 0).
``--runtime`` runs another copy of the runtime (``git archive``'s) for a before/after.

``gate``: ``--gate-jobs`` jobs, each started twice in one RUN_DIR (2 nodes x ``--gate-procs`` processes):
the first start runs the whole gate, the restart within the window only the nodes' own checks (``--local-only``);
the seconds each took (``gate-passes.tsv``), the CPU seconds of the gate's processes (``/usr/bin/time`` before
each node's command), and their medians.

A table on stdout, everything in ``OUT/runtime_files.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from batch_step import RUNTIME_ROOT, FakeSlurm  # noqa: E402  (the unit tests' fake Slurm)

TRAIN = """
import os, time
from cookbook_runtime import hang
for step in range(1, 7):
    time.sleep(1.0)
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    hang.step(step)
"""
TIMER = ("/usr/bin/time", "-a", "-o", "{}/cpu.txt", "-f", "%C|%e %U %S")  # each node's process: wall, CPU s
CONFIGS = ((1, 2), (2, 2), (2, 4))  # (nodes, ranks per node)
STAT = re.compile(r"^\d+\s+(?:stat|lstat|fstatat64|newfstatat|statx|access|faccessat2?)\(")
CREATE = re.compile(r"^\d+\s+(?:open|openat|creat|mkdir|mkdirat)\(.*(?:O_CREAT|mkdir)")


def files_in(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def start(folder: Path, nodes: int, procs: int, runtime: Path, *, strace: bool, **env: str) -> Any:
    """One start of job ``SLURM_JOB_ID`` (env) on ``nodes`` fake nodes; the batch step's output and the strace log."""
    slurm = FakeSlurm(folder) if not (folder / "bin").exists() else _reuse(folder)
    train = folder / "train.py"
    train.write_text(textwrap.dedent(TRAIN))
    names = ",".join(f"n{i + 1}" for i in range(nodes))
    environ = slurm.env(SLURM_JOB_NODELIST=names, SLURM_JOB_NUM_NODES=str(nodes), FAKE_SRUN="nodes",
                        FAKE_GATE="real", PYTHONPATH=str(runtime), COOKBOOK_HANG_POLL_S="1", OMP_NUM_THREADS="1",
                        COOKBOOK_TELEMETRY_S="10", FAKE_NODE_PREFIX="\t".join(TIMER).format(folder), **env)  # fmt: skip
    argv = ["--gate", f"--nproc-per-node={procs}", "--gate-allreduce-mb=4", f"--port={29600 + os.getpid() % 300}",
            "--", "torchrun", str(train)]  # fmt: skip
    log = folder / "strace.log"
    trace = ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(log)] if strace else []
    done = subprocess.run([*trace, sys.executable, "-m", "cookbook_runtime.run", *argv], env=environ, cwd=folder,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"the start failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return slurm, log


def _reuse(folder: Path) -> FakeSlurm:
    slurm = FakeSlurm.__new__(FakeSlurm)
    slurm.folder, slurm.bin, slurm.calls, slurm.run_dir = folder, folder / "bin", folder / "calls.jsonl", folder / "run"
    return slurm


def count(log: Path, run_dir: Path) -> dict[str, int]:
    """Create and stat calls on paths in ``run_dir``, and stats of ``HANG``, in an strace log."""
    where = f'"{run_dir}'
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if where in ln and "resumed>" not in ln]
    return {
        "creates": sum(1 for ln in lines if CREATE.match(ln)),
        "stats": sum(1 for ln in lines if STAT.match(ln)),
        "hang_stats": sum(1 for ln in lines if STAT.match(ln) and '/HANG"' in ln),
        "probe_stats": sum(1 for ln in lines if STAT.match(ln) and '.probe"' in ln),
    }


def fit(rows: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``key = a + b x nodes + c x ranks`` through the three starts (exact: 3 equations)."""
    a, b, c = np.linalg.solve([[1, r["nodes"], r["ranks"]] for r in rows], [r[key] for r in rows])
    return float(a), float(b), float(c)


def files_part(out: Path, runtime: Path) -> dict[str, Any]:
    rows = []
    for nodes, procs in CONFIGS:
        folder = out / f"files-{nodes}x{procs}"
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        folder.mkdir(parents=True)
        before = files_in(folder / "run")
        began = time.time()
        slurm, log = start(folder, nodes, procs, runtime, strace=True, SLURM_JOB_ID="41")
        left = sorted(files_in(slurm.run_dir) - before)
        row = {"nodes": nodes, "ranks": nodes * procs, "seconds": round(time.time() - began, 1), "files": len(left),
               **count(log, slurm.run_dir), "left": left}  # fmt: skip
        rows.append(row)
        print(f"{nodes} node(s) x {procs}: {row['files']} files, {row['creates']} creates, {row['stats']} stats "
              f"({row['hang_stats']} of HANG) in {row['seconds']} s", flush=True)  # fmt: skip
    at = {"nodes": 1000, "ranks": 8000}
    extrapolated = {}
    for key in ("files", "creates", "stats", "hang_stats", "probe_stats"):
        a, b, c = fit(rows, key)
        extrapolated[key] = {"a": round(a, 2), "per_node": round(b, 2), "per_rank": round(c, 2),
                             "at_1000x8": round(a + b * at["nodes"] + c * at["ranks"])}  # fmt: skip
    return {"starts": rows, "fit": extrapolated}


def gate_part(out: Path, runtime: Path, jobs: int, procs: int) -> list[dict[str, Any]]:
    rows = []
    for job in (str(51 + i) for i in range(jobs)):
        folder = out / f"gate-{job}"
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        folder.mkdir(parents=True)
        cpu = []  # each start's gate processes: CPU seconds (user + system) of every node's together
        for restart in ("0", "1"):
            slurm, _ = start(folder, 2, procs, runtime, strace=False, SLURM_JOB_ID=job, SLURM_RESTART_COUNT=restart)
            lines = (folder / "cpu.txt").read_text().splitlines()  # "COMMAND|wall user system" a node and step
            times = [[float(x) for x in ln.rpartition("|")[2].split()] for ln in lines if "nodecheck" in ln]
            cpu.append(round(sum(u + s for _, u, s in times), 1))
            (folder / "cpu.txt").unlink()
        passes = (slurm.run_dir / ".cookbook" / "gate-passes.tsv").read_text().splitlines()
        for line, cpu_s in zip(passes, cpu):
            _, job_id, nodes, seconds, mode = line.split("\t")[:5]
            rows.append({"job": job_id, "nodes": nodes, "procs": procs, "seconds": float(seconds), "mode": mode,
                         "cpu_s": cpu_s})  # fmt: skip
            print(f"job {job_id}: gate {mode} {float(seconds):.1f} s, {cpu_s} CPU-s", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "out" / "benchmarks")
    p.add_argument("--runtime", type=Path, default=RUNTIME_ROOT, help="the folder holding cookbook_runtime/")
    p.add_argument("--parts", default="files,gate")
    p.add_argument("--gate-jobs", type=int, default=3, help="jobs of the gate part, each started twice")
    p.add_argument("--gate-procs", type=int, default=4, help="the gate part's processes per node (GPU nodes: 8)")
    args = p.parse_args()
    out = args.out.resolve() / "runtime_files"
    result: dict[str, Any] = {"runtime": str(args.runtime)}
    if "files" in args.parts:
        result["files"] = files_part(out, args.runtime.resolve())
        for key, f in result["files"]["fit"].items():
            print(f"{key}: {f['a']} + {f['per_node']} x nodes + {f['per_rank']} x ranks -> {f['at_1000x8']} at "
                  "1,000 x 8")  # fmt: skip
    if "gate" in args.parts:
        result["gate"] = gate_part(out, args.runtime.resolve(), args.gate_jobs, args.gate_procs)
        for mode in ("full", "local"):
            took = sorted(r["seconds"] for r in result["gate"] if r["mode"] == mode)
            cpu = sorted(r["cpu_s"] for r in result["gate"] if r["mode"] == mode)
            print(f"gate {mode}: median {statistics.median(took):.1f} s of {took}, "
                  f"{statistics.median(cpu):.1f} CPU-s of {cpu}")  # fmt: skip
    (args.out / "runtime_files.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
