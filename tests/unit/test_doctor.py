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


def test_the_runtimes_probe_run_by_the_nodes_python_reports_this_machine(tmp_path):
    """The probe job's program (``cookbook_runtime.probe``, issue #43: no node program under ``cookbook/``), run
    as the job runs it -- a bare ``python3`` with only the copied runtime on its path -- and read back by
    ``doctor`` into the one report type: the shared marker, the venv's pinned stack, free space."""
    import shutil
    import subprocess
    import sys

    from cookbook.render import runtime_files

    for name, text in runtime_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "marker").write_text("token-1")
    bare = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    subprocess.run(
        [bare, "-m", "cookbook_runtime.probe", "--out", str(tmp_path), "--marker", str(tmp_path / "marker"),
         "--python", sys.executable, "--needs", "torch", "torchtune", "torchao", "torchtitan",
         "--disk", str(tmp_path / "not" / "yet")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "SLURMD_NODENAME": "n7"},
        check=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    report = doctor._read_probe_file(tmp_path / "node-n7.json", "token-1")
    assert report.node == "n7" and report.facts["marker_ok"] and report.facts["python_ok"]
    assert report.facts["free_bytes"][str(tmp_path / "not" / "yet")] > 0  # its nearest existing folder's
    assert doctor.stack_on_nodes([report]).status == "pass"
    assert not doctor._read_probe_file(tmp_path / "node-n7.json", "token-2").facts["marker_ok"]


def test_one_efa_test_for_the_gate_the_rehearsal_and_the_probe(tmp_path):
    """An EFA device is one named so (``rdmap*``, ``efa*``) or bound to the ``efa`` driver; an HCA is not."""
    from cookbook_runtime.probe import efa_devices, rdma_devices

    for name in ("mlx5_0", "rdmap16s27", "ib9"):
        (tmp_path / name / "device").mkdir(parents=True)
    (tmp_path / "drivers" / "efa").mkdir(parents=True)
    (tmp_path / "ib9" / "device" / "driver").symlink_to(tmp_path / "drivers" / "efa")
    assert rdma_devices(tmp_path) == ["drivers", "ib9", "mlx5_0", "rdmap16s27"]
    assert efa_devices(tmp_path) == ["ib9", "rdmap16s27"]
    assert efa_devices(tmp_path / "absent") == []
