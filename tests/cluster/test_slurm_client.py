"""The Slurm client against the real shared local cluster: multi-node jobs, cancel, timeouts, errors."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from cookbook.slurm.client import JobTimeout, SlurmClient, SlurmError, read_output

pytestmark = pytest.mark.cluster


def _script(path: Path, body: str, *sbatch: str) -> Path:
    header = "\n".join(f"#SBATCH {opt}" for opt in sbatch)
    path.write_text(f"#!/bin/bash\n{header}\n{textwrap.dedent(body)}")
    return path


def test_two_node_job_sees_two_hosts_and_reaches_the_head_node_over_tcp(slurm, job_dir):
    # What torchrun's c10d rendezvous needs: the second node opens a TCP connection to the first
    # node's hostname. Node 0 listens, node 1 connects and sends its hostname.
    probe = job_dir / "probe.py"
    probe.write_text(
        textwrap.dedent("""
        import os, socket, subprocess, sys, time
        node = int(os.environ["SLURM_NODEID"])
        head = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                              capture_output=True, text=True, check=True).stdout.split()[0]
        print(f"node={node} host={socket.gethostname()} nnodes={os.environ['SLURM_JOB_NUM_NODES']} head={head}",
              flush=True)
        if node == 0:
            srv = socket.create_server(("0.0.0.0", 29555))
            srv.settimeout(60)
            conn, _ = srv.accept()
            print("head received:", conn.recv(100).decode(), flush=True)
        else:
            for _ in range(100):
                try:
                    c = socket.create_connection((head, 29555), timeout=2)
                    break
                except OSError:
                    time.sleep(0.2)
            else:
                sys.exit("could not connect to the head node")
            c.sendall(socket.gethostname().encode())
            print("connected to head", flush=True)
    """)
    )
    script = _script(
        job_dir / "two_nodes.sbatch",
        f"srun python3 {probe}\n",
        "--nodes=2",
        "--ntasks-per-node=1",
        f"--output={job_dir}/%j.out",
        "--time=2",
    )
    job = slurm.submit(script)
    info = slurm.wait(job, timeout=120)
    out = read_output(job_dir / f"{job}.out")
    assert info.state == "COMPLETED", out
    lines = sorted(ln for ln in out.splitlines() if ln.startswith("node="))
    assert [ln.split()[0] for ln in lines] == ["node=0", "node=1"]
    assert all("nnodes=2" in ln for ln in lines)
    hosts = {ln.split()[1] for ln in lines}
    assert len(hosts) == 2, lines
    assert "connected to head" in out
    node1_host = next(ln.split()[1] for ln in lines if ln.startswith("node=1")).removeprefix("host=")
    assert f"head received: {node1_host}" in out


def test_cancel_ends_a_running_job_cancelled(slurm, job_dir):
    script = _script(job_dir / "sleep.sbatch", "echo started; sleep 300\n", f"--output={job_dir}/%j.out")
    job = slurm.submit(script)
    slurm.wait(job, timeout=60, until=frozenset({"RUNNING"}))
    slurm.cancel(job)
    info = slurm.wait(job, timeout=60)
    assert info.state == "CANCELLED"


def test_job_past_its_time_limit_ends_timeout(slurm, job_dir):
    script = _script(job_dir / "long.sbatch", "sleep 600\n", "--time=1", f"--output={job_dir}/%j.out")
    job = slurm.submit(script)
    info = slurm.wait(job, timeout=180, poll=2)
    assert info.state == "TIMEOUT"
    assert "DUE TO TIME LIMIT" in read_output(job_dir / f"{job}.out")


def test_bad_sbatch_option_gives_slurms_own_error(slurm, job_dir):
    script = _script(job_dir / "ok.sbatch", "true\n")
    with pytest.raises(SlurmError, match="unrecognized option"):
        slurm.submit(script, "--no-such-option")
    with pytest.raises(SlurmError, match="Invalid --time specification"):
        slurm.submit(script, "--time=abc")
    with pytest.raises(SlurmError, match="invalid partition"):
        slurm.submit(script, "--partition=nope")


def test_oversized_request_is_rejected_at_submit_not_left_pending(slurm, job_dir):
    script = _script(job_dir / "big.sbatch", "true\n")
    with pytest.raises(SlurmError, match="Node count specification invalid"):
        slurm.submit(script, "--nodes=5")


def test_state_after_the_job_left_the_queue_comes_from_the_completion_log(slurm, job_dir):
    script = _script(job_dir / "quick.sbatch", "exit 3\n", f"--output={job_dir}/%j.out")
    job = slurm.submit(script)
    info = slurm.wait(job, timeout=60)
    assert info.state == "FAILED" and info.exit_code.startswith("3")
    # sacct -c reads the job-completion log that real clusters without slurmdbd also keep
    rows = slurm.run("sacct", "-c", "-n", "-X", "-P", "-j", job, "-o", "JobID,State").stdout
    assert f"{job}|FAILED" in rows
    # Once slurmctld has forgotten the job (MinJobAge), squeue prints nothing: the client's state comes
    # from sacct (slurmdbd) or, without one as here, from the job-completion log. A squeue that knows
    # no job stands in for the controller after MinJobAge; sacct is the real one.
    forgetful = job_dir / "bin"
    forgetful.mkdir()
    (forgetful / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (forgetful / "squeue").chmod(0o755)
    aged = SlurmClient({**slurm.env, "PATH": f"{forgetful}:{slurm.env['PATH']}"})
    info = aged.state(job)
    assert (info.state, info.source) == ("FAILED", "jobcomp") and info.exit_code.startswith("3")
    with pytest.raises(SlurmError, match="unknown to squeue, sacct and the job-completion log"):
        aged.state("999999")


def test_wait_gives_up_with_the_state_it_saw_and_the_output_tail(slurm, job_dir):
    script = _script(
        job_dir / "slow.sbatch", "for i in 1 2 3 4 5; do echo line $i; done; sleep 30\n", f"--output={job_dir}/%j.out"
    )
    job = slurm.submit(script)
    assert slurm.wait(job, timeout=60, until=frozenset({"RUNNING"})).state == "RUNNING"
    with pytest.raises(JobTimeout, match=f"job {job} still RUNNING after 2 s"):
        slurm.wait(job, timeout=2, until=frozenset({"COMPLETED"}))
    out = job_dir / f"{job}.out"
    for _ in range(100):
        if "line 5" in read_output(out):
            break
        time.sleep(0.2)
    # Read the tail before cancelling: on cancel, slurmstepd appends "*** JOB N ... CANCELLED ***".
    tail = read_output(out, tail_lines=2)
    slurm.cancel(job)
    assert tail == "line 4\nline 5"
    assert read_output(job_dir / "not-there.out") == ""


def test_output_path_is_what_slurm_resolved(slurm, job_dir):
    script = _script(job_dir / "named.sbatch", "echo hello\n", "--job-name=hello", f"--output={job_dir}/%x-%j.out")
    job = slurm.submit(script)
    path = slurm.output_path(job)
    slurm.wait(job, timeout=60)
    assert path == job_dir / f"hello-{job}.out"
    assert read_output(path).strip() == "hello"
