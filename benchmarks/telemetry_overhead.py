"""What the runtime's telemetry sampler costs a node (issue #32): CPU time per sample, and bytes per sample.

    python benchmarks/telemetry_overhead.py [--samples 300]

One sample of an 8-GPU node with 4 InfiniBand ports, the way the sampler takes it (``cookbook_runtime.telemetry``):
every NVML reading of every GPU, the XID events, the ports' error counters from sysfs, one CSV line a device. NVML
here is the local bench's fake (recorded values, ``cookbook/local/fake_nvml``), so the figure is our side of a
sample -- the Python, the CSV, the sysfs reads; a real NVML call adds its own cost (microseconds each on a
driver; the GPU check measures it where a device is lent). Beside it, the simplest honest baseline: the same
readings as one ``nvidia-smi``-style loop writing nothing (the calls alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "slurm-recipes"), str(ROOT / "cookbook" / "local" / "fake_nvml")]

from cookbook_runtime import telemetry  # noqa: E402

HEALTHY = {"gpus": 8, "sm_mhz": 1980, "mem_mhz": 2619, "power_w": 650, "power_limit_w": 700, "temp_c": 62,
           "util_pct": 99, "mem_used_mib": 61000, "throttle": 0, "ecc_uncorrected": 0}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="telemetry-bench-"))
    (tmp / "nvml.json").write_text(json.dumps({"default": HEALTHY}))
    os.environ["COOKBOOK_FAKE_NVML"] = str(tmp / "nvml.json")
    for dev in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"):
        counters = tmp / "ib" / dev / "ports" / "1" / "counters"
        counters.mkdir(parents=True)
        for name in telemetry.NIC_ERRORS:
            (counters / name).write_text("0\n")
    import pynvml  # the fake (first on sys.path)

    nvml = telemetry.Nvml(pynvml)
    calls = time.process_time()
    for _ in range(args.samples):
        nvml.rows(time.time())
    calls = (time.process_time() - calls) / args.samples
    out, stop, seen = tmp / "n1.csv", threading.Event(), [0]

    def wait(timeout: float) -> bool:  # no sleeping: every sample back to back
        seen[0] += 1
        return seen[0] >= args.samples

    stop.wait = wait  # type: ignore[method-assign]
    cpu = time.process_time()
    telemetry.run(out, 10.0, stop, nvml, tmp / "ib")
    cpu = (time.process_time() - cpu) / args.samples
    size = (out.stat().st_size - len(",".join(telemetry.COLUMNS)) - 1) / args.samples
    week = size * 7 * 86400 / 10
    print(f"| NVML readings alone (8 GPUs, fake NVML) | {calls * 1e3:.2f} ms CPU a sample |")
    print(f"| the sampler: readings + 4 ports + CSV | {cpu * 1e3:.2f} ms CPU a sample, {size:.0f} bytes |")
    print(f"| at the default 10 s | {cpu / 10 * 100:.3f}% of one core; {week / 1e6:.0f} MB a node-week |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
