"""A Slurm whose controller does not answer is said as such (issue #42, item 6): one line naming the controller,
``SLURM_CONF`` and Slurm's own text, from every command that asks Slurm.

No cluster: Debian's real Slurm commands with a ``slurm.conf`` whose controller port nobody listens on
(``MessageTimeout=1``: each gives up at once), so the failure is Slurm's own. (The same against a stopped
controller of the local cluster: tests/cluster/test_cli_jobs.py, test_local_cluster.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.executor import Job
from cookbook.slurm.client import SlurmClient, SlurmError, SlurmUnreachable, controller

pytestmark = pytest.mark.skipif(shutil.which("squeue") is None, reason="Slurm's commands are not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A slurm.conf naming a controller nobody runs, and the address it names."""
    port = _free_port()
    conf = tmp_path_factory.mktemp("down") / "slurm.conf"
    conf.write_text(
        "ClusterName=down\n"
        f"SlurmctldHost=ctl(127.0.0.1)\nSlurmctldPort={port}\nMessageTimeout=1\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    return conf, f"ctl(127.0.0.1):{port}"


def _said(e: SlurmError, conf: Path, address: str) -> None:
    """The one line: unreachable, the controller and the file naming it, Slurm's own words, what to do."""
    assert isinstance(e, SlurmUnreachable), e
    assert str(e) == e.line == e.stderr and "\n" not in e.line
    assert e.line.startswith("Slurm unreachable: ") and f"{address} (SlurmctldHost of SLURM_CONF={conf})" in e.line
    assert "Unable to contact slurm controller" in e.line or "Unexpected message received" in e.line, e.line


@pytest.mark.parametrize(
    "call",
    [
        lambda c, s: c.state("5"),
        lambda c, s: c.state("5", answer_required=True),
        lambda c, s: c.show_job("5"),
        lambda c, s: c.output_path("5"),
        lambda c, s: c.wait("5", timeout=5),
        lambda c, s: c.submit(s),
        lambda c, s: c.test_only(s),
        lambda c, s: c.cancel("5"),
        lambda c, s: c.requeue("5"),  # scontrol says "Unexpected message received": `scontrol ping` decides
        lambda c, s: c.partitions(),
    ],
    ids="state state-required show_job output_path wait submit test_only cancel requeue partitions".split(),
)
def test_every_client_call_says_slurm_is_unreachable(down, tmp_path, call):
    conf, address = down
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    client = SlurmClient({**os.environ, "SLURM_CONF": str(conf)})
    with pytest.raises(SlurmError) as e:
        call(client, script)
    _said(e.value, conf, address)


def test_the_python_api_job_state_says_it(down, tmp_path):
    conf, address = down
    job = Job("5", tmp_path / "s", tmp_path / "l", tmp_path, "r", "local-cpu", "n",
              client=SlurmClient({**os.environ, "SLURM_CONF": str(conf)}))  # fmt: skip
    with pytest.raises(SlurmUnreachable) as e:
        _ = job.state
    _said(e.value, conf, address)


def test_the_python_api_test_only_says_it(down, tmp_path):
    from cookbook.executor import Executor
    from cookbook.spec import SpecError

    conf, address = down
    executor = Executor(tmp_path, "local-cpu", SlurmClient({**os.environ, "SLURM_CONF": str(conf)}))
    with pytest.raises(
        SpecError,
        match="^invalid job: " + re.escape(f"Slurm unreachable: sbatch got no answer from the controller {address}"),
    ):
        executor.test_only("llama3_8b_c4")


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "5"],
        ["list"],
        ["logs", "5"],
        ["cancel", "5"],
        ["requeue", "5"],
        ["watch", "5"],
        ["diagnose", "5"],
        ["goodput", "5", "--log", "/dev/null"],
        ["submit", "SCRIPT"],
        ["render", "llama3_8b_c4", "--profile", "local-cpu", "-o", "OUT", "--test-only"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_that_asks_slurm_says_it_in_one_line(down, tmp_path, monkeypatch, capsys, argv):
    conf, address = down
    monkeypatch.setenv("SLURM_CONF", str(conf))
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    out = tmp_path / "out" / "job.sbatch"
    assert main([{"SCRIPT": str(script), "OUT": str(out)}.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        ("error: Slurm unreachable: ", "error: invalid job: Slurm unreachable: ")
    )
    assert f"{address} (SlurmctldHost of SLURM_CONF={conf})" in err[0], err
    assert not out.exists()  # render --test-only writes nothing


def test_rehearse_and_a_data_job_say_it_too(down, tmp_path, monkeypatch, capsys):
    conf, address = down
    script, data = tmp_path / "r" / "job.sbatch", tmp_path / "docs.jsonl"
    assert main(["render", "llama3_8b_c4", "--profile", "local-cpu", "-o", str(script)]) == 0
    data.write_text('{"text": "a document"}\n')
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.chdir(tmp_path)  # the data job's default folder, .cookbook-jobs, is made here
    capsys.readouterr()
    for argv in (
        ["rehearse", str(script)],
        ["data", "c4", str(data), "--output-dir", str(tmp_path / "c4"), "--submit"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: Slurm unreachable: "), (argv, err)
        assert f"{address} (SlurmctldHost of SLURM_CONF={conf})" in err[0]
    assert not (tmp_path / ".cookbook-jobs").exists()  # nothing submitted, nothing left behind


def test_the_controller_is_read_from_the_file_slurm_reads(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ControlMachine=head01\n")  # the older key, the default port
    assert controller({"SLURM_CONF": str(conf)}) == f"head01:6817 (SlurmctldHost of SLURM_CONF={conf})"
    conf.write_text("SlurmctldHost=a\nslurmctldhost=b\nSlurmctldPort=7000\n")  # a backup controller; any case
    assert controller({"SLURM_CONF": str(conf)}).startswith("a:7000 or b:7000 ")
    conf.write_text("ClusterName=x\n")
    assert controller({"SLURM_CONF": str(conf)}) == f"(unknown: no SlurmctldHost in SLURM_CONF={conf})"
    assert "SLURM_CONF is unset" in controller({}) or "SLURM_CONF being unset" in controller({})
