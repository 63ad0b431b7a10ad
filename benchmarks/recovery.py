"""Recovery inside the allocation (issue #40): how long a node fault costs a 2-node job with 1 spare.

    python benchmarks/recovery.py [--cases titan-crash,titan-lost,lora-crash,lora-lost] [--out out/benchmarks]

On the private 3-node local cluster ``nodes3`` (brought up if it is down; root), one job at a time (each needs
all 3 nodes): torchtitan llama3 (``llama3_8b_c4``) and torchtune LoRA (``llama3_3_70b_lora``), tiny models on the
``local-cpu`` profile, ``--nodes 2 --spare-nodes 1``. Each job meets one fault once it has trained past a
checkpoint: a **crash** (every training process of the non-head node SIGKILLed) or a **lost node** (that node's
veth taken down; restored after the recovery, and what is left of the lost step in its netns killed).

For each: seconds from the fault to the first step of the relaunched ranks, split into detection (fault to the
end of the ranks' step), stop/decide (step end to the runtime's decision) and relaunch + restore (decision to the
first new step) from ``recoveries.tsv`` and the log's timestamps (torchtune's steps have none: the poll's time);
the steps redone against the checkpoint interval, the job id throughout, the final state, and whether the redone
step's loss is the first run's. Goals: crash <= 60 s, lost node <= 180 s, steps redone <= one interval.
A table on stdout, everything in ``OUT/recovery.json``; the run folders stay under ``OUT/recovery/``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cookbook.analysis.starts import split_starts
from cookbook.slurm.client import SlurmClient
from cookbook_runtime.decide import Incident, parse_incidents
from cookbook_runtime.files import START, recoveries

ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([\d.]+)")
TITAN_TIMED = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?step:\s+(\d+)\s+loss:")
TUNE_STEP = re.compile(r"Step (\d+) \| loss:([\d.]+)")
RECOVERED = re.compile(r"cookbook: recovery: (\S+) \((.*?)\) replaced by spare (\S+) in job (\d+)")
GOALS = {"crash": 60.0, "lost": 180.0}


@dataclass(frozen=True)
class Case:
    name: str
    framework: str
    recipe: str
    fault: str  # crash | lost
    overrides: dict[str, str]
    interval: int  # checkpoint interval, steps
    last: int  # the run's last step
    ready_step: int  # fault once this step is done and a checkpoint exists


TITAN = {"training.steps": "14", "checkpoint.interval": "3", "metrics.log_freq": "1"}
LORA = {"epochs": "1", "max_steps_per_epoch": "12", "save_every_n_steps": "2", "throttle_seconds": "0.3"}
CASES = {
    "titan-crash": Case("titan-crash", "torchtitan llama3", "llama3_8b_c4", "crash", TITAN, 3, 14, 4),
    "titan-lost": Case("titan-lost", "torchtitan llama3", "llama3_8b_c4", "lost", TITAN, 3, 14, 4),
    "lora-crash": Case("lora-crash", "torchtune LoRA", "llama3_3_70b_lora", "crash", LORA, 2, 12, 3),
    "lora-lost": Case("lora-lost", "torchtune LoRA", "llama3_3_70b_lora", "lost", LORA, 2, 12, 3),
}


@dataclass
class Result:
    case: str
    framework: str
    fault: str
    job_id: str = ""
    nodes: str = ""
    victim: str = ""
    spare: str = ""
    queued_s: float = 0.0  # submission to the job's start (another job may hold the cluster)
    to_first_step_s: float | None = None
    detection_s: float | None = None  # the fault to the end of the ranks' step
    stop_decide_s: float | None = None  # the step's end to the decision
    relaunch_restore_s: float | None = None  # the decision to the first new step
    runtime_saw_fault_s: float | None = None  # our fault to the runtime's fault_at (the exit record, the watch)
    first_step_from: str = ""  # log (the framework's timestamp) or poll
    interval: int = 0
    last_before: int | None = None
    resumed_at: int | None = None
    steps_redone: int | None = None
    same_job: bool = False
    incidents: int = 0
    state: str = ""
    redone_loss_equal: bool | None = None
    losses: list[dict[str, float]] = field(default_factory=list)
    run_dir: str = ""
    error: str = ""

    def goals(self) -> dict[str, bool]:
        took = self.to_first_step_s
        return {
            "time": took is not None and took <= GOALS[self.fault],
            "redone": self.steps_redone is not None and self.steps_redone <= self.interval,
            "completed": self.state == "COMPLETED" and self.same_job,
        }


def text(path: Path) -> str:
    return _ANSI.sub("", path.read_text(errors="replace")) if path.exists() else ""


def wait_for(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.5) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)


def cluster_idle(cluster: Any, client: SlurmClient) -> bool:
    """No job on ``nodes3`` (another engineer's tests share it) and every node up and idle."""
    queue = client.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    states = client.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
    return not queue and all(line.split()[-1] == "idle" for line in states if line.strip()) and cluster.status().up


def ranks_on(cluster: Any, node: str, run_dir: Path) -> list[int]:
    """The training processes (not the launcher) of ``run_dir``'s job on ``node`` (its network namespace)."""
    return list(cluster.processes_on(node, str(run_dir)))


def runs_of(case: Case, job: Any) -> list[dict[int, float]]:
    """Step -> loss of each launch of the ranks (torchtitan: the log's starts; torchtune: one DiskLogger file each)."""
    if case.recipe.startswith("llama3_8b"):
        parts = [{int(s): float(v) for s, v in TITAN_STEP.findall(p)} for _, p in split_starts(text(job.log))]
        return [r for r in parts if r]
    logs = sorted(job.run_dir.glob("logs/log_*.txt"), key=lambda p: p.stat().st_mtime)
    return [r for r in ({int(s): float(v) for s, v in TUNE_STEP.findall(text(p))} for p in logs) if r]


def first_logged_step_time(job: Any) -> float | None:
    """Epoch seconds of the first torchtitan step after the relaunch, from the framework's own timestamp."""
    after = text(job.log).split("cookbook: relaunching on", 1)
    if len(after) < 2 or not (m := TITAN_TIMED.search(after[1])):
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_case(case: Case, res: Result, cluster: Any, client: SlurmClient, assets: Path, root: Path) -> None:
    """Submit the case's job, fault its non-head node once it is ready, and record the recovery in ``res``."""
    job = submit_case(case, res, cluster, client, assets, root)
    wait_ready(case, job, client)
    m = START.search(text(job.log))  # the runtime's start line: its nodes in Slurm's hostlist form
    assert m and m.group(3), text(job.log)[-2000:]
    head, other = client.hostnames(m.group(3))
    res.nodes, res.victim = f"{head},{other}", other
    fault, first_seen = fault_until_relaunched(case, cluster, client, job, other)
    info = client.wait(job.job_id, timeout=600)
    res.state = info.state
    record_recovery(case, res, job, fault, first_seen)
    record_losses(case, res, job)


def submit_case(case: Case, res: Result, cluster: Any, client: SlurmClient, assets: Path, root: Path) -> Any:
    """Submit the case's job once ``nodes3`` is idle and wait for it to start; its id and queue time in ``res``."""
    from cookbook.walkthrough import job_spec, submit

    wait_for(lambda: cluster_idle(cluster, client), 1800, "nodes3 to be idle (no job, 3 nodes idle)", poll=5)
    spec = job_spec(case.recipe, profile="local-cpu", nodes=2, spare_nodes=1, job_name=f"rec-{case.name}",
                    overrides=dict(case.overrides), assets_dir=str(assets))  # fmt: skip
    submitted = time.time()
    job = submit(spec, root=root, client=client)
    res.job_id, res.run_dir = str(job.job_id), str(job.run_dir)
    print(f"{case.name}: job {job.job_id}, run dir {job.run_dir}", flush=True)
    wait_for(lambda: client.state(job.job_id).state not in ("PENDING", "CONFIGURING"), 1800, "the job to start", 1)
    res.queued_s = round(time.time() - submitted, 1)
    return job


def wait_ready(case: Case, job: Any, client: SlurmClient) -> None:
    """Wait until the job runs, has saved a checkpoint and has done the case's ``ready_step``."""

    def ready() -> bool:
        state = client.state(job.job_id)
        if state.done:
            raise RuntimeError(f"job ended before the fault: {state}\n{text(job.log)[-2000:]}")
        runs = runs_of(case, job)
        saved = any((job.run_dir / "checkpoint").glob("step-*/.metadata")) or any(
            job.run_dir.glob("step_*/recipe_state/recipe_state.pt")
        )
        return state.state == "RUNNING" and saved and bool(runs) and max(runs[0]) >= case.ready_step

    wait_for(ready, 600, f"step {case.ready_step} after a checkpoint", poll=0.3)


def fault_until_relaunched(
    case: Case, cluster: Any, client: SlurmClient, job: Any, other: str
) -> tuple[float, float | None]:
    """Crash or cut ``other`` and wait for the relaunched ranks' first step: (fault time, when it was seen)."""
    veth = f"{cluster.cfg.netns_prefix}v{other[1:]}"
    first_seen: float | None = None
    try:
        if case.fault == "crash":
            victims = ranks_on(cluster, other, job.run_dir)
            assert victims, f"no training process of {job.run_dir} on {other}"
            fault = time.time()
            subprocess.run(["kill", "-KILL", *map(str, victims)], check=False)
        else:
            fault = time.time()
            subprocess.run(["ip", "link", "set", veth, "down"], check=True)

        def relaunched_step() -> bool:
            nonlocal first_seen
            runs = runs_of(case, job)
            if RECOVERED.search(text(job.log)) and len(runs) >= 2:
                first_seen = time.time()
                return True
            if client.state(job.job_id).done:
                raise RuntimeError(f"job ended without a new step\n{text(job.log)[-3000:]}")
            return False

        wait_for(relaunched_step, 300 if case.fault == "lost" else 240, "the first step after the recovery", 0.3)
    finally:
        if case.fault == "lost":
            subprocess.run(["ip", "link", "set", veth, "up"], check=False)
            for pid in ranks_on(cluster, other, job.run_dir):  # what is left of the lost step there
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
    return fault, first_seen


def record_recovery(case: Case, res: Result, job: Any, fault: float, first_seen: float | None) -> None:
    """The spare, same-job check, incidents and the fault's seconds by part, from the log and recoveries.tsv."""
    log = text(job.log)
    rec = RECOVERED.search(log)
    if rec:
        res.spare = rec.group(3)
    starts = [jid for jid, _ in split_starts(log)]
    res.same_job = rec is not None and rec.group(4) == res.job_id and set(starts) == {res.job_id}
    res.same_job &= "Submitted batch job" not in log and "sbatch" not in log.split("cookbook: recovery:", 1)[-1]
    incidents: list[Incident] = parse_incidents(text(recoveries(job.run_dir)))
    res.incidents = len(incidents)
    logged = first_logged_step_time(job) if case.recipe.startswith("llama3_8b") else None
    first = logged or first_seen
    res.first_step_from = "log" if logged else "poll"
    if first is not None:
        res.to_first_step_s = round(first - fault, 1)
    if incidents:
        inc = incidents[0]
        res.detection_s = round(inc.ended_at - fault, 1)
        res.stop_decide_s = round(inc.when - inc.ended_at, 1)
        res.runtime_saw_fault_s = round(inc.fault_at - fault, 1)
        if first is not None:
            res.relaunch_restore_s = round(first - inc.when, 1)


def record_losses(case: Case, res: Result, job: Any) -> None:
    """Each launch's losses, the steps redone, and whether the first redone step's loss is the first run's."""
    runs = runs_of(case, job)
    res.losses = [{str(k): v for k, v in r.items()} for r in runs]
    if len(runs) >= 2:
        res.last_before, res.resumed_at = max(runs[0]), min(runs[1])
        res.steps_redone = max(0, max(runs[0]) - min(runs[1]) + 1)
        redone = sorted(set(runs[0]) & set(runs[1]))
        if redone:
            s = redone[0]
            res.redone_loss_equal = abs(runs[1][s] - runs[0][s]) <= 1e-3 * max(abs(runs[0][s]), 1e-9)


def ensure_cluster() -> tuple[Any, SlurmClient]:
    from cookbook.local.cluster import ClusterConfig, LocalCluster

    cluster = LocalCluster(ClusterConfig.named("nodes3"))
    if not cluster.status().up:
        cluster.up()
    return cluster, SlurmClient(cluster.env())


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(results: list[Result]) -> str:
    head = ("| case | job | fault -> first new step (goal) | detection | stop/decide | relaunch + restore "
            "| steps redone (interval) | redone loss equal | state, same job |")  # fmt: skip
    lines = [head, "| " + " | ".join(["---"] * 9) + " |"]
    for r in results:
        if r.error:
            lines.append(f"| {r.case} | {r.job_id} | error: {r.error.splitlines()[0][:80]} |" + " |" * 6)
            continue
        ok = r.goals()
        lines.append(
            f"| {r.framework}, {'crash (SIGKILL)' if r.fault == 'crash' else 'lost node (veth down)'} | {r.job_id} "
            f"| {_s(r.to_first_step_s)} s (<= {GOALS[r.fault]:.0f}: {'met' if ok['time'] else 'MISSED'}) "
            f"| {_s(r.detection_s)} s | {_s(r.stop_decide_s)} s | {_s(r.relaunch_restore_s)} s ({r.first_step_from}) "
            f"| {r.steps_redone} ({r.interval}; resumed at {r.resumed_at} after {r.last_before}) "
            f"| {'-' if r.redone_loss_equal is None else 'yes' if r.redone_loss_equal else 'NO'} "
            f"| {r.state}, {'yes' if r.same_job else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "benchmarks")
    args = ap.parse_args()
    from cookbook.local.assets.tiny import ensure_tiny_assets

    cases = [CASES[c] for c in args.cases.split(",") if c]
    assets = ensure_tiny_assets()
    cluster, client = ensure_cluster()
    root = (args.out / "recovery").resolve()
    root.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for case in cases:
        res = Result(case.name, case.framework, case.fault, interval=case.interval)
        try:
            run_case(case, res, cluster, client, Path(assets.root), root)
        except Exception as e:  # noqa: BLE001 -- one case's failure is a row, the others still run
            res.error = f"{type(e).__name__}: {e}"
            if res.job_id:
                client.run("scancel", res.job_id, check=False)
        print(f"{case.name}: {json.dumps({k: v for k, v in asdict(res).items() if k != 'losses'})}", flush=True)
        results.append(res)
        if case.fault == "lost":  # its slurmd answers again once the veth is up: back in service before the next
            wait_for(lambda: cluster.status().up, 600, f"{res.victim or 'the lost node'} back in service", poll=5)
    out = args.out / "recovery.json"
    payload = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "goals_s": GOALS,
        "results": [asdict(r) | {"goals_met": r.goals()} for r in results],
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(table(results))
    print(f"wrote {out}")
    return 0 if all(not r.error and all(r.goals().values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
