"""The node checks of the pre-flight gate (torch on the nodes; nothing of the cookbook).

``python3 -m cookbook_runtime.nodecheck check`` runs under torchrun, one process per GPU on every node (on CPU
one per node, started by srun with ``--master``: no torchrun agent to start). Each node writes one report,
``OUT/<node>.json``, once: its local rank 0 gathers its ranks' results from the node's own disk
(``$TMPDIR/cookbook-gate-*``, where each rank leaves them after its local checks and again after the network
part, so a network part that never ends still leaves them; on SIGTERM, as srun passes on the end of the
gate's budget, local rank 0 writes what it has):

- GPUs visible and their count (local rank 0), each rank's GPU by a bf16 matmul timed for at least a second
  after warm-up (clocks ramped), measured against its peers by the verdict and against a clearly-broken
  fraction of the dense peak (:mod:`cookbook_runtime.gpus`), or on CPU a float32 matmul against an absolute floor;
- the profile's network interface (``NCCL_SOCKET_IFNAME`` syntax) and InfiniBand/EFA device present;
- the run folder writable, and shared (every node sees the files the others wrote: one listing a node);
- free space on the node-local disk;
- then the network part, node pair by node pair (:func:`collective`): round 1 pairs every node once, round 2
  each suspect with a known-good node, each pair's all-reduce bounded by ``--timeout``, with NCCL's ring
  algorithm (``NCCL_ALGO=Ring`` unless set: a NIC-true figure; on 2 nodes the default algorithm can report more
  than the NICs carry and hide a dead NIC, NVIDIA/nccl-tests#196, #290), as nccl-tests' bus bandwidth.

:func:`read_reports` turns the files into :class:`cookbook_runtime.decide.NodeReport`; the verdict (who is to
blame) is :func:`cookbook_runtime.decide.gate_verdict`.

Test injection: ``COOKBOOK_PREFLIGHT_INJECT=NODE:REASON`` adds a failure on that node only.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from . import telemetry
from .decide import (
    NO_NET_PLUGIN,
    GateThresholds,
    GateVerdict,
    NodeReport,
    PairResult,
    devices_selected,
    first_pairs,
    gate_verdict,
    interface_matches,
    name_unshared,
    second_pairs,
)
from .gpus import known_peak
from .telemetry import node_name

BUSBW = "allreduce_busbw_gbps"  # a node's slowest pair, for the log


peak_tflops = known_peak


def interface_present(spec: str) -> str | None:
    """None when an interface matching ``spec`` (NCCL_SOCKET_IFNAME syntax) exists, else the problem."""
    names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    if not spec or any(interface_matches(spec, n) for n in names):
        return None
    if spec.startswith("^"):
        return f"no network interface outside {spec[1:]} (have {', '.join(names) or 'none'})"
    return f"network interface {spec} not present (have {', '.join(names) or 'none'})"


def fabric_device_problem() -> str | None:
    """The InfiniBand HCA (``NCCL_IB_HCA``) or EFA device (``FI_PROVIDER=efa``) the profile names, present."""
    from .probe import efa_devices, rdma_devices  # one reading of the devices: the rehearsal's, the probe's

    have = rdma_devices()
    hca = os.environ.get("NCCL_IB_HCA", "")
    if hca and not devices_selected(hca, have):
        return f"InfiniBand HCA {hca} not present under /sys/class/infiniband (have {', '.join(have) or 'none'})"
    if os.environ.get("FI_PROVIDER") == "efa" and not efa_devices():
        return "EFA device not present under /sys/class/infiniband"
    return None


PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib", "/usr/local/lib")


def nccl_net_plugin() -> str | None:
    """aws-ofi-nccl's NCCL plugin (``libnccl-net*.so``) on LD_LIBRARY_PATH, the usual install folders or the ld
    cache: the path, or None (NCCL then falls back to TCP sockets, quietly, at a fraction of EFA's bandwidth)."""
    for d in [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(PLUGIN_DIRS):
        found = sorted(n for n in (os.listdir(d) if os.path.isdir(d) else []) if n.startswith("libnccl-net"))
        if found:
            return os.path.join(d, found[0])
    cache = subprocess.run(["sh", "-c", "ldconfig -p 2>/dev/null"], capture_output=True, text=True).stdout
    return next((ln.split("=>")[-1].strip() for ln in cache.splitlines() if "libnccl-net" in ln), None)


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
        if args.gpus and os.environ.get("FI_PROVIDER") == "efa":
            measures["nccl_net_plugin"] = plugin = nccl_net_plugin()
            if plugin is None:
                failures.append(
                    f"{NO_NET_PLUGIN} (libnccl-net*.so) not found on LD_LIBRARY_PATH, in "
                    "/opt/amazon/ofi-nccl/lib or the ld cache: NCCL would fall back to sockets, not EFA"
                )
        failures += telemetry.gpu_faults()  # NVML where it is: an XID, ECC errors, a hardware slowdown
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
    if not args.local_only:
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
        n, dtype, seconds = 8192, torch.bfloat16, args.matmul_seconds
    else:
        device, n, dtype, seconds = torch.device("cpu"), 256, torch.float32, min(args.matmul_seconds, 0.2)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = a @ b
    float(c[0, 0].item())  # warm-up (and the CUDA context)
    tflops = _timed_matmul(a, b, seconds / 4)  # clocks ramp up: this quarter is not counted
    tflops = _timed_matmul(a, b, seconds)
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


def _timed_matmul(a: Any, b: Any, seconds: float) -> float:
    """TFLOP/s of back-to-back ``a @ b`` over at least ``seconds`` (batches of 10, synchronised at the end)."""
    n = a.shape[0]
    reps, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            c = a @ b
        reps += 10
        float(c[0, 0].item())
        took = time.perf_counter() - start
        if took >= seconds:
            return float(2 * n**3 * reps / took / 1e12)


def collective(args: argparse.Namespace, failures: list[str], measures: dict[str, Any]) -> None:
    """The network part, node pair by node pair: round 1 pairs every node once (:func:`.decide.first_pairs`),
    round 2 each suspect with a known-good node (:func:`.decide.second_pairs`); in each round every pair at once,
    local rank i of one node with local rank i of its partner (a rail each). Rank 0 reads each rank's own result
    and round 1's figures from the store and writes each node's partner: no group spans every rank (gloo
    connects lazily, NCCL without a device binds nothing), so the network part takes two rounds at any size."""
    import torch.distributed as dist

    if not _in_a_world(args):  # run by hand: this process is the whole world
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node, local = divmod(rank, nproc)
    nccl_log = Path(tempfile.gettempdir()) / f"cookbook-gate-nccl.{os.getpid()}.log"
    store = _join(args, rank, world, nccl_log)
    store.set(f"ok/{rank}", "0" if [f for f in failures if not f.startswith(NO_NET_PLUGIN)] else "1")
    if local == 0:
        store.set(f"name/{node}", node_name())
    limits = GateThresholds(busbw_peer_ratio=args.busbw_peer_ratio, busbw_floor_gbps=args.min_busbw)
    if rank == 0:
        names = _first_round(store, world // nproc, nproc, args.timeout)
    names = {int(i): x for i, x in json.loads(_get(store, "joined", 2 * args.timeout)).items()}
    if local == 0:
        _shared_check(args, names.values(), failures, measures)
    pairs = measures.setdefault("pairs", [])
    for round_ in (1, 2):
        if rank == 0 and round_ == 2:
            _second_round(store, names, nproc, limits, 2 * args.timeout)
        partner = int(_get(store, f"plan{round_}/{node}", 5 * args.timeout))  # round 2's: 1 pair + 2 x, at most
        # one group a round on every rank, alone when unpaired: torch names a group by the groups made before it
        group = dist.new_group(sorted({rank, partner * nproc + local if partner >= 0 else rank}),
                               timeout=timedelta(seconds=args.timeout), use_local_synchronization=True)  # fmt: skip
        if partner >= 0:
            gbps = _pair_allreduce(args, group)
            pairs.append({"round": round_, "partner": names[partner], "gbps": gbps})
            if node < partner:
                store.set(f"res{round_}/{node}/{local}", json.dumps(gbps))
    store.add("done", 1)
    deadline = time.monotonic() + args.timeout
    while rank == 0 and store.add("done", 0) < world and time.monotonic() < deadline:
        time.sleep(0.2)  # the store lives in this process (srun): it stays until every rank is through with it
    if measured := [p["gbps"] for p in pairs if p["gbps"] is not None]:
        measures[BUSBW] = min(measured)
    if args.gpus and nccl_log.exists():
        _nccl_network_check(nccl_log, failures, measures)


def _shared_check(
    args: argparse.Namespace, names: Iterable[str], failures: list[str], measures: dict[str, Any]
) -> None:
    """Local rank 0: every node's ``<node>.probe`` seen here (one listing of the folder, not a stat per node)."""
    try:
        present = set(os.listdir(args.out))
    except OSError:
        present = set()
    unseen = sorted(n for n in names if f"{n}.probe" not in present)
    measures["unseen"] = unseen[:4]  # the verdict names a node that none of its peers see (decide.unshared_node)
    if unseen:
        failures.append(f"run folder {args.run_dir} is not shared: files of {', '.join(unseen)} not visible here")


def _in_a_world(args: argparse.Namespace) -> bool:
    """Whether this process has a world to join: torchrun's, or (one process per node started by srun: CPU jobs)
    one made from srun's task ids and ``--master``."""
    if "RANK" not in os.environ and args.master:
        addr, _, port = args.master.rpartition(":")
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK="0",
                          MASTER_ADDR=addr, MASTER_PORT=port)  # fmt: skip
    return "RANK" in os.environ


def _join(args: argparse.Namespace, rank: int, world: int, nccl_log: Path) -> Any:
    """Join the process group (NCCL on GPUs, its own log in ``nccl_log``; gloo, lazily, on CPUs); the gate's
    store, shared by every rank."""
    import torch.distributed as dist

    timeout = timedelta(seconds=args.timeout)
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts the store
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0 and not agent,
                        3 * timeout, wait_for_workers=False)  # fmt: skip
    store = dist.PrefixStore("cookbook-gate/", tcp)
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")  # gloo connects only the ranks that talk
    if args.gpus:  # NCCL's own word on its network (NET/OFI, IB or Socket), on the node's own disk
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=str(nccl_log))
    dist.init_process_group("nccl" if args.gpus else "gloo", store=dist.PrefixStore("world/", tcp), rank=rank,
                            world_size=world, timeout=timeout)  # fmt: skip
    tcp.set_timeout(timeout)  # gloo's lazy connect of a pair waits on the store: a pair's bound, not 3 x
    return store


def _get(store: Any, key: str, seconds: float) -> bytes:
    """``key`` from the store, waiting up to ``seconds`` for it (the store's own timeout is a pair's)."""
    store.wait([key], timedelta(seconds=seconds))
    return bytes(store.get(key))


def _nccl_network_check(nccl_log: Path, failures: list[str], measures: dict[str, Any]) -> None:
    """The network NCCL says it used (its log, then removed); with EFA, not Libfabric is a failure."""
    measures["nccl_net"] = net = nccl_network(nccl_log.read_text(errors="replace"))
    nccl_log.unlink()
    if net and os.environ.get("FI_PROVIDER") == "efa":  # NCCL's own line outranks the search for the file
        failures[:] = [f for f in failures if not f.startswith(NO_NET_PLUGIN)]
        if "Libfabric" not in net:
            failures.append(f"{NO_NET_PLUGIN} is not in use: NCCL says 'Using network {net}', not Libfabric")


def _first_round(store: Any, nodes: int, nproc: int, timeout: float) -> dict[int, str]:
    """Rank 0: every node whose ranks passed their own checks within ``timeout``, paired (round 1); each node's
    partner (-1: none) and the names of the nodes that joined are written to the store."""
    deadline, names, ok = time.monotonic() + timeout, {}, []
    for i in range(nodes):
        try:
            store.wait([f"name/{i}"] + [f"ok/{i * nproc + k}" for k in range(nproc)],
                       timedelta(seconds=max(0.1, deadline - time.monotonic())))  # fmt: skip
        except Exception:  # noqa: BLE001  (a node that never got here: no report, not paired)
            continue
        names[i] = store.get(f"name/{i}").decode()
        if all(store.get(f"ok/{i * nproc + k}") == b"1" for k in range(nproc)):
            ok.append(names[i])
    store.set("joined", json.dumps(names))
    store.set("ok", json.dumps(ok))
    _publish(store, 1, first_pairs(ok), names, nodes)
    return names


def _second_round(store: Any, names: dict[int, str], nproc: int, limits: GateThresholds, timeout: float) -> None:
    """Rank 0: round 1's figures (a pair that did not answer within ``timeout``: failed), then the suspects'
    known-good partners (round 2) written to the store."""
    index = {x: i for i, x in names.items()}
    deadline, first = time.monotonic() + timeout, []
    for a, b in json.loads(store.get("pairs1")):
        for k in range(nproc):
            key = f"res1/{min(index[a], index[b])}/{k}"
            try:
                store.wait([key], timedelta(seconds=max(0.1, deadline - time.monotonic())))
                gbps = json.loads(store.get(key))
            except Exception:  # noqa: BLE001
                gbps = None
            first.append(PairResult(a, b, gbps, 1, k))
    _publish(store, 2, second_pairs(json.loads(store.get("ok")), first, limits), names, len(names))


def _publish(store: Any, round_: int, pairs: list[tuple[str, str]], names: dict[int, str], nodes: int) -> None:
    index = {x: i for i, x in names.items()}
    partner = {index[a]: index[b] for a, b in pairs} | {index[b]: index[a] for a, b in pairs}
    store.set(f"pairs{round_}", json.dumps(pairs))
    for i in range(nodes):
        store.set(f"plan{round_}/{i}", str(partner.get(i, -1)))


def _pair_allreduce(args: argparse.Namespace, group: Any) -> float | None:
    """GB/s of a 2-rank all-reduce of ``--allreduce-mb`` (nccl-tests' bus bandwidth: size / time at 2 ranks),
    after a warm-up that makes the connections; None when it failed or timed out."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if args.gpus else torch.device("cpu")
    numel, reps = (args.allreduce_mb * 2**20) // 4, 5
    try:
        x = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(x, group=group)
        if args.gpus:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x, group=group)
        if args.gpus:
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001  (the pair's figure says it failed; the verdict decides whom to blame)
        return None
    return round(numel * 4 * reps / (time.perf_counter() - start) / 1e9, 3)


def nccl_network(log: str) -> str | None:
    """The network NCCL chose, from its INFO lines (``Using network Libfabric|IB|Socket``); aws-ofi-nccl's
    ``NET/OFI`` init line alone says Libfabric. None: NCCL said neither."""
    said = re.findall(r"Using network (.+)$", log, re.M)
    return said[-1].strip() if said else ("Libfabric" if "NET/OFI" in log else None)


def report_path(out: Path, node: str) -> Path:
    """A node's one report: ``{"node": NODE, "ranks": [each local rank's report]}``."""
    return out / f"{node}.json"


class NodeReports:
    """This process's report. A local rank > 0 leaves it on the node's own disk (after its local checks, then
    final); local rank 0 gathers them and writes the node's one report to the shared folder, once: at its end,
    or on SIGTERM (the gate's budget ran out) with what it has."""

    def __init__(self, out: Path, local_rank: int, nproc: int, report: dict[str, Any]) -> None:
        self.out, self.local_rank, self.nproc, self.report = out, local_rank, nproc, report
        key = hashlib.sha1(f"{os.path.abspath(out)} {node_name()}".encode()).hexdigest()[:12]  # no stat
        self.stage = Path(tempfile.gettempdir()) / f"cookbook-gate-{key}"  # the node's own disk
        self.lock, self.written, self.network_done = threading.Lock(), False, False

    def keep(self, final: bool = False) -> None:
        """A local rank > 0: its report, so far, where local rank 0 reads it."""
        if self.local_rank == 0 or (final and not self.stage.is_dir()):  # rank 0 is through: nobody reads it
            return
        self.stage.mkdir(parents=True, exist_ok=True)
        tmp = self.stage / f".{self.local_rank}.tmp"
        tmp.write_text(json.dumps({**self.report, "final": final}))
        os.replace(tmp, self.stage / f"{self.local_rank}.json")

    def finish(self, wait_s: float) -> None:
        """Once: a local rank > 0 keeps its final report; local rank 0 waits up to ``wait_s`` for its ranks'
        final reports and writes the node's."""
        with self.lock:
            if self.written:
                return
            self.written = True
            if self.local_rank:
                self.keep(final=True)
                return
            node = {"node": node_name(), "ranks": [self.report, *self._gather(wait_s)]}
            path = report_path(self.out, node_name())
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(node))
            os.replace(tmp, path)

    def _gather(self, wait_s: float) -> list[dict[str, Any]]:
        """The node's other ranks' reports (final, or what they had at ``wait_s``: marked unfinished)."""
        deadline, found = time.monotonic() + wait_s, dict[int, dict[str, Any]]()
        while True:
            for k in range(1, self.nproc):
                if not found.get(k, {}).get("final"):
                    with contextlib.suppress(OSError, ValueError):
                        found[k] = json.loads((self.stage / f"{k}.json").read_text())
            if all(found.get(k, {}).get("final") for k in range(1, self.nproc)) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        shutil.rmtree(self.stage, ignore_errors=True)
        for k, r in found.items():
            if not r.pop("final", False) and "collective_error" not in r and "measures" in r:
                r["collective_error"] = f"local rank {k} of {node_name()} did not finish its checks in time"
        return [found[k] for k in sorted(found)]

    def on_term(self) -> None:
        """SIGTERM (srun passes on the end of the gate's budget) writes what this process has and exits: a thread
        that waits for it, as the main thread may be inside a collective that holds it."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before torch starts threads: they inherit it

        def wait() -> None:
            signal.sigwait({signal.SIGTERM})
            if not self.network_done and "measures" in self.report:
                self.report.setdefault("collective_error", "stopped by SIGTERM (the gate's budget ran out)")
            self.finish(wait_s=0.0)
            os._exit(0)

        threading.Thread(target=wait, name="gate-sigterm", daemon=True).start()


def check(args: argparse.Namespace) -> int:
    """One process's checks; its node's local rank 0 writes the node's one report (:class:`NodeReports`)."""
    started = time.time()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    out = Path(args.out)
    if local_rank == 0:  # the node's one writer there (its probe, its report)
        out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    measures: dict[str, Any] = {}
    report: dict[str, Any] = {"node": node_name(), "local_rank": local_rank, "failures": failures}
    reports = NodeReports(out, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), report)
    reports.on_term()
    try:
        import torch  # noqa: F401  (timed apart: a cold import from shared storage is no node fault)

        measures["import_s"] = round(time.time() - started, 1)
        failures, measures2 = local_checks(args, local_rank, out)
        measures.update(measures2)
        report.update(failures=failures, measures=measures, seconds=round(time.time() - started, 1))
        reports.keep()
        if not args.local_only:
            os.environ.setdefault("NCCL_ALGO", "Ring")  # a NIC-true bus bandwidth (nccl-tests#196, #290)
            collective(args, failures, measures)
    except Exception as e:  # the report says what failed; the verdict decides whom to blame
        what = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if "measures" in report:
            report["collective_error"] = what
        else:
            failures.append(f"pre-flight check crashed: {what}")
    reports.network_done = True
    report.update(failures=failures, measures=measures, seconds=round(time.time() - started, 1))
    reports.finish(wait_s=0.0 if args.local_only else args.timeout)
    if "torch" in sys.modules:  # after the report: a broken communicator's teardown may hang
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0  # never fail the step: srun would stop the other nodes' checks


def read_reports(out: Path, nodes: Sequence[str], procs: int) -> tuple[dict[str, NodeReport], list[PairResult]]:
    """Every node's reports folded into one :class:`NodeReport` (a node with no report at all is left out:
    missing), and every pair's figures (each pair's two sides: the slower)."""
    reports: dict[str, NodeReport] = {}
    pairs: dict[tuple[int, str, str, int], float | None] = {}
    order = {x: i for i, x in enumerate(nodes)}
    for node in nodes:
        try:
            found = list(json.loads(report_path(out, node).read_text())["ranks"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not found:
            continue
        failures = [f for r in found for f in r.get("failures", [])]
        collective_errors = [r["collective_error"] for r in found if r.get("collective_error")]
        for r in found:
            for p in r.get("measures", {}).get("pairs", []):
                a, b = sorted((node, p["partner"]), key=lambda x: order.get(x, len(order)))
                key, gbps = (p["round"], a, b, r.get("local_rank", 0)), p["gbps"]
                pairs[key] = None if gbps is None or pairs.get(key, 0.0) is None else min(gbps, pairs.get(key, gbps))
        if len(found) < procs:
            collective_errors.append(f"{procs - len(found)} of {procs} local rank(s) of {node} did not report")
        matmuls = [r["measures"]["matmul_tflops"] for r in found if "matmul_tflops" in r.get("measures", {})]
        busbw = [
            r["measures"]["allreduce_busbw_gbps"] for r in found if "allreduce_busbw_gbps" in r.get("measures", {})
        ]
        reports[node] = NodeReport(
            failures=tuple(dict.fromkeys(failures)),
            matmul_tflops=min(matmuls) if matmuls else None,
            busbw_gbps=min(busbw) if busbw else None,
            collective_error=collective_errors[0] if collective_errors else None,
            seconds=max((r.get("seconds", 0.0) for r in found), default=None),
            unseen=next((tuple(r["measures"]["unseen"]) for r in found if "unseen" in r.get("measures", {})), None),
        )
    return reports, [PairResult(a, b, gbps, round_, rail) for (round_, a, b, rail), gbps in pairs.items()]


def describe(report: NodeReport) -> str:
    """``matmul_tflops 0.02, allreduce_busbw_gbps 1.2`` for the log's ok line."""
    parts = []
    if report.matmul_tflops is not None:
        parts.append(f"matmul_tflops {report.matmul_tflops}")
    if report.busbw_gbps is not None:
        parts.append(f"allreduce_busbw_gbps {report.busbw_gbps}")
    return ", ".join(parts)


def judge(
    out: Path, nodes: Sequence[str], procs: int, gpus: int, limits: GateThresholds, say: Callable[[str], None]
) -> GateVerdict:
    """Read every node's reports, say one line per node, and return the verdict
    (:func:`cookbook_runtime.decide.gate_verdict`); matmuls are compared between peers on GPUs only."""
    found, pairs = read_reports(out, nodes, procs)
    reports = name_unshared(nodes, found)
    if not (gpus > 0 and any(r.matmul_tflops is not None for r in reports.values())):
        limits = replace(limits, matmul_peer_ratio=0.0)
    verdict = gate_verdict(nodes, reports, limits, pairs)
    for node in nodes:
        report = reports.get(node)
        if report is not None and node not in verdict.blame and not report.failures:
            say(f"cookbook: pre-flight ok on {node} in {report.seconds or 0:g} s: {describe(report)}")
    for node, reasons in verdict.blame.items():
        say(f"cookbook: pre-flight failed on {node}: {'; '.join(dict.fromkeys(reasons))}")
    return verdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("check", help="run on every rank (under torchrun)")
    c.add_argument("--out", required=True)
    c.add_argument("--gpus", type=int, default=0, help="GPUs per node the job uses (0: CPU)")
    c.add_argument("--matmul-fraction", type=float, default=0.0, help="GPU: clearly broken below this x the peak")
    c.add_argument("--matmul-min-tflops", type=float, default=0.0, help="CPU: absolute floor")
    c.add_argument("--matmul-seconds", type=float, default=1.0, help="time the matmul this long after warm-up")
    c.add_argument("--min-busbw", type=float, default=0.0, help="a pair's all-reduce bus bandwidth floor, GB/s")
    c.add_argument("--busbw-peer-ratio", type=float, default=0.6, help="a pair below R x the pairs' median: slow")
    c.add_argument("--allreduce-mb", type=int, default=64)
    c.add_argument("--interface", default="")
    c.add_argument("--run-dir", default="")
    c.add_argument("--local-disk", default="/tmp")
    c.add_argument("--min-free-gb", type=float, default=0.0)
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--local-only", action="store_true", help="only the node's own checks (no matmul, no collective)")
    c.add_argument("--master", default="", help="ADDR:PORT of rank 0 when srun, not torchrun, starts the ranks")
    args = p.parse_args(argv)
    check(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the report is written: no interpreter teardown (process-group destructors abort at exit)


if __name__ == "__main__":
    sys.exit(main())
