"""Issue #41's evidence and sizes, as the runtime decides them at 1, 16 and 1,000 nodes, and as the batch step acts.

(1) the FSDP scripts size their checkpoint, stop lead, save and hang floor from the ``MODEL`` picked at run time,
and the user's quota (``lfs quota``, ``quota``: real outputs) counts where the checkpoints go; (7) the script stops
in one line when ``$VENV`` has no python3, and a Slurm command that fails is said; (8) XIDs from before the gate
(kernel log, NVML's retired pages and row remaps), the one node without the shared mount named, torch's C extension
loaded on the node, the QOS's grace under ``preempt/qos``; (9) a save longer than KillWait/GraceTime: both numbers
and the fixes at the start.
"""

from __future__ import annotations

import calendar
import os
import platform
import subprocess
import time

import pytest

from cookbook_runtime import decide, pyenv, slurm, telemetry
from cookbook_runtime.decide import GateThresholds, NodeReport, gate_verdict

SIZES = (1, 16, 1000)


def nodes(n: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(n)]


# ------------------------------------------------------------------ (1) the user's quota: real outputs

LFS_MILA = """\
Disk quotas for usr normandf (uid 1471600598):
     Filesystem    used   quota   limit   grace   files   quota   limit   grace
     /home/mila  99.99G      0k    100G       -  921718       0 1048576       -
uid 1471600598 is using default block quota setting
uid 1471600598 is using default file quota setting
"""  # Mila's `disk-quota` (lfs quota -h), as captured in a public test suite
LFS_UIC = """\
Disk quotas for usr xdtr108 (uid 514559):
     Filesystem    used   quota   limit   grace   files   quota   limit   grace
             ./  792.3M      0k  9.537T       -       9       0 2000000       -
"""  # `lfs quota -h -u "${USER}" ./`, a site's user guide
LFS_OZSTAR = """\
Disk quotas for usr username (uid 1000):
     Filesystem    kbytes    quota   limit   grace   files   quota   limit   grace
          /fred [1041408]  5242880 6291456       -     [0]       0       0       -
"""  # `lfs quota /fred` without -h: KiB, [..] when a target did not answer (OzSTAR's docs)
LFS_LONG_NAME = """\
Disk quotas for usr bob (uid 500):
     Filesystem    used   quota   limit   grace   files   quota   limit   grace
/lustre/projects/very-long-mount
                 30.4M*    30M     40M 6d23h59m56s      10      0       0       -
"""  # a name over 15 characters: lfs prints it alone, the figures below; * = over the soft quota
QUOTA_S = """\
Disk quotas for user yangrongzheng (uid 6215): 
     Filesystem   space   quota   limit   grace   files   quota   limit   grace
    /nfs_global    479G   5120G   7168G            352k   5000k  10000k        
"""  # noqa: W291  (`quota -s` pads its lines; captured on a university cluster)
QUOTA_NONE = "Disk quotas for user alice (uid 1000): none\n"


def test_problem_1_lfs_quota_and_quota_outputs_parse_as_they_are_printed():
    gib = 1024**3
    assert decide.parse_quota(LFS_MILA, "lfs quota") == decide.Quota(int(99.99 * gib), 100 * gib, "lfs quota")
    uic = decide.parse_quota(LFS_UIC, "lfs quota")
    assert uic is not None and uic.used == int(792.3 * 1024**2) and uic.limit == int(9.537 * 1024**4)
    assert decide.parse_quota(LFS_OZSTAR, "lfs quota") == decide.Quota(1041408 * 1024, 6291456 * 1024, "lfs quota")
    over = decide.Quota(int(30.4 * 1024**2), 40 * 1024**2, "lfs quota")
    assert decide.parse_quota(LFS_LONG_NAME, "lfs quota") == over
    assert decide.parse_quota(QUOTA_S, "quota -s") == decide.Quota(479 * gib, 7168 * gib, "quota -s")
    assert decide.parse_quota(QUOTA_NONE, "quota -s") is None
    no_limit = LFS_UIC.replace("9.537T", "    0k")
    assert decide.parse_quota(no_limit, "lfs quota") is None  # 0: no limit


def test_problem_1_a_quota_shortfall_warns_on_an_estimate_and_stops_when_certain():
    """The filesystem has 5 TB free, the user's quota 0.01 GiB: the quota is the room."""
    quota = decide.parse_quota(LFS_MILA, "lfs quota")
    problem, stop = decide.run_dir_space_problem(5 * 10**12, 10**14, 96 * 10**9, quota=quota)
    assert not stop and "left of your quota" in problem and "training anyway" in problem
    assert "COOKBOOK_CHECKPOINT_GB" in problem
    problem, stop = decide.run_dir_space_problem(5 * 10**12, 10**14, 96 * 10**9, 40 * 10**9, quota)
    assert stop and "left of your quota" in problem and "COOKBOOK_CHECKPOINT_GB=0 skips" in problem
    roomy = decide.Quota(0, 10**13, "quota -s")
    assert decide.run_dir_space_problem(5 * 10**12, 10**14, 96 * 10**9, 40 * 10**9, roomy) == ("", False)
    # a FUSE filesystem reports no size: its quota is still judged
    assert decide.run_dir_space_problem(0, 0, 96 * 10**9, 40 * 10**9, quota)[1]


def test_problem_1_the_batch_step_reports_the_quota_and_stops_only_on_a_measured_shortfall(tmp_path):
    from batch_step import FakeSlurm

    fake = FakeSlurm(tmp_path)
    lfs = fake.bin / "lfs"
    lfs.write_text(f"#!/bin/sh\ncat <<'EOF'\n{LFS_MILA}EOF\n")
    lfs.chmod(0o755)
    argv = ["--checkpoint-gb=96", "--resume=fsdp", "--", "torchrun", "-m", "train"]
    warned = fake.run_step(argv, COOKBOOK_CHECKPOINT_GB="")
    assert warned.status == 0 and warned.launches(), warned.out
    assert "of your quota used (lfs quota)" in warned.out and "training anyway" in warned.out
    step = fake.run_dir / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("")
    (step / "shard_0.distcp").write_bytes(b"x" * (20 << 20))  # 20 MiB: more than the 0.01 GiB left
    ran = fake.run_step([*argv[:2], f"--checkpoint-dir={fake.run_dir / 'checkpoints'}", *argv[2:]],
                        COOKBOOK_CHECKPOINT_GB="")  # fmt: skip
    assert ran.status == 2 and "not training" in ran.out and not ran.launches(), ran.out


# ------------------------------------------------------------------ (1, 2) the FSDP model's sizes at run time


def test_problem_1_the_fsdp_script_sizes_everything_from_the_model_picked_at_run_time():
    from batch_step import committed_scripts, runtime_args

    for name, text in committed_scripts().items():
        if not name.startswith("fsdp/") or ".local-cpu." in name:
            continue
        assert "#SBATCH --signal=B:USR1@180" in text, name  # the default 8B's lead, written once
        small, large = runtime_args(text), runtime_args(text, {"MODEL": "llama3_1_70b"})
        assert small.lead_for_save and small.lead_from_signal, name  # the runtime's own stop for a larger MODEL
        assert (small.checkpoint_gb, small.save_seconds) == (96, 96), name  # 12 bytes x 8.0 B parameters
        assert (large.checkpoint_gb, large.save_seconds) == (847, 847), name
        assert decide.hang_min_seconds(small.save_seconds) == 600 and decide.hang_min_seconds(847) == 1270.5


@pytest.mark.parametrize(
    ("lead", "save", "limit", "elapsed", "stop_in"),
    [
        (180, 96, 14400, 0, None),  # the 8B: Slurm's USR1 at 180 s covers its save
        (180, 847, 14400, 5, 14400 - 5 - 960),  # the 70B: the runtime stops it 960 s before the limit
        (180, 847, 1800, 0, None),  # a 960 s lead over half a 30-minute limit: nothing gained
        (180, 847, None, 0, None),  # no time limit
        (180, 0, 14400, 0, None),  # nothing to size
    ],
)
def test_problem_2_a_model_that_saves_longer_than_the_signal_allows_is_stopped_by_the_runtime(
    lead, save, limit, elapsed, stop_in
):
    assert decide.own_stop_in(lead, save, limit, elapsed) == stop_in


def test_problem_2_the_planner_and_the_runtime_size_a_lead_alike():
    from cookbook.planner.lead_time import save_seconds, signal_seconds

    for recipe in ("fsdp_llama3_1_8b", "fsdp_llama3_1_70b"):
        assert signal_seconds((recipe,), 2) == decide.stop_lead_seconds(save_seconds((recipe,), 2))
    assert decide.stop_lead_seconds(847) == 960 and decide.stop_lead_seconds(96) == 180


def test_problem_2_the_batch_step_raises_the_stop_itself_for_a_70b_and_sizes_the_hang_floor(tmp_path):
    from batch_step import FakeSlurm

    argv = ["--requeue", "--lead-seconds=180", "--save-seconds=847", "--", "torchrun", "-m", "train"]
    record = "JobId=41 TimeLimit=00:40:00 RunTime=00:24:00 Partition=gpu"  # 960 s left: stop now
    mine = FakeSlurm(tmp_path / "own-lead").run_step(argv, FAKE_JOB_RECORD=record, FAKE_SRUN="save-if-stopped")
    assert "raises the stop itself" not in mine.out  # a --signal the user chose for a fixed model is theirs
    argv.insert(1, "--lead-for-save")  # the FSDP scripts: the lead is the default MODEL's
    ran = FakeSlurm(tmp_path / "model").run_step(argv, FAKE_JOB_RECORD=record, FAKE_SRUN="save-if-stopped")
    assert "needs a 960 s lead, the job's --signal gives 180 s: the runtime raises the stop itself in 0 s" in ran.out
    assert "cookbook: got USR1" in ran.out and ["requeue", "41"] in ran.argv("scontrol"), ran.out
    (launch,) = ran.launches()
    assert launch["env"]["COOKBOOK_STOP_LEAD_S"] == "960" and launch["env"]["COOKBOOK_HANG_MIN_S"] == "1270"


# ------------------------------------------------------------------ (7) the script's Python, Slurm's answers


def test_problem_7_a_venv_without_python3_stops_the_script_in_one_line_before_anything_is_written(tmp_path):
    from batch_step import committed_scripts

    for name in ("fsdp/fsdp.nebius.sbatch", "torchtune/llama3_3_70b_lora.nebius.sbatch"):
        script = tmp_path / "job.sbatch"
        script.write_text(committed_scripts()[name])
        env = {"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "41",
               "VENV": str(tmp_path / "no-venv")}  # fmt: skip
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (name, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"VENV={tmp_path}/no-venv has no bin/python3")
        assert not (tmp_path / "runs").exists()  # nothing written


def test_problem_7_a_slurm_command_that_fails_is_said_once(tmp_path, capsys):
    failing = tmp_path / "scontrol"
    failing.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2\nexit 1\n")
    failing.chmod(0o755)
    for _ in range(3):
        assert slurm._run([str(failing), "-o", "show", "job", "41"]) == ""
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and "did not answer (exit 1: slurm_load_jobs error: Socket timed out" in said[0]


def test_problem_7_slurms_answer_to_the_requeue_is_said_either_way_and_requeueing_only_once_accepted(tmp_path):
    from batch_step import FakeSlurm

    argv = ["--requeue", "--", "torchrun", "-m", "train"]
    ran = FakeSlurm(tmp_path / "yes").run_step(argv, FAKE_SRUN="signal:USR1")
    accepted = ran.out.index("cookbook: scontrol requeue 41 accepted")
    assert accepted < ran.out.index("cookbook: requeueing job 41 after the stop-save"), ran.out
    ran = FakeSlurm(tmp_path / "no").run_step(argv, FAKE_SRUN="signal:USR1", FAKE_SCONTROL_STATUS="1")
    assert "cookbook: scontrol requeue 41 refused" in ran.out and "the job ends" in ran.out, ran.out
    assert "requeueing job" not in ran.out  # diagnose reads that line as a restart


EIO_STEP = """
import errno, sys
from cookbook_runtime import run
said = run.say
def say(line):  # the job log errs (EIO) for the signal handler's line
    if line.startswith("cookbook: got "):
        raise OSError(errno.EIO, "Input/output error")
    said(line)
run.say = say
sys.exit(run.main(sys.argv[1:]))
"""


def test_problem_7_a_log_that_errs_in_the_signal_handler_still_gets_the_training_its_stop_save(tmp_path):
    """The handler raises the stop flag before it logs: USR1 with a log that fails (EIO) -> the ranks save, the
    job is requeued, the batch step does not die of its own error."""
    import sys

    from batch_step import FakeSlurm

    fake = FakeSlurm(tmp_path)
    argv = ["--requeue", "--", "torchrun", "-m", "train"]
    ran = fake._ran([sys.executable, "-c", EIO_STEP, *argv], fake.env(FAKE_SRUN="signal:USR1"))
    assert ran.status == 0 and "Traceback" not in ran.out and "cookbook: got USR1" not in ran.out, ran.out
    assert "cookbook: requeueing job 41 after the stop-save (cookbook: saved at step 3" in ran.out, ran.out


@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGTERM"])
def test_problem_7_a_run_folder_that_errs_never_makes_the_signal_handler_raise(tmp_path, monkeypatch, capsys, sig):
    """The stop flag cannot be written (EIO on the run folder): the handler says so, and nothing raises."""
    import errno
    import signal
    from pathlib import Path
    from types import SimpleNamespace

    from cookbook_runtime import run

    def touch(self: Path, *a: object, **k: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "touch", touch)
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    job = SimpleNamespace(signal=None)
    try:
        run.watch_signals(job, tmp_path / "STOP")  # type: ignore[arg-type]
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(0.1)  # the handler runs in the main thread between bytecodes
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert job.signal == sig.removeprefix("SIG")
    said = capsys.readouterr().out
    assert f"cookbook: got {job.signal} but could not raise the stop flag {tmp_path / 'STOP'}: [Errno 5]" in said


def test_problem_7_below_python_3_9_the_runtime_stops_in_one_line():
    """The nodes' python3 is the first thing a job runs: an older one (Ubuntu 20.04's 3.8) gets one line."""
    import glob
    import re
    import sys

    from batch_step import RUNTIME_ROOT

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(RUNTIME_ROOT)}
    old = "import sys; sys.version_info = (3, 8, 10, 'final', 0); sys.version = '3.8.10 (default)'; "
    runs = [[sys.executable, "-c", old + "import cookbook_runtime.run"]]
    real = sorted(
        glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")) + glob.glob("/usr/bin/python3.8")
    )
    runs += [[python, "-m", "cookbook_runtime.run", "--", "torchrun"] for python in real[:1]]  # a real one, if here
    for argv in runs:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1 and not done.stdout and done.stderr.count("\n") == 1, done.stderr
        assert re.search(r"is Python 3\.8\.\d+; the job runtime needs Python 3\.9 or newer", done.stderr), done.stderr
        assert "set VENV to an environment built with `make setup`" in done.stderr


# ------------------------------------------------------------------ (8) XIDs from before the gate

NOW = calendar.timegm((2026, 11, 28, 12, 0, 0, 0, 0, 0))
DMESG = """\
2026-11-28T10:15:32,123456+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
2026-11-28T10:15:32,200000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
2026-11-28T11:02:10,000000+00:00 NVRM: Xid (PCI:0000:86:00): 13, pid=4011, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
2026-11-20T09:00:00,000000+00:00 NVRM: Xid (PCI:0000:9b:00): 48, pid=1885, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0.
"""  # noqa: E501  (the driver's lines as the kernel log holds them)
JOURNAL = "2026-11-28T06:59:01-0500 gpu0007 kernel: NVRM: Xid (PCI:0000:9b:00): 95, pid='<unknown>', name=<unknown>, Uncontained: FBHUB. RST: Yes, D-RST: No\n"  # noqa: E501


def test_problem_8_hardware_xids_of_the_last_day_are_read_from_the_kernel_log():
    assert telemetry.kernel_xids(DMESG, NOW) == ["XID 79 on PCI:0000:3b:00 at 2026-11-28T10:15:32+00:00"]
    assert telemetry.kernel_xids(JOURNAL, NOW) == ["XID 95 on PCI:0000:9b:00 at 2026-11-28T06:59:01-0500"]
    assert telemetry.kernel_xids(DMESG, NOW, window_s=60) == []  # older than the window: history
    assert telemetry.kernel_xids("", NOW) == []  # unreadable (dmesg_restrict): not judged


def test_problem_8_nvml_pending_retirements_and_row_remaps_are_faults():
    assert telemetry.memory_faults(0, 0, (0, 0, 0, 0)) == []
    assert telemetry.memory_faults(0, None, None) == []  # not supported on this GPU: not judged
    assert "pending a GPU reset" in telemetry.memory_faults(3, 1, None)[0]
    assert "row remap pending" in telemetry.memory_faults(3, None, (0, 2, 1, 0))[0]
    assert "needs service" in telemetry.memory_faults(3, None, (0, 2, 1, 1))[0]


@pytest.mark.parametrize("n", SIZES)
def test_problem_8_a_kernel_log_xid_names_that_node_alone(n: int):
    reports = {x: NodeReport(matmul_tflops=700.0, seconds=9.0) for x in nodes(n)}
    odd = nodes(n)[-1]
    failures = tuple(f"{x} in the kernel log" for x in telemetry.kernel_xids(DMESG, NOW))
    reports[odd] = NodeReport(failures=failures, matmul_tflops=700.0)
    verdict = gate_verdict(nodes(n), reports, GateThresholds())
    assert verdict.exclude == ([] if n == 1 else [odd])


# ------------------------------------------------------------------ (8) the node without the shared mount


@pytest.mark.parametrize("n", SIZES)
def test_problem_8_the_one_node_without_the_shared_mount_is_named(n: int):
    everyone = nodes(n)
    odd = everyone[n // 2]
    why = f"run folder /shared/run is not shared: files of {odd} not visible here"
    reports = {x: NodeReport(failures=(why,), unseen=(odd,), seconds=9.0) for x in everyone if x != odd}
    named = decide.name_unshared(everyone, reports)  # its own report is on its local disk: missing here
    verdict = gate_verdict(everyone, named, GateThresholds())
    if n < 3:
        assert verdict.exclude == [] and decide.unshared_node(everyone, {}) is None
        return
    assert verdict.exclude == [odd] and "none of its" in verdict.blame[odd][0], verdict
    assert not verdict.unattributed  # its peers' failures were its fault


def test_problem_8_two_nodes_that_miss_each_other_or_a_folder_shared_by_nobody_name_no_node():
    assert decide.unshared_node(["a", "b"], {"a": ["b"], "b": ["a"]}) is None  # either may be it
    assert decide.unshared_node(["a", "b"], {"a": ["b"]}) is None  # one peer is no evidence
    three = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}
    assert decide.unshared_node(["a", "b", "c"], three) is None  # nobody shares: the cluster's
    assert decide.unshared_node(nodes(16), {x: [] for x in nodes(16)}) is None


# ------------------------------------------------------------------ (8) torch's C extension on the node


def test_problem_8_an_extension_built_for_another_machine_is_found_by_its_elf_header(tmp_path):
    other = 183 if platform.machine() != "aarch64" else 62  # aarch64 on this x86 host, x86_64 on an arm one
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("")
    header = b"\x7fELF\x02\x01\x01" + bytes(11) + other.to_bytes(2, "little")
    (package / "_C.cpython-311-linux-gnu.so").write_bytes(header + bytes(64))
    problem = pyenv.extension_problem("torch", [str(tmp_path)])
    assert problem == f"its C extension is built for {pyenv.ELF_MACHINES[other]}, this node is {platform.machine()}"
    assert pyenv.extension_problem("torch") == ""  # this machine's own torch loads


@pytest.mark.parametrize("n", SIZES)
def test_problem_8_an_x86_venv_on_aarch64_nodes_stops_with_the_seeds_instruction(n: int):
    broken = {"torch": "its C extension is built for x86_64, this node is aarch64"}
    answers = {x: {"python": "/shared/.venv/bin/python3", "machine": "aarch64", "broken": broken,
                   "versions": {"torch": "2.13.0", "torchtune": "0.6.1"}} for x in nodes(n)}  # fmt: skip
    verdict = decide.environment_verdict(nodes(n), answers, {"torch": "2.13.0", "torchtune": "0.6.1"})
    assert "built for x86_64, this node is aarch64" in verdict.stop
    assert "built on a node of this architecture" in verdict.stop and "no node is excluded" in verdict.stop


# ------------------------------------------------------------------ (8, 9) the grace a preemption gives


def test_problem_8_the_grace_is_the_qoss_when_slurm_preempts_by_qos():
    assert decide.preemption_grace("preempt/qos", partition_grace=300, qos_grace=30) == 30
    assert decide.preemption_grace("preempt/partition_prio", partition_grace=300, qos_grace=30) == 300
    assert decide.preemption_grace("preempt/none", partition_grace=300, qos_grace=30) is None


def test_problem_9_a_save_longer_than_killwait_or_gracetime_says_both_numbers_and_the_fixes():
    line = decide.kill_wait_problem(847, kill_wait=30, grace=decide.preemption_grace("preempt/qos", None, 120))
    assert "KillWait=30 s and GraceTime=120 s" in line and "~847 s" in line
    for fix in ("--signal", "PreemptParameters=send_user_signal", "a faster writer"):
        assert fix in line


def test_problem_9_the_qos_grace_is_read_from_sacctmgr(tmp_path, monkeypatch):
    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text("#!/bin/sh\necho 00:02:00\n")  # `sacctmgr -n -P show qos normal format=GraceTime`
    sacctmgr.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm.qos_grace("normal") == 120
    assert slurm.qos_grace("") is None


def test_problem_9_the_batch_step_says_the_qos_grace_and_killwait_at_its_start(tmp_path):
    from batch_step import FakeSlurm

    fake = FakeSlurm(tmp_path)
    (fake.bin / "scontrol").rename(fake.bin / "scontrol-standin")
    config = "KillWait                = 30 sec\nPreemptType             = preempt/qos\n"  # `scontrol show config`
    for name, text in (
        ("scontrol", f'#!/bin/sh\n[ "$1 $2" = "show config" ] && {{ printf \'{config}\'; exit 0; }}\n'
                     f'exec {fake.bin}/scontrol-standin "$@"\n'),
        ("sacctmgr", "#!/bin/sh\necho 00:00:45\n"),  # the QOS's GraceTime; the partition says none
    ):  # fmt: skip
        (fake.bin / name).write_text(text)
        (fake.bin / name).chmod(0o755)
    argv = ["--requeue", "--save-seconds=847", "--", "torchrun", "-m", "train"]
    ran = fake.run_step(argv, SLURM_JOB_QOS="normal", SLURM_JOB_PARTITION="gpu")
    assert "cookbook: this site's KillWait=30 s and GraceTime=45 s is shorter than this model's stop-save" in ran.out
    assert ran.status == 0 and ran.launches(), ran.out  # said, and the job trains


def test_the_kernel_log_reader_never_raises():
    assert isinstance(telemetry.kernel_log(), str)
    assert time.time() > NOW - 10**9  # the fixed clock of these cases is a real date
