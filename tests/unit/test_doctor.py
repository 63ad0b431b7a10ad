"""cookbook.doctor checks that need no cluster."""

from __future__ import annotations

import json

from cookbook import doctor
from cookbook.slurm.client import SlurmClient


def test_python_bounds():
    assert doctor.check_python((3, 11)).status == "pass"
    assert doctor.check_python((3, 12)).status == "pass"
    bad = doctor.check_python((3, 13))
    assert bad.status == "fail" and "3.11 or 3.12" in bad.fix


def test_installed_packages_are_the_known_good_set():
    checks = {c.name: c for c in doctor.check_packages()}
    assert set(checks) == {"torch", "torchtune", "torchao", "torchtitan"}
    assert all(c.status == "pass" for c in checks.values()), checks


def test_package_versions_outside_known_good():
    checks = {
        c.name: c
        for c in doctor.check_packages(
            {"torch": "2.14.1+cu130", "torchtune": "0.6.1", "torchao": "0.16.0", "torchtitan": None}
        )
    }
    assert checks["torch"].status == "warn" and "torch==2.13.0" in checks["torch"].fix
    assert checks["torchao"].status == "warn" and "0.13" in checks["torchao"].detail
    assert checks["torchtune"].status == "pass"
    assert checks["torchtitan"].status == "fail"


def test_token_presence_without_value(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert doctor.check_token().status == "warn"
    monkeypatch.setenv("HF_TOKEN", "hf_doctorSECRET42")
    c = doctor.check_token()
    assert c.status == "pass" and "hf_doctorSECRET42" not in c.detail + c.fix


def test_slurm_unreachable_is_a_failed_check(tmp_path):
    client = SlurmClient({"PATH": "/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "nope.conf")}, timeout=20)
    checks = doctor.check_slurm(client)
    assert checks[0].name == "slurm" and checks[0].status == "fail" and "SLURM_CONF" in checks[0].fix
    assert "nope.conf: no such file" in checks[0].detail  # at once: Slurm would retry the missing file for 60 s


def test_gres_parsing():
    assert doctor._gpus("gpu:h100:8(S:0-1)") == 8
    assert doctor._gpus("gpu:4,gpu:a100:2") == 6
    assert doctor._gpus("(null)") == 0


def test_render_and_frame():
    checks = [doctor.Check("a", "pass", "fine"), doctor.Check("b", "fail", "broken", "fix it")]
    text = doctor.render(checks)
    assert "FAIL" in text and "-> fix it" in text and "1 pass, 0 warn, 1 fail" in text
    assert list(doctor.to_frame(checks).columns) == ["name", "status", "detail", "fix"]


def test_disk_check(tmp_path):
    assert doctor.check_disk(tmp_path / "not" / "yet").status == "pass"
    assert doctor.check_disk(tmp_path, need_bytes=10**18).status == "fail"


def test_the_stack_on_nodes_fails_naming_a_node_without_torch_or_whose_venv_does_not_run_there():
    """#30 items 1 and 6: the venv made on the login node, run on each node by the probe job."""
    from cookbook.doctor import NodeReport, probe_report, stack_on_nodes

    def node(host: str, pyenv: str) -> NodeReport:
        return probe_report(host, gpus=8, marker_ok=True, python_ok=True, pyenv=pyenv)

    ok = 'cookbook-pyenv {"node": "n1", "python": "/v/bin/python3", "machine": "x86_64", "versions": ' + (
        '{"torch": "2.13.0+cu130", "torchtune": "0.6.1", "torchao": "0.15.0", "torchtitan": "0.3.0"}}'
    )
    assert stack_on_nodes([node("n1", ok)]).status == "pass"
    no_torch = ok.replace('"2.13.0+cu130"', "null").replace('"n1"', '"n2"')
    arm = "/v/bin/python3: cannot execute binary file: Exec format error"
    check = stack_on_nodes([node("n1", ok), node("n2", no_torch), node("n3", arm)])
    assert check.status == "fail" and "n2: torch missing, tested 2.13.0" in check.detail
    assert "n3: the venv does not run there (/v/bin/python3: cannot execute binary file" in check.detail
    assert "make setup" in check.fix


def test_a_gpu_node_without_nvidia_ml_py_is_a_warning_naming_it_and_the_pin():
    """The probe asks each node for nvidia-ml-py too: without it the job trains, blind to its GPUs' faults."""
    from cookbook.doctor import NodeReport, gpu_telemetry_on_nodes, probe_report, stack_on_nodes

    def node(host: str, nvml: str | None) -> NodeReport:
        have = {"torch": "2.13.0", "torchtune": "0.6.1", "torchao": "0.15.0", "torchtitan": "0.3.0"}
        answer = {"node": host, "python": "/v/bin/python3", "machine": "x86_64", "versions": {**have}}
        answer["versions"]["nvidia-ml-py"] = nvml
        pyenv = "cookbook-pyenv " + json.dumps(answer)
        return probe_report(host, gpus=8, marker_ok=True, python_ok=True, pyenv=pyenv)

    both = [node("n1", "12.575.51"), node("n2", None)]
    assert stack_on_nodes(both).status == "pass"  # the frameworks decide the stack, not the optional NVML
    check = gpu_telemetry_on_nodes(both)
    assert check.status == "warn" and "no nvidia-ml-py on n2:" in check.detail and "n1" not in check.detail
    assert check.fix == "pip install nvidia-ml-py==12.575.51 into the venv"
    assert gpu_telemetry_on_nodes(both[:1]).status == "pass"
