"""Every decision the batch step takes, as pure functions of what it observed (standard library only).

:mod:`cookbook_runtime.run` gathers the facts (Slurm's answers, the gate's reports, the hang dumps, the run
folder) and acts on what these return; the unit tests build those facts at 1, 16 and 1,000 nodes.

The rule of the safety net: **it never stops a job that would have trained.** A node is blamed only for a
fault of its own (its local checks failed while its peers passed, or it measured far below its peers);
anything the net cannot attribute -- the collective cannot start, a timeout, the same failure on many
nodes, missing reports -- is logged in one line and the job trains (the framework's own error is the
truth), unless the user asked for a strict gate.
"""

from __future__ import annotations

import ipaddress
import math
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# ---------------------------------------------------------------- head address and port


def head_address(
    local: Sequence[tuple[str, str]], resolved: Sequence[str], interface: str = ""
) -> tuple[str, str] | None:
    """``(address, interface)`` of the batch host (the allocation's first node, where rank 0 runs) for the
    rendezvous, or None when it has no usable IPv4 address.

    ``local``: the host's own ``(interface, IPv4)`` pairs; ``resolved``: what its host name resolves to;
    ``interface``: ``NCCL_SOCKET_IFNAME`` when the user or profile pinned one (``eth0``, ``=eth0``, ``ens``,
    ``^docker,lo``). The address is taken from the host itself, never from the Slurm NodeName (which need not
    be a DNS name): the pinned interface's, else the address the host name resolves to when the host holds it,
    else its first address outside loopback, link-local and container bridges."""
    usable = [(i, a) for i, a in local if _usable(a) and not i.startswith(("docker", "veth", "virbr", "br-"))]
    if interface:
        pinned = [(i, a) for i, a in usable if interface_matches(interface, i)]
        if pinned:
            return pinned[0][1], pinned[0][0]
    for address in resolved:
        for i, a in usable:
            if a == address:
                return a, i
    return (usable[0][1], usable[0][0]) if usable else None


def _usable(address: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def interface_matches(spec: str, name: str) -> bool:
    """Whether interface ``name`` is one ``spec`` selects, in NCCL_SOCKET_IFNAME's syntax: ``eth`` (a prefix),
    ``=eth0`` (exact), ``^docker,lo`` (every interface but these prefixes), comma-separated lists."""
    if spec.startswith("^"):
        return not any(name.startswith(p.lstrip("=")) for p in spec[1:].split(",") if p)
    for want in spec.split(","):
        if want.startswith("=") and name == want[1:]:
            return True
        if want and not want.startswith("=") and name.startswith(want):
            return True
    return False


def device_list(spec: str) -> tuple[bool, list[tuple[str, bool, int | None]]]:
    """``NCCL_IB_HCA``-style list: ``(exclude, [(name, exact, port)])``: ``mlx5_0:1,mlx5_1``, ``=mlx5_0``
    (exact), ``^mlx5_4`` (all but). One parser for the gate, ``doctor`` and the rehearsal."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    out: list[tuple[str, bool, int | None]] = []
    for item in body.split(","):
        name, _, port = item.strip().partition(":")
        if name:
            out.append((name, exact, int(port) if port.isdigit() else None))
    return exclude, out


def devices_selected(spec: str, present: Iterable[str]) -> list[str]:
    """The devices of ``present`` that the ``NCCL_IB_HCA``-style ``spec`` selects."""
    exclude, items = device_list(spec)
    picked = [d for d in present if any((d == n) if exact else d.startswith(n) for n, exact, _ in items)]
    return [d for d in present if d not in picked] if exclude else picked


def rendezvous_port(base: int, job_id: int, exclusive: bool, span: int) -> int:
    """The port of the job's rendezvous: ``base`` on nodes of its own; on shared nodes ``base + job % span``
    so that two jobs on one node never meet."""
    return base if exclusive else base + job_id % span


# ---------------------------------------------------------------- the gate's verdict


@dataclass(frozen=True)
class NodeReport:
    """What one node's checks found, whoever ran them: the gate (its measurements, judged against its peers'),
    the rehearsal (``cookbook_runtime.rehearsal``'s JSON as ``facts``) or ``cookbook doctor``'s probe job (its
    lines as ``facts``). ``failures``: its own checks that failed; None fields: not measured. The one report type
    of the repository (issue #43)."""

    failures: tuple[str, ...] = ()  # its own local checks (GPUs, interface, fabric device, run folder, disk)
    matmul_tflops: float | None = None  # its slowest GPU (or CPU)
    busbw_gbps: float | None = None  # its slowest pair (said in the log; judged per pair: PairResult)
    collective_error: str | None = None  # the collective part failed here (rendezvous, NCCL init, timeout)
    seconds: float | None = None
    unseen: tuple[str, ...] | None = None  # the peers whose run-folder probe it cannot see
    node: str = ""  # its name (the gate keys its reports by node)
    notes: tuple[str, ...] = ()  # worth reading, not failing (e.g. node-local storage)
    facts: Mapping[str, Any] = field(default_factory=dict)  # what the rehearsal or the probe saw there

    @property
    def ok(self) -> bool:
        """No check of its own failed."""
        return not self.failures


@dataclass(frozen=True)
class GateThresholds:
    """Peer ratios judge first; absolute floors only catch what is clearly broken (each from its source)."""

    matmul_peer_ratio: float = 0.7  # a node below 0.7 x the median of its peers' slowest GPU
    matmul_floor_tflops: float = 0.0  # clearly broken, whatever the peers say (0: none)
    busbw_peer_ratio: float = 0.6  # a pair below 0.6 x the median of the other pairs
    busbw_floor_gbps: float = 0.0  # clearly broken (per fabric, from published measurements; 0: none)
    strict: bool = False  # the user's choice: a problem nobody can be blamed for stops the job too
    fabric_stop: bool = True  # a fabric that cannot serve the job stops it (COOKBOOK_FABRIC_STOP=0: trains)


@dataclass(frozen=True)
class GateVerdict:
    """``blame``: node -> reasons (only faults attributable to that node); ``unattributed``: one line saying
    what failed that no node can be blamed for (logged; the job trains unless ``stop``); ``stop``: end the
    job without training (only under a strict gate)."""

    blame: dict[str, list[str]] = field(default_factory=dict)
    unattributed: str = ""
    stop: bool = False

    @property
    def exclude(self) -> list[str]:
        return sorted(self.blame)


def gate_verdict(
    nodes: Sequence[str], reports: Mapping[str, NodeReport], limits: GateThresholds, pairs: Sequence[PairResult] = ()
) -> GateVerdict:
    """Who, if anyone, the gate blames, from every node's report (a node without one is missing).

    - no report from more than a third of the nodes, or the collective failed: a gate or cluster problem;
    - the same local failure on at least half of the nodes: a cluster problem (a wrong setting, a shared
      filesystem), never ``n`` bad nodes;
    - a node whose own checks failed while its peers passed, or far below its peers: blamed;
    - a missing report or a timeout is never a node's fault;
    - bandwidth is judged per pair (:func:`pair_verdict`); a fabric that cannot serve the job stops it
      (:func:`fabric_stop`), blaming no node."""
    n = len(nodes)
    missing = [x for x in nodes if x not in reports]
    have = {x: reports[x] for x in nodes if x in reports}
    problems: list[str] = []
    if n and len(missing) * 3 > n:
        problems.append(f"no report from {len(missing)} of {n} node(s) ({_few(missing)}): the gate did not finish")
    elif missing:
        problems.append(f"no report from {_few(missing)} (not blamed: a gate that did not finish is no node fault)")
    collective = {x: r.collective_error for x, r in have.items() if r.collective_error}
    if collective:
        first = next(iter(collective.values()))
        problems.append(f"the collective part failed on {len(collective)} node(s): {first}")
    blame: dict[str, list[str]] = {}
    _blame_local_failures(have, n, blame, problems)
    _blame_slow_nodes(have, limits, blame, problems)
    named, unclear = pair_verdict(pairs, limits)
    problems += unclear
    for x, reasons in named.items():
        blame.setdefault(x, []).extend(reasons)
    if n > 1 and _many(len(blame), n):  # half the allocation bad at once: the cluster, not its nodes
        problems.append(f"{len(blame)} of {n} node(s) failed their checks: too many to blame the nodes")
        blame = {}
    if fabric := fabric_stop(nodes, have, pairs, limits):
        return GateVerdict({}, fabric, stop=True)
    unattributed = "; ".join(problems)
    return GateVerdict(blame, unattributed, stop=bool(unattributed) and limits.strict)


def _blame_local_failures(
    have: Mapping[str, NodeReport], n: int, blame: dict[str, list[str]], problems: list[str]
) -> None:
    """Local failures, by kind, into ``blame``: a kind on at least half of the ``n`` nodes is the cluster's (one
    line in ``problems``)."""
    kinds: dict[str, list[str]] = {}
    for x, r in have.items():
        for f in r.failures:
            kinds.setdefault(_kind(f), []).append(x)
    for kind, where in kinds.items():
        if n > 1 and not _many(len(where), n):
            for x in where:
                blame.setdefault(x, []).extend(f for f in have[x].failures if _kind(f) == kind)
        else:
            example = next(f for f in have[where[0]].failures if _kind(f) == kind)
            problems.append(f"{example} on {len(where)} of {n} node(s): a cluster or setting problem, no node blamed")


def _blame_slow_nodes(
    have: Mapping[str, NodeReport], limits: GateThresholds, blame: dict[str, list[str]], problems: list[str]
) -> None:
    """Measurements far below the peers' median, or clearly broken on a few nodes, into ``blame``; clearly broken
    on many, one line in ``problems``."""
    for key, ratio, floor, unit, label in (
        ("matmul_tflops", limits.matmul_peer_ratio, limits.matmul_floor_tflops, "TFLOP/s", "matmul"),
    ):
        values = {x: getattr(r, key) for x, r in have.items() if getattr(r, key) is not None}
        slow = outliers(values, ratio)
        for x, median in slow.items():
            blame.setdefault(x, []).append(
                f"{label} {values[x]:.4g} {unit} < {ratio:g} x its peers' median {median:.4g} {unit}"
            )
        broken = [x for x, v in values.items() if floor and v < floor and x not in slow]
        if broken and len(values) > 1 and not _many(len(broken), len(values)):
            for x in broken:
                blame.setdefault(x, []).append(f"{label} {values[x]:.4g} {unit} < {floor:g} {unit} (clearly broken)")
        elif broken:
            low = min(values[x] for x in broken)
            problems.append(
                f"{label} {low:.4g} {unit} < {floor:g} {unit} on {len(broken)} of {len(values)} node(s): "
                "the fabric or a setting, no node blamed"
            )


# ---------------------------------------------------------------- the pairwise bandwidth test

FABRIC_OVERRIDE = "COOKBOOK_FABRIC_STOP=0"  # train over a fabric the gate found unusable, all the same
NO_NET_PLUGIN = "aws-ofi-nccl's NCCL plugin"  # the gate's line starts so when NCCL would not use EFA


@dataclass(frozen=True)
class PairResult:
    """One all-reduce between nodes ``a`` and ``b`` (local rank ``rail`` of each, all rails at once) in round
    ``round``: bus bandwidth in GB/s, None when it failed."""

    a: str
    b: str
    gbps: float | None
    round: int = 1
    rail: int = 0


def first_pairs(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Round 1, a perfect matching of neighbours (0-1, 2-3, ...; nccl-tests' even-odd pairs): each node once,
    every pair at once. An odd node out waits for round 2."""
    return [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]


def second_pairs(nodes: Sequence[str], first: Sequence[PairResult], limits: GateThresholds) -> list[tuple[str, str]]:
    """Round 2: each suspect (a member of a pair under the bar) against a partner of its own: a known-good node
    (a member of a pair above it), else the odd node out; the odd node out, when left, against a good node.
    Every pair at once. Suspects beyond the partners are not tested: that many slow pairs is the fabric's."""
    slow = slow_pairs(first, limits)
    tested = {x for r in first for x in (r.a, r.b)}
    odd = [x for x in nodes if x not in tested]
    good = [x for pair in _pair_figures(first) if pair not in slow for x in pair]
    pairs = list(zip([x for pair in slow for x in pair], good + odd))
    used = {x for pair in pairs for x in pair}
    return pairs + list(zip([x for x in odd if x not in used], [x for x in good if x not in used]))


def _pair_figures(results: Iterable[PairResult]) -> dict[tuple[str, str], float | None]:
    """Each pair's slowest rail (None when a rail failed)."""
    out: dict[tuple[str, str], float | None] = {}
    for r in results:
        was = out.get((r.a, r.b), float("inf"))
        out[(r.a, r.b)] = None if was is None or r.gbps is None else min(was, r.gbps)
    return out


def slow_pairs(results: Sequence[PairResult], limits: GateThresholds) -> dict[tuple[str, str], str]:
    """The pairs under the bar, with why: failed, under the floor, or under ``busbw_peer_ratio`` x the
    median of the other pairs (from three pairs on)."""
    figures = _pair_figures(results)
    peers = outliers({f"{a} {b}": v for (a, b), v in figures.items() if v is not None}, limits.busbw_peer_ratio)
    floor, out = limits.busbw_floor_gbps, {}
    for (a, b), v in figures.items():
        if v is None:
            out[(a, b)] = "the all-reduce failed"
        elif floor and v < floor:
            out[(a, b)] = f"{v:.4g} GB/s < {floor:g} GB/s"
        elif f"{a} {b}" in peers:
            out[(a, b)] = f"{v:.4g} GB/s < {limits.busbw_peer_ratio:g} x the pairs' median {peers[f'{a} {b}']:.4g}"
    return out


def pair_verdict(results: Sequence[PairResult], limits: GateThresholds) -> tuple[dict[str, list[str]], list[str]]:
    """``(blame, problems)`` from both rounds. A node with a pair above the bar is good; a node under the bar
    with a good node, and above it with none, is named. A slow pair of two good nodes is the path between them;
    one with no good member cannot tell which side is slow: nobody is named."""
    slow, figures = slow_pairs(results, limits), _pair_figures(results)
    first = [q for q in _pair_figures(r for r in results if r.round == 1)]
    if _many(under := sum(q in slow for q in first), len(first)):
        e_g = next(iter(slow.values()))
        return {}, [f"{under} of {len(first)} pairs under the bar ({e_g}): the fabric or a setting, no node blamed"]
    fine = {x: y for q in figures if q not in slow for x, y in (q, q[::-1])}  # a good node -> a partner it passed with
    blame: dict[str, list[str]] = {}
    for q, why in slow.items():
        for x, y in (q, q[::-1]):
            if y in fine and x not in fine:
                blame.setdefault(x, []).append(f"link bandwidth with {y}: {why} ({y} passed with {fine[y]})")
    problems, untold = [], []
    for q in (q for q in slow if not any(x in blame for x in q)):
        if all(x in fine for x in q):
            problems.append(f"the pair {'-'.join(q)}: {slow[q]}, yet each passed with another node: the path "
                            "between them (a cable, a switch port), no node blamed")  # fmt: skip
        else:
            untold.append("-".join(q))
    if untold:
        problems.append(f"{len(untold)} slow pair(s) ({_few(untold)}) and no good node to tell which side is slow: "
                        "no node blamed")  # fmt: skip
    return blame, problems


def fabric_stop(
    nodes: Sequence[str], reports: Mapping[str, NodeReport], pairs: Sequence[PairResult], limits: GateThresholds
) -> str:
    """The one line that stops a run that would train at socket speed, blaming no node: the fabric profile's
    NCCL plugin missing on every node, or every pair under a quarter of the floor. "" otherwise."""
    if not limits.fabric_stop:
        return ""
    fix = f"; to train over it all the same: {FABRIC_OVERRIDE} sbatch ..."
    if len(nodes) > 1 and all(any(f.startswith(NO_NET_PLUGIN) for f in getattr(reports.get(x), "failures", ()))
                              for x in nodes):  # fmt: skip
        return (f"{NO_NET_PLUGIN} is missing on all {len(nodes)} nodes: NCCL would run over TCP sockets, a fraction of "
                "EFA's bandwidth, the whole allocation long; no node is blamed. Fix: install aws-ofi-nccl on the nodes "
                "(the EFA installer puts it in /opt/amazon/ofi-nccl/lib) or put its folder on LD_LIBRARY_PATH (the "
                f"aws-efa profile's){fix}")  # fmt: skip
    figures = list(_pair_figures(pairs).values())
    floor = limits.busbw_floor_gbps
    if floor and figures and all(v is not None and v < floor / 4 for v in figures):
        best = max(v for v in figures if v is not None)
        return (f"every pair's all-reduce is under a quarter of the {floor:g} GB/s floor ({len(figures)} pair(s), "
                f"the best {best:.3g} GB/s): the fabric is not in use, no node is blamed. Fix: with NCCL_DEBUG=INFO "
                "check NCCL's 'Using network' line names the fabric (IB, Libfabric), not Socket; the profile's "
                f"NCCL_IB_HCA/FI_PROVIDER and plugin path{fix}")  # fmt: skip
    return ""


def _many(count: int, n: int) -> bool:
    """The same fault on at least half of the nodes (and on more than one): the cluster's, not theirs."""
    return count >= 2 and count * 2 >= n


def outliers(values: Mapping[str, float], ratio: float) -> dict[str, float]:
    """``{node: median of the others}`` for each node below ``ratio`` x the median of the others (at least
    two others: with fewer there is no peer to compare with)."""
    out: dict[str, float] = {}
    m = len(values) - 1  # the others of each node
    if m < 2:
        return out
    order = sorted(values, key=lambda x: values[x])
    ranked = [values[x] for x in order]

    def other(k: int, i: int) -> float:  # the k-th smallest value once position i is left out
        return ranked[k] if k < i else ranked[k + 1]

    for i, x in enumerate(order):  # O(n log n): 1,000 nodes' medians without 1,000 sorts
        median = other(m // 2, i) if m % 2 else (other(m // 2 - 1, i) + other(m // 2, i)) / 2
        if values[x] < ratio * median:
            out[x] = median
    return out


def _kind(failure: str) -> str:
    """A failure's kind: its words without numbers and names, so that one cause on many nodes is one kind."""
    return re.sub(r"[\d.]+|mlx5_\w+|/\S*", "#", failure.split(":")[0])[:60]


def _few(items: Sequence[str], k: int = 4) -> str:
    return ",".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


GATE_WINDOW_S = 6 * 3600.0  # nodes that passed the whole gate in this job this recently: local checks only


def gate_shortcut(passes_tsv: str, job: str, nodes: Sequence[str], now: float, window_s: float) -> float | None:
    """Seconds since every one of ``nodes`` passed the whole gate in ``job`` (a row of ``gate-passes.tsv``:
    when, job, nodes, seconds, mode), when that is within ``window_s``; None: run the whole gate."""
    last: dict[str, float] = {}
    for line in passes_tsv.splitlines():
        cells = line.split("\t")
        if len(cells) < 5 or cells[1] != job or cells[4] != "full":
            continue
        try:
            when = float(cells[0])
        except ValueError:
            continue
        for node in cells[2].split(","):
            last[node] = max(last.get(node, 0.0), when)
    if not nodes or any(x not in last for x in nodes):
        return None
    age = now - min(last[x] for x in nodes)  # the record's time is rounded to the second: up to 0.5 s ahead
    return max(age, 0.0) if -1.0 <= age <= window_s else None


def collective_timeout(base_s: float, ranks: int) -> float:
    """Seconds each wait of the gate's network part may take (a pair's all-reduce, a round's plan): ``base_s``
    plus what grows with the ranks -- rank 0 reads one store key per rank between the rounds, and every rank
    shares that one store (~10 ms a rank at worst)."""
    return base_s + ranks / 100


def gate_budget(base_s: float, nodes: int, startup_s: float = 120.0) -> float:
    """Seconds the gate may take: the profile's budget for the checks, a cold start (``import torch`` from a
    shared filesystem, CUDA contexts: ``startup_s``) and NCCL/gloo initialisation growing with the node count."""
    return base_s + startup_s + 0.25 * nodes


# ---------------------------------------------------------------- the nodes' Python and the run folder's space

ENV_FIX = (
    "install the pinned stack into an environment every node sees, built on a node of this architecture "
    "(`make setup` run there), and name it: VENV=/shared/env sbatch ... (or the job's container image)"
)


@dataclass(frozen=True)
class EnvVerdict:
    """``stop``: the line that ends the job (the environment lacks what the job runs), else ""; ``notes``: what
    differs from the tested versions, or nodes that did not answer (the job trains)."""

    stop: str = ""
    notes: tuple[str, ...] = ()


def environment_verdict(
    nodes: Sequence[str], answers: Mapping[str, Mapping[str, Any]], needs: Mapping[str, str]
) -> EnvVerdict:
    """The nodes' Python against ``needs`` (``{package: tested version}``). A package missing on some node (or
    whose C extension does not load there: ``broken``) is the environment's fault, named with its nodes and the
    fix: the job stops and no node is excluded (no other node would have it either). Another version, or a node
    without an answer, is said; the job trains."""
    missing: dict[str, list[str]] = {}
    other: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        answer = answers.get(node)
        if answer is None:
            continue
        for package, want in needs.items():
            have = (answer.get("versions") or {}).get(package)
            if have is None or (answer.get("broken") or {}).get(package):
                missing.setdefault(package, []).append(node)
            elif want and have.split("+")[0] != want:
                other.setdefault((package, have), []).append(node)
    silent = [n for n in nodes if n not in answers]
    notes = [f"{p} {v} on {_few(ns)} (tested: {needs[p]}): training anyway" for (p, v), ns in other.items()]
    if silent:
        notes.append(f"no answer about the Python environment from {_few(silent)}: training anyway")
    if not missing:
        return EnvVerdict("", tuple(notes))
    where = sorted({n for ns in missing.values() for n in ns}, key=list(nodes).index)
    first = answers[where[0]]
    lacks = ", ".join(f"{p} ({_few(ns)})" if len(missing) > 1 else p for p, ns in missing.items())
    lacks += "".join(f" ({p}: {why})" for p, why in (first.get("broken") or {}).items())
    stop = (
        f"the Python environment of {_few(where)} ({first.get('python')}, {first.get('machine')}) lacks {lacks}: "
        f"not training, and no node is excluded (the environment is at fault, not a node). Fix: {ENV_FIX}"
    )
    return EnvVerdict(stop, tuple(notes))


def run_dir_space_problem(
    free_bytes: int, total_bytes: int, need_bytes: int, measured_bytes: int = 0, quota: Quota | None = None
) -> tuple[str, bool]:
    """``(one line, stop)`` when the run folder's filesystem -- or the user's ``quota`` there, when tighter -- may not
    hold the job's next checkpoint. Certain -- the newest checkpoint already there (``measured_bytes``) is larger
    than the room left -- stops; the planner's size (``need_bytes``) is an estimate: it only warns. A filesystem
    that reports no size (FUSE) and no quota is not judged."""
    free = f"{free_bytes / 1e9:.1f} GB free where the checkpoints go"
    if quota is not None and (total_bytes <= 0 or quota.room < free_bytes):
        free_bytes, free = quota.room, f"{quota.room / 1e9:.1f} GB left of your quota where the checkpoints go"
    elif total_bytes <= 0:
        return "", False
    if measured_bytes and free_bytes < measured_bytes:
        return (
            f"{free}, and this run's newest checkpoint there is {measured_bytes / 1e9:.1f} GB: the next save fails. "
            "Free space there or set RUN_DIR to a larger shared filesystem (COOKBOOK_CHECKPOINT_GB=0 skips this check)",
            True,
        )
    if need_bytes and free_bytes < need_bytes and not measured_bytes:
        return (
            f"{free}, and one checkpoint of this job is ~{need_bytes / 1e9:.1f} GB by the planner's estimate: "
            "training anyway (the first save may fail; free space there, or set COOKBOOK_CHECKPOINT_GB to the size "
            "your job writes)",
            False,
        )
    return "", False


def time_limit_seconds(text: str) -> float | None:
    """Slurm's ``TimeLimit`` (``[D-]HH:MM:SS``, ``MM:SS``, ``UNLIMITED``) in seconds; None when there is none."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def signal_lead(script: str) -> float | None:
    """The lead of the job's ``#SBATCH --signal=[B:]SIG@N`` line (the last one of the ``#SBATCH`` block, as sbatch
    reads it), in seconds; None when the script has none."""
    lead = None
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break  # sbatch reads #SBATCH lines up to the first command
        m = re.match(r"#SBATCH\s+--signal[=\s]+(?:\w+:)?\w+@(\d+)\s*$", line)
        if m:
            lead = float(m.group(1))
    return lead


def lead_problem(lead_seconds: float, limit_seconds: float | None) -> str:
    """One line when the ``--signal`` lead is more than half the time limit: USR1 would come after the first
    steps, the job stop-save and requeue, and do the same again, for ever."""
    if not lead_seconds or not limit_seconds or lead_seconds * 2 <= limit_seconds:
        return ""
    return (
        f"the stop signal's lead ({lead_seconds:.0f} s, #SBATCH --signal) is more than half the time limit "
        f"({limit_seconds:.0f} s): every run would stop-save and requeue after its first steps, for ever. Give the "
        "job more time (--time) or a shorter lead (--signal-seconds); not training"
    )


# ---------------------------------------------------------------- spares and recovery inside the allocation


def placement(allocated: Sequence[str], spares: int, bad: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(training nodes, spares)`` of an allocation of N+K nodes with ``spares`` = K: N nodes train, the batch
    host (the first node, where this step runs) always among them; ``bad`` nodes neither train nor stand by.
    Fewer than N healthy nodes: every healthy node trains (the caller decides whether that is enough)."""
    want = max(1, len(allocated) - max(0, spares))
    bad = set(bad)
    healthy = [x for x in allocated if x not in bad or x == allocated[0]]
    return healthy[:want], healthy[want:]


@dataclass(frozen=True)
class Incident:
    """One recovery of the job (a row of ``recoveries.tsv``): when it was decided, the nodes at fault, why, what
    was done, when the fault was seen and when the ranks' step ended (epoch seconds; 0: not known)."""

    when: float
    job: str
    nodes: tuple[str, ...]
    reason: str
    action: str
    fault_at: float = 0.0
    ended_at: float = 0.0
    spares: tuple[str, ...] = ()

    def row(self) -> str:
        cells = (f"{self.when:.3f}", self.job, ",".join(self.nodes), self.reason.replace("\t", " "), self.action,
                 f"{self.fault_at:.3f}", f"{self.ended_at:.3f}", ",".join(self.spares))  # fmt: skip
        return "\t".join(cells)


def parse_incidents(text: str) -> list[Incident]:
    """``recoveries.tsv`` back into :class:`Incident` rows (a line that does not parse is skipped)."""
    out = []
    for line in text.splitlines():
        c = line.split("\t")
        try:
            out.append(Incident(float(c[0]), c[1], tuple(x for x in c[2].split(",") if x), c[3], c[4],
                                float(c[5]), float(c[6]), tuple(x for x in c[7].split(",") if x)))  # fmt: skip
        except (IndexError, ValueError):
            continue
    return out


COSTLESS = ("train-on-gate", "requeue-later")  # logged, but they spend no recovery (the later start is the wait)


def _recent(incidents: Sequence[Incident], now: float, window_s: float) -> list[float]:
    return sorted(i.when for i in incidents if now - i.when < window_s and i.action not in COSTLESS)


def budget_left(incidents: Sequence[Incident], now: float, per_window: int, window_s: float) -> int:
    """Recoveries the job may still make: at most ``per_window`` within any ``window_s`` seconds (a job that
    meets a bad node every few days is not a job that crash-loops)."""
    return max(0, per_window - len(_recent(incidents, now, window_s)))


def budget_back_in(incidents: Sequence[Incident], now: float, per_window: int, window_s: float) -> float:
    """Seconds until :func:`budget_left` allows a recovery again (0: it does now; no budget at all: a window)."""
    recent = _recent(incidents, now, window_s)
    over = len(recent) - per_window  # the (over+1)-th oldest leaving the window frees one
    return window_s if per_window <= 0 else 0.0 if over < 0 else recent[over] + window_s - now


@dataclass(frozen=True)
class Recovery:
    """What the batch step does about a fault: ``action`` one of

    - ``spare``: swap ``nodes`` for ``spares`` and relaunch in this job (same id, no queue);
    - ``requeue-excluding``: ``scontrol requeuehold`` the same job, ``update ExcNodeList`` with ``nodes``,
      ``release`` (every option of the job kept, nothing copied from the environment);
    - ``train-on``: keep the nodes (relaunch after a crash, or simply train after the gate's blame);
    - ``requeue``: the same job requeued as it is (a lost node with nowhere else to go: Slurm places it again);
    - ``requeue-later``: the budget is spent and a checkpoint resumes it: the same job requeued to start by itself
      once the budget allows a recovery again (``StartTime``), never held for a human;
    - ``stop``: end the job with its status (the budget is spent and there is nothing to resume).
    """

    action: str
    nodes: tuple[str, ...]
    spares: tuple[str, ...] = ()
    why: str = ""


def recovery(
    fault: Sequence[str], spares: Sequence[str], batch_host: str, *, budget: int, lost: bool, resumable: bool,
    at_gate: bool = False, eligible: int | None = None, job_nodes: int = 0,
) -> Recovery:  # fmt: skip
    """The one answer to nodes at ``fault``, in order of what costs least: a spare (never for the batch host:
    this step runs there); else the same job requeued without them, only where ``eligible`` (the partition's or
    reservation's usable nodes outside the fault, None: unknown) still holds the job's ``job_nodes``; else train
    on a node that still answers, or requeue as it is when one is lost. A spent ``budget`` never ends a job that
    can resume: it starts again later by itself; at the gate it trains on the node."""
    nodes = tuple(fault)
    if budget <= 0:
        if at_gate and not lost:
            return Recovery("train-on", nodes, why="the recovery budget is spent")
        if resumable:
            return Recovery("requeue-later", nodes, why="the recovery budget is spent")
        return Recovery("stop", nodes, why="the recovery budget is spent and there is no checkpoint to resume")
    if batch_host not in nodes and len(spares) >= len(nodes):
        return Recovery("spare", nodes, tuple(spares[: len(nodes)]))
    why = "the batch host itself" if batch_host in nodes else f"no spare left ({len(spares)} for {len(nodes)})"
    if eligible is not None and job_nodes and eligible >= job_nodes:
        return Recovery("requeue-excluding", nodes, why=f"{why}; {eligible} eligible node(s) for {job_nodes}")
    room = "unknown" if eligible is None else f"only {eligible} eligible node(s) for {job_nodes}"
    if not lost:
        return Recovery("train-on", nodes, why=f"{why}; excluding would leave the job pending ({room})")
    return Recovery("requeue", nodes, why=f"{why}; {room}: Slurm places the job again once nodes are up")


def crashed_nodes(exits: Mapping[str, Mapping[str, Any]], nodes: Sequence[str]) -> list[str]:
    """The nodes whose ranks died of a signal (not HUP, INT or TERM: a stop, a cancel, srun tearing the step
    down) first: ``exits`` is ``{node: {"signals": [...], "at": epoch}}`` as each node's launcher wrote it.
    Half the nodes or more within a second of the first: a shared cause, nobody."""
    quiet = {"SIGHUP", "SIGINT", "SIGTERM"}
    died = {n: float(e.get("at", 0)) for n, e in exits.items() if n in nodes and set(e.get("signals", ())) - quiet}
    if not died:
        return []
    first = min(died.values())
    culprits = [n for n, at in died.items() if at - first < 1.0]
    return [] if _many(len(culprits), len(nodes)) else sorted(culprits, key=list(nodes).index)


SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? [\d,-]+: (.+?)(?: \(core dumped\))?\s*$")
SRUN_TEARDOWN = re.compile(r"^srun: (launch/slurm: _step_signal: Terminating|Job step aborted|error: Timed out)")
_SIGNAL_TEXT = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}


def srun_task_signal(line: str) -> tuple[str, str] | None:
    """``(node, SIGNAL)`` of srun's line for a task a signal ended (``srun: error: n2: task 1: Killed``: a launcher
    killed outright, which leaves no exits record); None for an exit code or any other line."""
    m = SRUN_TASK.match(line)
    name = _SIGNAL_TEXT.get(m.group(2)) if m else None
    return (m.group(1), name) if m and name else None


def parse_job_record(text: str) -> dict[str, str]:
    """``scontrol -o show job``'s one line as ``{key: value}`` (values may hold spaces)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z:/]+)=(.*?)(?=\s[A-Za-z:/]+=|$)", text)}


_NULL = ("", "(null)", "None", "NONE", "UNLIMITED", "N/A")


def excluded_nodes(record: Mapping[str, str], add: Sequence[str]) -> list[str]:
    """The job's ``ExcNodeList`` with ``add`` merged in (its own exclusions kept)."""
    out = [x for x in record.get("ExcNodeList", "").split(",") if x and x not in _NULL]
    return out + [x for x in add if x not in out]


def eligible_nodes(states: Mapping[str, NodeState], exclude: Iterable[str]) -> int:
    """How many nodes of a partition or reservation (``states``) could run the job once ``exclude`` is left out:
    not down, drained, failing or not responding."""
    gone = set(exclude)
    return sum(1 for node, st in states.items() if node not in gone and not _BAD.search(st.state))


# ---------------------------------------------------------------- NODE_FAIL


@dataclass(frozen=True)
class RunRecord:
    """One run of the job as the runtime recorded it (``runs.tsv``): ``end`` None when it never got to
    record one (its batch host died, or Slurm killed it), ``outcome`` how it ended."""

    job: str
    restart: int
    nodes: tuple[str, ...]
    start: float
    end: float | None = None
    outcome: str = ""  # completed, failed, stop-saved, TERM, USR1, excluded


@dataclass(frozen=True)
class NodeState:
    state: str  # sinfo's %T: idle, allocated, down*, drained, ...
    since: float | None  # when the reason was set (sinfo's %H), epoch seconds


_BAD = re.compile(r"^(down|drain|fail|not_responding|unknown)|\*$")
_DOWN = re.compile(r"^(down|fail|not_responding)|\*$")  # the node itself died, whatever the run did


def node_lost(state: str) -> bool:
    """Whether sinfo's state says the node itself is gone (down, failing, not responding), whatever its jobs."""
    return bool(_DOWN.search(state))


QUIET_OUTCOMES = ("stop-saved", "TERM", "USR1", "completed", "excluded", "requeued")


def node_fail_culprits(previous: RunRecord | None, states: Mapping[str, NodeState], now: float) -> list[str]:
    """The nodes of the previous run that failed DURING it: down or drained now, with the reason set between
    its start and its end (or now, when it never recorded an end). A node drained after the run ended is not
    this job's fault; neither is a node that is fine now. A run that ended on its own terms (stop-save, a
    signal, completion, an exclusion) blames only nodes that went down (a dead node's ranks may still have
    saved; a drain during a preempted run is the admins' business, not a fault)."""
    if previous is None:
        return []
    end = previous.end if previous.end is not None else now
    out = []
    for node in previous.nodes:
        st = states.get(node)
        if st is None or not _BAD.search(st.state):
            continue
        if previous.outcome in QUIET_OUTCOMES and not _DOWN.search(st.state):
            continue
        if st.since is None or previous.start - 60 <= st.since <= end + 60:
            out.append(node)
    return out


def parse_runs(text: str) -> list[RunRecord]:
    """``runs.tsv`` back into records (a line per start; a later line of the same start adds its end)."""
    runs: dict[tuple[str, int], RunRecord] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not parts[1].isdigit():
            continue
        job, restart = parts[0], int(parts[1])
        end = float(parts[4]) if len(parts) > 4 and parts[4] else None
        runs[(job, restart)] = RunRecord(
            job, restart, tuple(x for x in parts[2].split(",") if x), float(parts[3]), end,
            parts[5] if len(parts) > 5 else "",
        )  # fmt: skip
    return list(runs.values())


# ---------------------------------------------------------------- after the ranks exit


@dataclass(frozen=True)
class AfterExit:
    action: str  # "requeue", "exit"
    say: str


# (signal, exit status is 0, a stop-save was written) -> what to do. A TERM is Slurm's: a cancel stays cancelled,
# a preemption or time limit requeues through Slurm by itself; USR1 is ours: requeue after the save, or without
# it when the ranks failed (they resume from the newest checkpoint).
_TERM = AfterExit("exit", "got TERM: not requeueing (a cancel stays cancelled; a preemption requeues through Slurm)")
_SAVED = AfterExit("requeue", "requeueing job {job} after the stop-save ({saved})")
_QUIET = AfterExit("exit", "")
AFTER_EXIT: dict[tuple[str | None, bool, bool], AfterExit] = {
    ("TERM", True, True): _TERM,
    ("TERM", True, False): _TERM,
    ("TERM", False, True): _TERM,
    ("TERM", False, False): _TERM,
    ("USR1", True, True): _SAVED,
    ("USR1", False, True): AfterExit(
        "requeue", "got USR1, the ranks exited with status {status} after a stop-save: requeueing job {job}"
    ),
    ("USR1", False, False): AfterExit(
        "requeue",
        "got USR1, the ranks exited with status {status} without a stop-save: requeueing job {job} (it resumes "
        "from its newest checkpoint)",
    ),
    ("USR1", True, False): AfterExit("exit", "got USR1 but training finished first: not requeueing"),
    (None, True, True): _SAVED,
    (None, True, False): _QUIET,
    (None, False, True): _QUIET,
    (None, False, False): _QUIET,
}


def after_exit(signal: str | None, status: int, saved: bool) -> AfterExit:
    """What the batch step does once the ranks have exited (:data:`AFTER_EXIT`)."""
    return AFTER_EXIT[(signal, status == 0, saved)]


def outcome(signal: str | None, status: int, saved: bool) -> str:
    """How a run ended, for ``runs.tsv`` (NODE_FAIL accounting reads it)."""
    if saved:
        return "stop-saved"
    if signal:
        return signal
    return "completed" if status == 0 else "failed"


# ---------------------------------------------------------------- the save and the signals


def kill_wait_problem(save_seconds: float, kill_wait: float | None, grace: float | None) -> str:
    """One line when a TERM (time limit, scancel, a preemption without ``send_user_signal``) leaves the ranks
    less time than the model's stop-save: Slurm sends SIGKILL ``KillWait`` seconds after TERM (a preemption:
    the partition's ``GraceTime``)."""
    if not save_seconds:
        return ""
    short = [
        f"{name}={int(v)} s"
        for name, v in (("KillWait", kill_wait), ("GraceTime", grace))
        if v is not None and v < save_seconds
    ]
    if not short:
        return ""
    return (
        f"this site's {' and '.join(short)} is shorter than this model's stop-save (~{save_seconds:.0f} s): a TERM "
        "(scancel, a preemption) gets KILL before its save completes. Fixes: USR1 first (the --signal lead covers "
        "the time limit; PreemptParameters=send_user_signal a preemption), a faster writer, or a KillWait/GraceTime "
        "of at least the save"
    )  # fmt: skip


def hang_min_seconds(save_seconds: float, floor: float = 600.0) -> float:
    """The hang watch's floor: no step for this long is a hang only when it also exceeds the model's
    stop-save time (a save is never a hang), with a margin of half again."""
    return max(floor, 1.5 * save_seconds)


def dump_wait_seconds(world_size: int) -> float:
    """How long the ranks' dumps may take to land on a shared filesystem: grows with the world size (NFS at
    1,024 ranks is not NFS at 2)."""
    return 26.0 + world_size / 16


def stop_check_every(step_seconds: float | None, lead_seconds: float, save_seconds: float) -> int:
    """Steps between two stop agreements (each an all-reduce and a host sync): as rare as the lead time allows
    -- the stop must still be seen and the save finished before the time limit -- and at least every step when
    the step time is unknown or the margin is thin."""
    if not step_seconds or step_seconds <= 0:
        return 1
    margin = lead_seconds - save_seconds - 2 * step_seconds
    return max(1, min(100, int(margin / 4 / step_seconds)))


# ---------------------------------------------------------------- the user's quota, the preemption grace, the stop


@dataclass(frozen=True)
class Quota:
    """The user's quota where the run folder is: bytes used, the limit (the hard one, else the soft one), the tool."""

    used: int
    limit: int
    tool: str

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)

    def line(self) -> str:
        return f"{self.used / 1e9:.1f} of {self.limit / 1e9:.1f} GB of your quota used ({self.tool})"


_KIB_POWERS = {"": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}  # a bare figure counts 1 KiB blocks


def quota_bytes(cell: str) -> int | None:
    """A space figure of ``lfs quota -h`` / ``quota -s`` in bytes: ``792.3M``, ``0k``, ``9.537T``, ``4883M``,
    ``30.4M*`` (over the soft quota), ``[1041408]`` (Lustre: not every target answered), a bare count of KiB."""
    m = re.fullmatch(r"\[?([\d.]+)([kKMGTPE]?)\]?\*?", cell)
    return int(float(m.group(1)) * 1024 ** _KIB_POWERS[m.group(2).upper()]) if m else None


def parse_quota(text: str, tool: str) -> Quota | None:
    """The first filesystem row of ``lfs quota -u USER -h PATH`` or ``quota -s -f MOUNT`` (both: ``Filesystem``,
    used, soft quota, hard limit, grace, files...; a long filesystem name alone on its line, the figures on the
    next). None: no row (``...: none``), or no limit."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:1] != ["Filesystem"] or i + 1 >= len(lines):
            continue
        words = lines[i + 1].split()
        if len(words) == 1 and i + 2 < len(lines):
            words += lines[i + 2].split()
        used, soft, hard = (quota_bytes(w) for w in (words + ["", "", ""])[1:4])
        limit = hard or soft
        return Quota(used, limit, tool) if used is not None and limit else None
    return None


def preemption_grace(preempt_type: str, partition_grace: float | None, qos_grace: float | None) -> float | None:
    """The ``GraceTime`` a preemption leaves between TERM and KILL: the QOS's where Slurm preempts by QOS
    (``PreemptType=preempt/qos``), else the partition's; None where Slurm preempts nothing."""
    if preempt_type in ("", "preempt/none"):
        return None
    return qos_grace if preempt_type == "preempt/qos" else partition_grace


STEP_SECONDS = 60  # the step in flight when the signal comes (a step of up to a minute)
REQUEUE_SECONDS = 10  # the runtime's signal handler, the ranks' agreement on the flag, scontrol requeue
MIN_SIGNAL_SECONDS = 120  # never less than two minutes on a GPU profile (the step and the requeue dominate)


def stop_lead_seconds(save_seconds: float) -> int:
    """The ``--signal`` lead a stop-save of ``save_seconds`` needs: the step in flight, the save and the requeue,
    rounded up to the minute, at least :data:`MIN_SIGNAL_SECONDS` (the planner's lead time is this)."""
    return max(MIN_SIGNAL_SECONDS, 60 * math.ceil((STEP_SECONDS + REQUEUE_SECONDS + save_seconds) / 60))


def own_stop_in(signal_lead: float, save_seconds: float, limit: float | None, elapsed: float) -> float | None:
    """Seconds from now until the runtime raises the stop itself: the model picked at run time (the FSDP script's
    ``MODEL``) saves for longer than the job's ``--signal`` lead allows (it is sized for the default model). None:
    the signal comes early enough, the time limit is unknown, or the lead would take half of it."""
    need = stop_lead_seconds(save_seconds) if save_seconds else 0
    if not limit or need <= signal_lead or need * 2 > limit:
        return None
    return max(0.0, limit - elapsed - need)


# ---------------------------------------------------------------- the shared run folder


def unshared_node(nodes: Sequence[str], unseen: Mapping[str, Sequence[str]]) -> str | None:
    """The one node without the shared run folder: at least two other nodes reported, each misses that node's
    probe file and no other (they see each other's); its own report is on its local disk, or misses its peers'.
    ``unseen``: each reporting node's peers whose probe it cannot see. None: everyone sees everyone, or no single
    node fits (two nodes that miss each other: either may be the one)."""
    suspects = {y for x in nodes if x in unseen for y in unseen[x]}
    if len(suspects) != 1:
        return None
    (odd,) = suspects
    others = [x for x in nodes if x in unseen and x != odd]
    return odd if len(others) >= 2 and all(list(unseen[x]) == [odd] for x in others) else None


def name_unshared(nodes: Sequence[str], reports: Mapping[str, NodeReport]) -> dict[str, NodeReport]:
    """``reports`` with the node that lacks the shared run folder (:func:`unshared_node`) failing its own check
    and its peers' "not shared" failures -- its fault -- taken back; unchanged when no single node is it."""
    unseen = {x: r.unseen for x, r in reports.items() if r.unseen is not None}
    odd = unshared_node(nodes, unseen)
    if odd is None:
        return dict(reports)
    out = {x: replace(r, failures=tuple(f for f in r.failures if "is not shared" not in f)) for x, r in reports.items()}
    why = (f"run folder not shared: none of its {len(nodes) - 1} peers see its files, they see each other's (mount "
           "the shared filesystem there; its ranks would write their checkpoint shards to its local disk)")  # fmt: skip
    out[odd] = replace(out.get(odd, NodeReport()), failures=(*out.get(odd, NodeReport()).failures, why))
    return out
