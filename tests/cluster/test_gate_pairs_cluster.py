"""Issue #41 item 3 on the private 3-node cluster `nodes3`: the gate's pairwise bandwidth test names the node
whose link is slow.

n2's link is throttled (``tc ... tbf`` on its host-side veth: everything sent to n2 at 2 MB/s, under the
local-cpu floor of 5 MB/s). A 3-node FSDP job's gate pairs n1-n2 (round 1: under the floor; n1 or n2?) and
then n1 with the odd node n3 (round 2: above it): n1 is good, so n2 is named, by name, and n1 and n3 are not.
The job is cancelled once the gate has spoken: what happens after a blame is tests/cluster/test_preflight_cluster.py's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cluster_wait import wait_for as _wait_for
from fsdp_job import fsdp_spec as _spec

from cookbook.render import write_job
from cookbook.slurm.client import SlurmClient, read_output

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_throttled_link_is_named_by_node_by_the_pairwise_gate(nodes3_cluster, tiny_assets, job_dir: Path):
    if nodes3_cluster.status().mode != "netns":
        pytest.skip("throttling one node's link needs the netns mode of the local cluster")
    veth = f"{nodes3_cluster.cfg.netns_prefix}v2"  # n2's link, host side (cookbook/local/cluster.py)
    slurm = SlurmClient(nodes3_cluster.env())
    script = write_job(_spec(job_dir, tiny_assets, "gate-pairs", 2, nodes=3), job_dir / "job.sbatch")
    (job_dir / "logs").mkdir()
    subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", "16mbit", "burst", "64kb",
                    "latency", "2s"], check=True)  # fmt: skip
    try:
        job = slurm.submit(script, cwd=job_dir)
        log = job_dir / "logs" / f"gate-pairs-{job}.out"
        _wait_for(lambda: "cookbook: pre-flight took" in read_output(log), 400, "the gate's verdict")
        slurm.cancel(job)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
    text = read_output(log)
    named = re.findall(r"^cookbook: pre-flight failed on (\S+): (.*)$", text, re.M)
    assert [node for node, _ in named] == ["n2"], text[-3000:]
    assert re.match(r"link bandwidth with n1: [\d.e-]+ GB/s < 0.005 GB/s \(n1 passed with n3\)", named[0][1]), named
    assert "cookbook: pre-flight ok on n1" in text and "cookbook: pre-flight ok on n3" in text, text[-3000:]
    assert "collective part failed" not in text, text[-3000:]  # every rank got through both rounds
    print("gate:", re.findall(r"cookbook: pre-flight took .*", text))
