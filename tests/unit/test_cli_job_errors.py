"""The lifecycle verbs' error line without a cluster: a Slurm that cannot find its configuration.

(The verbs against a real cluster: tests/cluster/test_cli_jobs.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from cookbook.cli import main

# what Debian's squeue 24.11 prints on a machine with no slurm.conf and no DNS SRV record (exit 1)
NO_CONFIG = """squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
squeue: error: fetch_config: DNS SRV lookup failed
squeue: error: _establish_config_source: failed to fetch config
squeue: fatal: Could not establish a configuration source
"""


def _slurm_without_config(folder: Path) -> Path:
    """squeue, sacct and scontrol that fail as Slurm's own do without a configuration."""
    folder.mkdir()
    for command in ("squeue", "sacct", "scontrol"):
        text = NO_CONFIG.replace("squeue:", f"{command}:")
        exe = folder / command
        exe.write_text(f"#!/bin/sh\ncat >&2 <<'END'\n{text}END\nexit 1\n")
        exe.chmod(0o755)
    return folder


@pytest.mark.parametrize("verb", [["status", "99999999"], ["list"], ["cancel", "99999999"], ["logs", "99999999"]])
def test_slurm_without_a_configuration_is_one_line(tmp_path, monkeypatch, capsys, verb):
    bin_dir = _slurm_without_config(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    assert main(verb) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["error: squeue: fatal: Could not establish a configuration source"]
    assert captured.out == ""


def test_a_controller_that_does_not_answer_is_said_even_when_a_record_knows_the_job(tmp_path, monkeypatch, capsys):
    """squeue cannot reach slurmctld but the job-completion log (sacct -c, read locally) knows job 5: `status`
    says Slurm did not answer (one line, exit 2) instead of printing the record as if it were Slurm's answer."""
    folder = tmp_path / "bin"
    folder.mkdir()
    down = "squeue: error: Unable to contact slurm controller (connect failure)"
    (folder / "squeue").write_text(f"#!/bin/sh\necho '{down}' >&2\nexit 1\n")
    (folder / "sacct").write_text("#!/bin/sh\necho '5|COMPLETED|0:0|n1'\n")
    (folder / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    for exe in folder.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    assert main(["status", "5"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: Slurm unreachable: squeue got no answer from the controller ") and down in line
    assert captured.out == ""


@pytest.mark.parametrize("verb", [["watch", "5", "--interval", "0.1"], ["logs", "5", "-f", "--interval", "0.1"]])
def test_a_controller_lost_while_following_a_job_is_one_line(tmp_path, monkeypatch, capsys, verb):
    """`watch` and `logs -f` poll Slurm: the controller going away mid-way ends them with the one line, not a
    traceback. (Slurm's commands as scripts: squeue answers RUNNING twice, then cannot reach the controller.)"""
    folder, log = tmp_path / "bin", tmp_path / "job-5.out"
    folder.mkdir()
    log.write_text("step 1 loss 2.0\n")
    down = "squeue: error: Unable to contact slurm controller (connect failure)"
    count = tmp_path / "count"
    (folder / "squeue").write_text(
        f"#!/bin/sh\necho x >> {count}\n"
        f"if [ $(wc -l < {count}) -le 2 ]; then echo 'RUNNING|n1'; exit 0; fi\necho '{down}' >&2\nexit 1\n"
    )
    (folder / "scontrol").write_text(
        f"#!/bin/sh\necho 'JobId=5 JobName=j UserId=root(0) JobState=RUNNING Command=/x StdOut={log} RunTime=1'\n"
    )
    (folder / "sacct").write_text("#!/bin/sh\nexit 1\n")
    for exe in folder.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    assert main(verb) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: Slurm unreachable: squeue got no answer from the controller ") and down in line
