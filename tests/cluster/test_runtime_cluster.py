"""The job runtime (``cookbook_runtime.run``) on real Slurm, with a real 2-node FSDP job (local-cpu):

- a fault every node shares (here the gate's matmul floor, failed alike by all) excludes no node: the log says
  so in one line and the job trains; a node the gate does blame (n2, an injected bad link) on this 2-node cluster
  with no spare is named, and the job trains on it: it neither pends for ever nor exits;
- a TERM (``scancel``) whose stop-save is slowed to 40 s completes that save on a cluster whose ``KillWait``
  gives it the time (the private ``nodes3`` cluster: 60 s), and a job whose save is longer than the site's
  ``KillWait`` (the shared cluster: 5 s) says so plainly at its start;
- a ``VENV`` without ``bin/python3`` stops the script in one line, exit 2, before it writes anything (#41 item 7);
- nodes whose Python lacks torch stop the job in one line (the nodes, the fix) and no node is excluded; on
  ``nodes3`` NodeNames do not resolve (host names ip-10-83-0-N) and the rendezvous is an address;
- a recipe folder copied with the runtime trains in a Python environment that holds torch and the
  framework's libraries but not the ``cookbook`` package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cluster_wait import wait_for
from fsdp_job import fsdp_spec as _spec

from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BATCH = re.compile(r"Batch (\d+) Loss")


def _edit(script: Path, old: str, new: str) -> None:
    text = script.read_text()
    assert old in text, old
    script.write_text(text.replace(old, new, 1))


def test_a_term_save_slowed_to_40_s_completes_where_kill_wait_covers_it(nodes3_cluster, tiny_assets, job_dir: Path):
    slurm = SlurmClient({**nodes3_cluster.env(), "COOKBOOK_PREFLIGHT": "0", "COOKBOOK_TEST_SLOW_SAVE_S": "40"})
    assert re.search(r"^KillWait\s*=\s*60 sec", slurm.run("scontrol", "show", "config").stdout, re.M)
    script = write_job(_spec(job_dir, tiny_assets, "term-save", 200, throttle=0.5), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()  # Slurm creates no folder for --output
    _edit(script, "  --requeue", "  --requeue --save-seconds=40")
    job = slurm.submit(script)
    log_path = job_dir / "logs" / f"term-save-{job}.out"
    wait_for(lambda: len(BATCH.findall(read_output(log_path))) >= 2, 300, "two training steps")
    slurm.run("scancel", job)  # TERM to every process of the job; SIGKILL KillWait (60 s) later
    info = slurm.wait(job, timeout=200)
    log = read_output(log_path)
    assert info.state == "CANCELLED", f"{info}\n{log[-3000:]}"
    assert "cookbook: got TERM" in log, log[-3000:]
    saved = re.search(r"cookbook: saved at step (\d+) for preemption: (\S+)", log)
    assert saved, log[-3000:]
    assert (Path(saved.group(2)) / "COMPLETE").is_file()
    assert "is shorter than this model's stop-save" not in log  # 60 s covers a 40 s save
    # #30 item 3: nodes3's NodeNames resolve nowhere (host names ip-10-83-0-N): the rendezvous is an address
    seen = slurm.run("srun", "-N1", "-w", "n1", "sh", "-c", "hostname; getent hosts n1 || echo unresolvable").stdout
    assert seen.split() == ["ip-10-83-0-1", "unresolvable"], seen
    assert re.search(r"rendezvous 10\.83\.0\.\d+:\d+", log), log[:2000]


def test_nodes_whose_python_lacks_torch_stop_the_job_in_one_line_and_no_node_is_excluded(slurm, tiny_assets, job_dir):
    """#30 item 1: VENV names an environment without torch (a fresh login shell, SBATCH_EXPORT=NONE): the runtime
    (standard library) starts, asks every node's Python, and stops before the gate with the nodes and the fix."""
    bare = job_dir / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    script = write_job(_spec(job_dir, tiny_assets, "no-torch", 20), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = SlurmClient({**slurm.env, "VENV": str(bare)}).submit(script)
    info = slurm.wait(job, timeout=120)
    log = read_output(job_dir / "logs" / f"no-torch-{job}.out")
    assert info.state == "FAILED" and info.exit_code.startswith("2"), f"{info}\n{log}"
    (stop,) = [line for line in log.splitlines() if "not training" in line]
    assert re.match(rf"cookbook: the Python environment of n1,n2 \({bare}/bin/python3, \w+\) lacks torch", stop), log
    assert "no node is excluded" in stop and "VENV=" in stop
    assert "pre-flight" not in log and "excluding" not in log and "launching" not in log, log


def test_a_venv_without_python3_stops_the_job_in_one_line_before_it_writes(slurm, tiny_assets, job_dir):
    """#41 item 7: VENV=/nowhere (a typo, a venv of another machine not mounted here): the script's own check."""
    script = write_job(_spec(job_dir, tiny_assets, "no-venv", 20), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = SlurmClient({**slurm.env, "VENV": str(job_dir / "nowhere")}).submit(script)
    info = slurm.wait(job, timeout=120)
    log = read_output(job_dir / "logs" / f"no-venv-{job}.out")
    assert info.state == "FAILED" and info.exit_code.startswith("2"), f"{info}\n{log}"
    assert log.strip() == log.strip().splitlines()[0], log  # one line
    assert log.startswith(f"VENV={job_dir}/nowhere has no bin/python3: "), log
    assert not (job_dir / "run").exists(), "nothing written: the script stopped before mkdir -p RUN_DIR"


def test_rehearse_names_each_node_whose_python_lacks_torch(slurm, tiny_assets, job_dir):
    """#30 item 1, the rehearsal's side: the same script and environment, rehearsed, fails naming every node,
    the interpreter and the fix (nothing trains, nothing is excluded)."""
    from cookbook.rehearsal import rehearse

    bare = job_dir / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    script = write_job(_spec(job_dir, tiny_assets, "no-torch-rehearsal", 20), job_dir / "job.sbatch")
    report = rehearse(script, slurm, timeout=180, folder=job_dir / "rehearsal", env={"VENV": str(bare)})
    assert not report.ok and [n.node for n in report.nodes] == ["n1", "n2"], report.table()
    for node in report.nodes:
        said = [p for p in node.failures if p.startswith(f"torch is not installed for {bare}/bin/python3")]
        assert said and "VENV=" in said[0], report.table()


def _environment_without_cookbook(env: Path) -> None:
    """A venv at ``env`` that sees this one's libraries (torch, transformers, datasets) through a path entry, which
    does not run their ``.pth`` files: the editable ``cookbook`` install is not importable there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next(env.glob("lib/python3*/site-packages"))
    (site / "libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = "import importlib.util as u; print(bool(u.find_spec('torch')), bool(u.find_spec('cookbook')))"
    out = subprocess.run([env / "bin" / "python", "-c", probe], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.split() == ["True", "False"], out.stdout


@pytest.fixture(scope="module")
def copied(slurm, tiny_assets, tmp_path_factory) -> tuple[Path, str, str]:
    """One 2-node job of a copied recipe folder (slurm-recipes/fsdp + cookbook_runtime beside it, as shipped),
    in a venv without ``cookbook``, its script edited as a user may: a matmul floor no node reaches (a fault
    every node shares, nobody to blame) and a 40 s stop-save (longer than the shared cluster's KillWait of 5 s).
    Returns (its run folder, its job id, its log)."""
    checkout = tmp_path_factory.mktemp("copied") / "checkout"
    recipes = Path(__file__).resolve().parents[2] / "slurm-recipes"
    shutil.copytree(recipes / "fsdp", checkout / "slurm-recipes" / "fsdp")
    shutil.copytree(recipes / "cookbook_runtime", checkout / "slurm-recipes" / "cookbook_runtime")
    (checkout / ".cache").mkdir()
    (checkout / ".cache" / "tiny").symlink_to(tiny_assets.root)
    _environment_without_cookbook(checkout / ".venv")  # where the script looks: $RECIPE_DIR/../../.venv
    folder = checkout / "slurm-recipes" / "fsdp"
    script = folder / "fsdp.local-cpu.sbatch"
    _edit(script, "--gate-matmul-min-tflops=0.0005", "--gate-matmul-min-tflops=100000")
    _edit(script, "  --requeue", "  --requeue --save-seconds=40")
    r = subprocess.run(["sbatch", "--parsable", script.name], cwd=folder, env=slurm.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    info = slurm.wait(job, timeout=500)
    log = read_output(folder / f"fsdp-local-cpu-{job}.out")
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
    return folder / "runs" / "fsdp-llama3_1_8b-local-cpu", job, log


def test_a_copied_recipe_folder_trains_without_the_cookbook_package(copied):
    _, _, log = copied
    assert "cookbook: pre-flight took" in log and "No module named" not in log, log[-3000:]
    assert [int(s) for s in BATCH.findall(log)] == list(range(1, 21))  # the script's own MAX_STEPS, tiny shape


def test_a_fault_every_node_shares_excludes_no_node_and_the_job_trains(copied):
    run_dir, _, log = copied
    assert re.search(r"cookbook: pre-flight: .*No node is blamed for it: training anyway", log), log[-3000:]
    assert "cookbook: excluding" not in log and "Submitted batch job" not in log


def test_a_node_blamed_at_the_gate_with_no_spare_and_no_room_is_trained_on(slurm, tiny_assets, job_dir: Path):
    """A 2-node job on this 2-node cluster whose gate blames n2 (an injected bad link): excluding n2 would leave the
    job pending for ever, and there is no spare: the job names n2 and trains on it, to the end."""
    client = SlurmClient({**slurm.env, "COOKBOOK_PREFLIGHT_INJECT": "n2:bad link"})
    script = write_job(_spec(job_dir, tiny_assets, "blamed-no-room", 3), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    job = client.submit(script)
    info = client.wait(job, timeout=400)
    log = read_output(job_dir / "logs" / f"blamed-no-room-{job}.out")
    assert info.state == "COMPLETED", f"{info}\n{log[-3000:]}"
    said = ("cookbook: keeping n2 (pre-flight: bad link (injected by COOKBOOK_PREFLIGHT_INJECT)): no spare left (0 for "
            "1); excluding would leave the job pending (only 1 eligible node(s) for 2); training on it")  # fmt: skip
    assert said in log, log[-3000:]
    assert max(int(b) for b in BATCH.findall(log)) == 3 and "requeue" not in log.split(said)[1], log[-3000:]


def test_a_save_longer_than_kill_wait_is_said_at_the_start(copied):
    _, _, log = copied
    assert "cookbook: this site's KillWait=5 s is shorter than this model's stop-save (~40 s)" in log, log[:3000]
