"""Diagnosis never fires on a healthy run (issue #42, item 4).

Every rule of ``cookbook.metrics.diagnose.RULES`` is silent on a real healthy log of each framework and of a run
that was requeued or recovered, and still fires on its failure example appended to that same log. The healthy logs
(``tests/fixtures/logs/healthy_*.out``, see the README there) are real jobs of the local cluster, unedited: torch's
c10d socket warnings, Slurm's ``DUE TO JOB REQUEUE`` line, the cookbook's own stop-save and recovery lines and the
ranks a spare replaced are all in them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from cookbook.metrics.diagnose import RULES, Finding, diagnose, diagnose_text

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
HEALTHY = (
    "healthy_torchtune_full.out",
    "healthy_torchtune_lora.out",
    "healthy_torchtitan_llama3.out",
    "healthy_torchtitan_flux.out",
    "healthy_fsdp.out",
    "healthy_fsdp_stop_save_requeued.out",
    "healthy_torchtune_lora_spare_recovered.out",
)

_GAI = (
    "Traceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/utils.py", line 130, in '
    "_matches_machine_hostname\n"
    "socket.gaierror: [Errno -2] Name or service not known\n"
)
# one failure example per rule, in RULES' order (the last line of each is the one the rule names)
EXAMPLES: tuple[str, ...] = (
    "0: use_lm.py: error: /runs/x holds no checkpoint: train it first, or give --run a finished run\n",
    "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 DUE TO TIME LIMIT ***\n",
    "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 DUE TO PREEMPTION ***\n",
    "srun: error: Node failure on n3\n",
    "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-22T10:00:01 ***\n",
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.0. Some of your processes may have been killed.\n",
    "[rank3]:[E1122 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n",
    "n1:1234:5678 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<53782> with error 12\n",
    "huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access gated repo for url "
    "https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json.\n",
    "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub\n",
    "[E1122 22:22:43.125051417 socket.cpp:1028] [c10d] The client socket has timed out after 60000ms while trying "
    "to connect to (no-such-head-node, 29500).\n",
    _GAI,
    "FileNotFoundError: Tokenizer path 'assets/hf/Llama-3.1-8B' does not exist\n",
    "FileNotFoundError: [Errno 2] No such file or directory: '/fsx/llama/model-00001-of-00004.safetensors'\n",
    "FileNotFoundError: [Errno 2] No such file or directory: '/home/me/data/train.jsonl'\n",
    "0: [rank0]:1|12|Loss: nan\n",
    "srun: error: n2: task 1: Exited with exit code 1\n",
)
# lines of healthy runs that look like failures (each seen in a real log; none is one)
HEALTHY_LINES = (
    "0: [W1128 18:03:46.921728730 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. "
    "err=-3\n",
    "1: [rank1]:[W1128 18:03:46.921728730 socket.cpp:207] [c10d] The hostname of the client socket cannot be "
    "retrieved. err=-3\n",
    "[W socket.cpp:663] [c10d] The IPv6 network addresses of (n1, 29500) cannot be retrieved (gai error: -2 - "
    "Name or service not known).\n",
    "[I1122 10:00:00.000000000 socket.cpp:835] [c10d] The client socket has failed to connect to [n1]:29500 "
    "(errno: 111 - Connection refused).\n",
    "slurmstepd-n1: error: *** JOB 22 ON n1 CANCELLED AT 2026-11-28T18:06:24 DUE TO JOB REQUEUE ***\n",
    "cookbook: requeueing job 32 after the stop-save (cookbook: saved at step 2 for preemption: /r/step_2)\n",
    "cookbook: recovery: n2 (its ranks died of SIGKILL) replaced by spare n3 in job 5 (1 of 2 recoveries left)\n",
    "cookbook: node failure: n4 of job 2's previous run is down* (NODE_FAIL)\n",
)


@functools.cache
def _found(name: str) -> list[Finding]:
    return diagnose(LOGS / name)


def test_every_rule_has_a_failure_example_that_is_its_own():
    assert len(EXAMPLES) == len(RULES)
    for rule, example in zip(RULES, EXAMPLES, strict=True):
        assert re.search(rule.pattern, example.splitlines()[-1]), (rule.kind, example)
        assert [f.kind for f in diagnose_text(example)] == [rule.kind]


@pytest.mark.parametrize("name", HEALTHY)
@pytest.mark.parametrize("index", range(len(RULES)), ids=[f"{i}-{r.kind}" for i, r in enumerate(RULES)])
def test_each_rule_is_silent_on_a_healthy_log_and_fires_on_its_failure_after_it(name: str, index: int):
    rule = RULES[index]
    assert rule.kind not in {f.kind for f in _found(name)}, _found(name)
    text = (LOGS / name).read_text()
    failed = [f for f in diagnose_text(text + EXAMPLES[index]) if f.kind == rule.kind]
    assert failed and failed[0].line_number == text.count("\n") + EXAMPLES[index].count("\n"), failed


@pytest.mark.parametrize("line", HEALTHY_LINES)
def test_lines_of_healthy_runs_are_no_failure(line: str):
    assert diagnose_text(line) == []


def test_what_a_spare_recovered_from_is_not_how_the_job_ended():
    """The recovered log names the dead ranks and the cancelled step up to its recovery; the start after it settles
    them, and a failure after that start is named again."""
    text = (LOGS / "healthy_torchtune_lora_spare_recovered.out").read_text()
    before = text[: text.index("cookbook: recovery: ")]
    assert {"rank_failed", "slurm_cancelled"} <= {f.kind for f in diagnose_text(before)}
    assert diagnose_text(text) == []
    assert [f.kind for f in diagnose_text(text + EXAMPLES[-1])] == ["rank_failed"]


def test_the_rendezvous_failure_is_still_named_past_its_warnings():
    found = diagnose(LOGS / "torchrun_rendezvous_fail.log")
    assert found[0].kind == "rendezvous" and "client socket has timed out" in found[0].line


def test_the_node_report_says_a_spare_recovery_was_done():
    from cookbook.analysis.node_health import node_report

    report = node_report(LOGS / "healthy_torchtune_lora_spare_recovered.out")
    assert "done: recovered from n2 (its ranks died of SIGKILL) replaced by spare n3 in job 5 " in " ".join(report)
    assert not [line for line in report if line.startswith("not done")], report
