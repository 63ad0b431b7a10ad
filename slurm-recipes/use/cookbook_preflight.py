#!/usr/bin/env python3
"""The pre-flight gate every generated job runs on every node before training (``COOKBOOK_PREFLIGHT=0``
skips it). Shipped beside the scripts as ``cookbook_preflight.py``: standard library + torch, no cookbook
import, so compute nodes need no cookbook install.

``check`` runs under torchrun, one process per GPU on every node (on CPU one per node, started by srun
with ``--master``: no torchrun agent to start), and writes
``OUT/<node>.<local rank>.json``:

- GPUs visible and their count (local rank 0), each rank's GPU by a short bf16 matmul against a fraction
  of its dense peak (the pinned copy :data:`PEAK_BF16_TFLOPS` of ``cookbook/gpus.py``, checked by
  ``tests/unit/test_facts.py``), or on CPU a float32 matmul against an absolute floor;
- the profile's network interface (``NCCL_SOCKET_IFNAME`` syntax) and InfiniBand/EFA device present;
- the run folder writable, and shared (every node sees the files the others wrote);
- free space on the node-local disk;
- then, when no node failed so far, an all-reduce across all ranks against a bus-bandwidth floor
  (busbw = bytes x 2(n-1)/n / time, nccl-tests' definition).

``summarize`` runs in the batch shell: it prints one ``cookbook: pre-flight ...`` line per node and
writes the failing nodes (``node<TAB>reason`` lines) to ``--failed``. Exit 0: every node passed;
1: some nodes failed (exclude them); 3: the nodes are fine but the fabric is not (no node to blame).

Test injection: ``COOKBOOK_PREFLIGHT_INJECT=NODE:REASON`` adds a failure on that node only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

# Dense bf16 peak TFLOP/s per GPU, keyed by a lower-case substring of the device name, longest first:
# a pinned copy of cookbook.gpus.device_name_peaks("bf16") (this file runs standalone).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("a100-pcie-40gb", 312.0),
    ("a100-sxm4-40gb", 312.0),
    ("h100 96gb", 989.0),
    ("h100 pcie", 756.0),
    ("h100 nvl", 835.0),
    ("gb200", 2500.0),
    ("a100", 312.0),
    ("a800", 312.0),
    ("b200", 2250.0),
    ("h100", 989.0),
    ("h200", 989.0),
    ("h800", 989.0),
    ("l40s", 362.0),
    ("l4", 121.0),
)
FABRIC = "fabric"  # the "node" of a failure no single node is to blame for


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def peak_tflops(device_name: str) -> float | None:
    name = device_name.lower().removeprefix("nvidia").strip().replace("-", " ")
    return next((v for k, v in PEAK_BF16_TFLOPS if k.replace("-", " ") in name), None)


def interface_present(spec: str) -> str | None:
    """None when an interface matching ``spec`` (NCCL_SOCKET_IFNAME syntax) exists, else the problem."""
    names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    if not spec:
        return None
    if spec.startswith("^"):
        excluded = spec[1:].split(",")
        if any(not any(n.startswith(e) for e in excluded) for n in names):
            return None
        return f"no network interface outside {spec[1:]} (have {', '.join(names) or 'none'})"
    for want in spec.split(","):
        if (want.startswith("=") and want[1:] in names) or (
            not want.startswith("=") and any(n.startswith(want) for n in names)
        ):
            return None
    return f"network interface {spec} not present (have {', '.join(names) or 'none'})"


def fabric_device_problem() -> str | None:
    """The InfiniBand HCA (``NCCL_IB_HCA``) or EFA device (``FI_PROVIDER=efa``) the profile names, present."""
    have = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    hca = os.environ.get("NCCL_IB_HCA", "").lstrip("=^")
    if hca and not any(h.startswith(hca.split(",")[0].split(":")[0]) for h in have):
        return f"InfiniBand HCA {hca} not present under /sys/class/infiniband (have {', '.join(have) or 'none'})"
    if os.environ.get("FI_PROVIDER") == "efa" and not any(h.startswith(("efa", "rdmap")) for h in have):
        return "EFA device not present under /sys/class/infiniband"
    return None


def local_checks(args: argparse.Namespace, local_rank: int, out: Path) -> tuple[list[str], dict[str, Any]]:
    failures: list[str] = []
    measures: dict[str, Any] = {}
    if local_rank == 0:
        if args.gpus:
            import torch

            seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
            measures["gpus"] = seen
            if seen < args.gpus:
                failures.append(f"{seen} GPU(s) visible, the job needs {args.gpus}")
        if problem := interface_present(args.interface):
            failures.append(problem)
        if args.gpus and (problem := fabric_device_problem()):
            failures.append(problem)
        try:
            probe = out / f"{node_name()}.probe"
            probe.write_text(node_name())
            if probe.read_text() != node_name():
                failures.append(f"run folder {args.run_dir}: a file written there reads back differently")
            measures["run_dir"] = "writable"
        except OSError as e:
            failures.append(f"run folder {args.run_dir} not writable: {e.strerror or e}")
        try:
            disk = args.local_disk or "/tmp"
            free_gb = shutil.disk_usage(disk).free / 1e9
            measures["free_disk_gb"] = round(free_gb, 1)
            if free_gb < args.min_free_gb:
                failures.append(f"local disk {disk}: {free_gb:.1f} GB free < {args.min_free_gb:g} GB")
        except OSError as e:
            failures.append(f"local disk {args.local_disk}: {e.strerror or e}")
    failures += matmul_check(args, local_rank, measures)
    inject = os.environ.get("COOKBOOK_PREFLIGHT_INJECT", "")
    host, sep, reason = inject.partition(":")
    if sep and host == node_name() and local_rank == 0:
        failures.append(f"{reason} (injected by COOKBOOK_PREFLIGHT_INJECT)")
    return failures, measures


def matmul_check(args: argparse.Namespace, local_rank: int, measures: dict[str, Any]) -> list[str]:
    import torch

    if args.gpus:
        if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
            return [] if local_rank else ["no GPU for the matmul"]
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        n, dtype, reps = 8192, torch.bfloat16, 50  # ~0.1 s on an H100: long enough for its clocks
    else:
        device, n, dtype, reps = torch.device("cpu"), 256, torch.float32, 20
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    (a @ b).sum().item()  # warm-up (and the CUDA context)
    start = time.perf_counter()
    for _ in range(reps):
        c = a @ b
    float(c[0, 0].item())
    tflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
    measures["matmul_tflops"] = round(tflops, 4)
    floor = args.matmul_min_tflops
    what = f"{floor:g} TFLOP/s"
    if args.gpus and args.matmul_fraction:
        name = torch.cuda.get_device_name(device)
        peak = peak_tflops(name)
        measures["gpu"] = name
        if peak is None:
            return []  # an unknown kind: measured, not judged
        floor = args.matmul_fraction * peak
        what = f"{floor:.0f} TFLOP/s ({args.matmul_fraction:g} x the {peak:g} TFLOP/s bf16 peak of {name})"
    if floor and tflops < floor:
        where = f"GPU {local_rank}" if args.gpus else "CPU"
        return [f"matmul on {where}: {tflops:.4g} TFLOP/s < {what}"]
    return []


def collective(args: argparse.Namespace, failures: list[str], measures: dict[str, Any]) -> list[dict[str, Any]]:
    """Share every rank's local result; when all passed, time an all-reduce. Returns every rank's result."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ and args.master:  # one process per node, started by srun (CPU jobs)
        addr, _, port = args.master.rpartition(":")
        os.environ.update(
            RANK=os.environ["SLURM_PROCID"],
            WORLD_SIZE=os.environ["SLURM_NTASKS"],
            LOCAL_RANK="0",
            MASTER_ADDR=addr,
            MASTER_PORT=port,
        )
    if "RANK" not in os.environ:  # run by hand: this process is the whole world
        return []
    backend = "nccl" if args.gpus else "gloo"
    timeout = timedelta(seconds=args.timeout)
    kw: dict[str, Any] = {"device_id": torch.device("cuda", torch.cuda.current_device())} if args.gpus else {}
    dist.init_process_group(backend, timeout=timeout, **kw)
    small = dist.new_group(backend="gloo", timeout=timeout) if args.gpus else None
    mine = {"node": node_name(), "rank": dist.get_rank(), "failures": failures, "measures": measures}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine, group=small)
    nodes = {r["node"] for r in everyone}
    out = Path(args.out)
    unseen = sorted(n for n in nodes if not (out / f"{n}.probe").exists())
    if unseen and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        failures.append(f"run folder {args.run_dir} is not shared: files of {', '.join(unseen)} not visible here")
    if any(r["failures"] for r in everyone) or dist.get_world_size() < 2:
        return everyone
    device = torch.device("cuda", torch.cuda.current_device()) if args.gpus else torch.device("cpu")
    numel = (args.allreduce_mb * 2**20) // 4
    x = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(x)  # warm-up: connections
    if args.gpus:
        torch.cuda.synchronize()
    reps = 5
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    if args.gpus:
        torch.cuda.synchronize()
    dist.barrier(group=small)
    seconds = (time.perf_counter() - start) / reps
    n = dist.get_world_size()
    busbw = numel * 4 * 2 * (n - 1) / n / seconds / 1e9
    measures["allreduce_busbw_gbps"] = round(busbw, 3)
    if busbw < args.min_busbw:
        failures.append(
            f"all-reduce across {len(nodes)} node(s): bus bandwidth {busbw:.3g} GB/s < {args.min_busbw:g} GB/s"
        )
    return everyone


def check(args: argparse.Namespace) -> int:
    started = time.time()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    measures: dict[str, Any] = {}
    try:
        failures, measures = local_checks(args, local_rank, out)
        collective(args, failures, measures)
    except Exception as e:  # the verdict goes into the report; the job decides
        failures.append(f"pre-flight check crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    report = {
        "node": node_name(),
        "local_rank": local_rank,
        "failures": failures,
        "measures": measures,
        "seconds": round(time.time() - started, 1),
    }
    (out / f"{node_name()}.{local_rank}.json").write_text(json.dumps(report))
    return 0  # never fail the step: srun would stop the other nodes' checks


def summarize(args: argparse.Namespace) -> int:
    out = Path(args.out)
    failed: dict[str, list[str]] = {}
    fabric: list[str] = []
    for node in args.nodes.split():
        reports = []
        for rank in range(args.procs):
            path = out / f"{node}.{rank}.json"
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                failed.setdefault(node, []).append(f"no report from local rank {rank} (did not start or timed out)")
        problems = [f for r in reports for f in r["failures"]]
        fabric += [p for p in problems if p.startswith("all-reduce across")]
        problems = [p for p in problems if not p.startswith("all-reduce across")]
        if problems:
            failed.setdefault(node, []).extend(dict.fromkeys(problems))
        measures: dict[str, Any] = {}
        for r in reports:
            for key, value in r["measures"].items():
                if key == "matmul_tflops":  # the slowest GPU of the node
                    value = min(value, measures.get(key, value))
                measures[key] = value
        took = max((r["seconds"] for r in reports), default=0.0)
        if node not in failed:
            shown = ", ".join(f"{k} {v}" for k, v in measures.items())
            print(f"cookbook: pre-flight ok on {node} in {took:g} s: {shown}", flush=True)
    for node, problems in failed.items():
        print(f"cookbook: pre-flight failed on {node}: {'; '.join(problems)}", flush=True)
    if fabric and not failed:
        print(f"cookbook: pre-flight failed on {FABRIC}: {fabric[0]} (no single node to blame)", flush=True)
    Path(args.failed).write_text("".join(f"{n}\t{'; '.join(p)}\n" for n, p in failed.items()))
    if failed:
        return 1
    return 3 if fabric else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("check", help="run on every rank (under torchrun)")
    c.add_argument("--out", required=True)
    c.add_argument("--gpus", type=int, default=0, help="GPUs per node the job uses (0: CPU)")
    c.add_argument("--matmul-fraction", type=float, default=0.0, help="GPU: floor as a fraction of the peak")
    c.add_argument("--matmul-min-tflops", type=float, default=0.0, help="CPU: absolute floor")
    c.add_argument("--min-busbw", type=float, default=0.0, help="all-reduce bus bandwidth floor, GB/s")
    c.add_argument("--allreduce-mb", type=int, default=64)
    c.add_argument("--interface", default="")
    c.add_argument("--run-dir", default="")
    c.add_argument("--local-disk", default="/tmp")
    c.add_argument("--min-free-gb", type=float, default=0.0)
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--master", default="", help="ADDR:PORT of rank 0 when srun, not torchrun, starts the ranks")
    s = sub.add_parser("summarize", help="one line per node; failing nodes to --failed")
    s.add_argument("--out", required=True)
    s.add_argument("--nodes", required=True, help="the job's nodes, space-separated")
    s.add_argument("--procs", type=int, default=1, help="processes per node")
    s.add_argument("--failed", required=True)
    args = p.parse_args(argv)
    if args.mode == "summarize":
        return summarize(args)
    check(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the report is written: no interpreter teardown (process-group destructors abort at exit)


if __name__ == "__main__":
    sys.exit(main())
