"""Name known failures in a job log, each with a one-line hint of what to do.

for f in diagnose("slurm-12.out"):
    print(f)          # "line 812: cuda_oom: CUDA out of memory ... -> lower batch_size ..."
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cookbook_runtime import files


@dataclass(frozen=True)
class Rule:
    """A failure ``kind``: a line matching ``pattern`` (and, if given, ``context`` in it or in the
    ``CONTEXT_BYTES`` before it) is named with ``hint``."""

    kind: str
    pattern: str
    hint: str
    context: str | None = None


CONTEXT_BYTES = 4096
WINDOW = 4 << 20


def _slurm_state(state: str) -> str:
    """A Slurm job state as ``scontrol show job`` (``JobState=TIMEOUT``) and ``sacct`` print it: a column
    (``CANCELLED+``, ``CANCELLED by 1000``, ``|``-separated with --parsable) followed by an ExitCode column."""
    return rf"JobState={state}\b|(?:^|[\s|]){state}(?:\+| by \d+)?[\s|]+\d+:\d+(?:[\s|]|$)"


# First matching rule wins for a line; order = most specific first.
# fmt: off
RULES: tuple[Rule, ...] = (
    # a program the cookbook ships refusing its input: `PROGRAM: error: WHAT TO CHANGE` (argparse's form), shown whole
    Rule("job_refused", r"(?:use_lm\.py|_use): error: ",
         "the job refused its input (the line says what to change): fix it and resubmit; `cookbook render` runs "
         "the same checks before submitting wherever the login node sees the files"),
    Rule("slurm_timeout", r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT|"
         + _slurm_state("TIMEOUT"),
         "the job hit its --time limit: raise --time, or checkpoint more often and resubmit to resume"),
    Rule("slurm_preempted", r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION|"
         + _slurm_state("PREEMPTED"),
         "preempted by a higher-priority job: submit with --requeue and resume from the last checkpoint"),
    Rule("slurm_node_fail", r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO NODE FAIL|"
         r"DUE TO NODE FAILURE|NODE_FAIL|srun: error: Node failure on",
         "a node died under the job: resubmit excluding it (--exclude=NODE) and resume from a checkpoint"),
    Rule("slurm_cancelled", r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+|" + _slurm_state("CANCELLED"),
         "the job was cancelled (scancel or an admin); resubmit if that was not intended"),
    Rule("cuda_oom", r"CUDA out of memory|CUDA error: out of memory|torch\.OutOfMemoryError|OutOfMemoryError: |"
         r"CUBLAS_STATUS_ALLOC_FAILED",
         "GPU memory exhausted: lower batch size or sequence length, enable activation checkpointing, "
         "or shard over more GPUs (check the planner first)"),
    Rule("host_oom", r"oom[-_]kill|Out of memory: Killed process|OUT_OF_MEMORY",
         "the host ran out of RAM (Linux OOM killer): request more --mem, fewer dataloader workers, no CPU offload"),
    Rule("nccl_timeout", r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]ime(?:d )?out|"
         r"ProcessGroupNCCL's watchdog got stuck|"
         r"NCCL.*timed out|Some NCCL operations have failed or timed out|collective operation timeout",
         "a rank stopped joining collectives: find the first rank that failed or hung above; check the "
         "network (NCCL_SOCKET_IFNAME, IB/EFA) and only raise the timeout for legitimately slow steps"),
    Rule("nccl_error", r"NCCL WARN|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|"
         r"NCCL error",
         "NCCL failed: rerun with NCCL_DEBUG=INFO and check NCCL_SOCKET_IFNAME / the fabric plugin "
         "(aws-ofi-nccl on EFA)"),
    Rule("gated_model", r"GatedRepoError|gated repo|401 Client Error|403 Client Error|"
         r"Access to model \S+ is restricted|Cannot access gated repo|"
         r"'40[13] (?:Unauthorized|Forbidden)' for url '?https://(?:huggingface\.co|hf\.co)",
         "the hub refused access (gated model, or no/invalid token): accept the licence on huggingface.co "
         "and export a valid HF_TOKEN (or `huggingface-cli login`) before submitting"),
    Rule("hub_unreachable", r"Failed to download|LocalEntryNotFoundError|huggingface\.co.*(?:timed out|"
         r"Max retries|ConnectError)|ReadTimeoutError.*huggingface|(?:httpx|httpcore|requests)\.\w*(?:ConnectError|"
         r"ConnectionError|ConnectTimeout)",
         "the Hugging Face hub is unreachable from the nodes: download on the login node first, then set "
         "HF_HUB_OFFLINE=1 (or raise HF_HUB_ETAG_TIMEOUT)"),
    Rule("rendezvous", r"RendezvousConnectionError|RendezvousTimeoutError|DistNetworkError|"
         r"\[c10d\].*(?:Name or service not known|Temporary failure in name resolution)|gai error|"
         r"The client socket has timed out after|"
         r"The server socket has failed to listen|[Cc]onnection refused.*(?:29500|rdzv|store)",
         "workers could not reach the rendezvous host: use the first node of `scontrol show hostnames` as the "
         "endpoint, make sure it resolves to a non-loopback address on every node, and that MASTER_PORT is free"),
    Rule("rendezvous", r"socket\.gaierror|\[Errno -[23]\] (?:Name or service not known|"
         r"Temporary failure in name resolution)",
         "the rendezvous host name does not resolve on this node: use a name from `scontrol show hostnames` "
         "(or its IP address) as --rdzv-endpoint / MASTER_ADDR",
         context=r"rendezvous|rdzv|c10d|TCPStore|MASTER_ADDR"),
    Rule("missing_tokenizer", r"(?:FileNotFoundError|No such file or directory|does not exist).*"
         r"(?:[Tt]okenizer|\.model\b|tiktoken)|[Tt]okenizer.*(?:does not exist|: No such file)|Can't load tokenizer",
         "the tokenizer file is missing: set tokenizer.path= to the downloaded file (e.g. original/tokenizer.model)"),
    Rule("missing_checkpoint", r"(?:FileNotFoundError|No such file or directory|does not exist).*"
         r"(?:checkpoint|\.safetensors|\.distcp|\.pt\b|\.bin\b|config\.json|ae\.safetensors)",
         "a checkpoint file is missing: set checkpointer.checkpoint_dir= (torchtune ignores a top-level "
         "checkpoint_dir=) and check the files were downloaded to a shared path"),
    Rule("missing_file", r"FileNotFoundError",
         "a path does not exist on the compute node: use a shared filesystem path, not a login-node one"),
    Rule("loss_nan", r"\b[Ll]oss:\s*-?nan\b",
         "loss became NaN: lower the learning rate, add warmup or gradient clipping, check the data"),
    Rule("rank_failed", r"ChildFailedError|srun: error: \S+: task \d+: Exited with exit code",
         "a worker process failed: the first traceback above (torchrun's 'Root Cause') says why"),
)

# Lines that look like a rule's but also appear in healthy runs, never a failure: torch's c10d socket layer's
# warnings and notes (``[W1128 18:03:46.92 socket.cpp:207] [c10d] The hostname of the client socket cannot be
# retrieved``, an IPv6 address that does not resolve, a connect retried while the store starts), Slurm's line for a
# requeue (``*** JOB 22 ON n1 CANCELLED AT ... DUE TO JOB REQUEUE ***``: the job comes back), and the cookbook's
# own ``cookbook: `` lines (the node report reads those, ``cookbook.analysis.node_health``).
BENIGN: tuple[str, ...] = (
    r"\[[WI]\d*[^\]]*\b(?:socket|TCPStore)\.cpp:\d+\] \[c10d\]",
    r"CANCELLED AT \S+ DUE TO JOB REQUEUE\b",
    r"^(?:\d+: )?(?:\[rank\d+\]:\s*)?cookbook: ",
)
# A line after which the job ran again: each start of the job (``files.START``, also after a spare took a node's
# place) and a requeue the job asked for itself (the stop-save's, ``decide.AfterExit``). What came before is what the
# job recovered from, not how it ended; a failure that persists is found again after it.
RESTARTED = (files.START.pattern, r"^(?:\d+: )?cookbook: (?:.*: )?requeueing job \d+")

# The prefilter: literals of which every line a RULES pattern matches holds one (check a new rule's
# pattern against them). One RE2 scan finds the lines holding any; only those go through RULES.
NEEDLES: tuple[str, ...] = (
    "[c10d]", "[Errno -", "Access to model", "Can't load tokenizer", "CANCELLED", "ChildFailedError",
    "Client Error", "collective operation timeout", "ConnectError", "ConnectionError", "ConnectTimeout",
    "CUBLAS_STATUS_ALLOC_FAILED", "DistNetworkError", "does not exist", "Failed to download",
    "FileNotFoundError", "Forbidden", "gai error", "gaierror", "gated repo", "GatedRepoError", "huggingface",
    "LocalEntryNotFoundError", "nan", "NCCL error", "NCCL WARN", "ncclInternalError", "ncclRemoteError",
    "ncclSystemError", "ncclUnhandledCudaError", "No such file", "NODE FAIL", "Node failure", "NODE_FAIL",
    "onnection refused", "oom-kill", "oom_kill", "Out of memory", "out of memory", "OUT_OF_MEMORY",
    "OutOfMemoryError", "PREEMPTED", "ProcessGroupNCCL", "Rendezvous", "server socket", "srun: error:",
    "timed out", "TIMEOUT", "node(s)", "Unauthorized", "cookbook: ", "use_lm.py: error: ", "_use: error: ",
)
# kinds whose line is the message itself (printed whole), with the generic kinds such a line makes redundant
SUPERSEDES = {"job_refused": ("rank_failed",)}
# fmt: on
_PREFILTER = re.compile(b"|".join(re.escape(n.encode()) for n in sorted(NEEDLES, key=len, reverse=True)))
_BENIGN = re.compile("|".join(f"(?:{b})" for b in BENIGN))
_RESTARTED = re.compile("|".join(f"(?:{r})" for r in RESTARTED))
_COMPILED = tuple((r, re.compile(r.pattern), re.compile(r.context.encode()) if r.context else None) for r in RULES)


def _rule(line: str, context: bytes, start: int, end: int) -> Rule | None:
    """The first rule matching ``line`` (at ``start:end`` of ``context``, whose context it finds before it); none
    for a ``BENIGN`` line."""
    if _BENIGN.search(line):
        return None
    for rule, rx, ctx in _COMPILED:
        if rx.search(line) and (ctx is None or ctx.search(context, max(0, start - CONTEXT_BYTES), end)):
            return rule
    return None


@dataclass(frozen=True)
class Finding:
    """One recognised failure: its kind, where it first appeared, how often, and what to do."""

    kind: str
    line_number: int
    line: str
    hint: str
    count: int = 1

    def __str__(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        line = self.line if self.kind in SUPERSEDES else self.line[:160]
        return f"line {self.line_number}: {self.kind}{times}: {line}\n    -> {self.hint}"


def diagnose(path: str | os.PathLike[str], lines_with: list[tuple[int, str]] | None = None) -> list[Finding]:
    """Known failures in the log at ``path``, in order, one per kind; ``lines_with`` gets its ``cookbook: `` lines."""
    with open(path, "rb") as f:  # plain reads: a log truncated while mapped (a requeue) would SIGBUS
        return _scan(f, lines_with)


def diagnose_text(text: str) -> list[Finding]:
    """:func:`diagnose` for text in memory (:func:`diagnose_bytes` for bytes)."""
    return diagnose_bytes(text.encode("utf-8", errors="replace"))


def diagnose_bytes(data: bytes) -> list[Finding]:
    return _scan(io.BytesIO(data))


def _scan(f: io.BufferedIOBase, lines_with: list[tuple[int, str]] | None = None) -> list[Finding]:
    """Read ``WINDOW`` bytes at a time into one buffer, cut after the last ``\\n`` (else ``\\r``, else the buffer's
    end: a line longer than the buffer is read in pieces). RE2 (pyarrow; a DFA, ~500 MB/s whatever the number of
    needles) counts the NEEDLES in a window; only a window holding one is split into lines, and only the lines
    holding one go through ``RULES``."""
    found: dict[str, Finding] = {}
    line_no, keep, before, data = 1, 0, b"", bytearray(WINDOW)  # ``before``: the CONTEXT_BYTES before
    while True:
        with memoryview(data) as view:
            got = f.readinto(view[keep:])
        size = keep + got
        cut = (data.rfind(b"\n", 0, size) + 1 or data.rfind(b"\r", 0, size) + 1 or size) if got else size
        offsets = pa.py_buffer(np.array([0, cut], dtype=np.int64))
        array = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])  # no copy
        if cut and pc.count_substring_regex(array, pattern=_PREFILTER.pattern)[0].as_py():
            lines = pc.split_pattern(array, pattern=b"\n").flatten()
            hits = pc.indices_nonzero(pc.match_substring_regex(lines, pattern=_PREFILTER.pattern)).to_numpy()
            ends = np.cumsum(pc.binary_length(lines).to_numpy() + 1) - 1  # offset of each line's \n
            window = bytes(data[:cut])
            context = before + window
            for i in hits:
                start, end = (int(ends[i - 1]) + 1 if i else 0), int(ends[i])
                line = window[start:end].decode("utf-8", errors="replace").strip()
                rule = _rule(line, context, len(before) + start, len(before) + end)
                if lines_with is not None and "cookbook: " in line:
                    lines_with.append((line_no + window.count(b"\n", 0, start), line))
                if _RESTARTED.search(line):
                    found.clear()
                if rule is not None:
                    first = found.get(rule.kind) or Finding(
                        rule.kind, line_no + window.count(b"\n", 0, start), line.split("\r")[-1], rule.hint, 0
                    )
                    found[rule.kind] = replace(first, count=first.count + 1)
        del array, offsets
        line_no += int(np.count_nonzero(np.frombuffer(data, np.uint8, cut) == 10))  # \n
        before = (before + data[max(0, cut - CONTEXT_BYTES) : cut])[-CONTEXT_BYTES:]
        data[: size - cut], keep = data[cut:size], size - cut
        if not got:
            gone = {kind for mine in found for kind in SUPERSEDES.get(mine, ())}
            return [f for kind, f in found.items() if kind not in gone]
