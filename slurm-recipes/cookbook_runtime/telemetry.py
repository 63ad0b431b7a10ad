"""Per-node GPU and NIC telemetry beside the launcher: one thread, a row per device every N seconds, one CSV a node.

:mod:`~cookbook_runtime.launch` starts it when ``COOKBOOK_TELEMETRY_DIR`` is set (the batch step sets
``RUN_DIR/.cookbook/telemetry/<job>-<restart>``); ``COOKBOOK_TELEMETRY_S`` is the interval (default 10; 0: off).
GPUs through NVML (``nvidia-ml-py``: what nvidia-smi and DCGM read); without it (CPU nodes) the host's rows only,
said once. NICs: ``/sys/class/infiniband/*/ports/*/counters``. ``<node>.csv`` has :data:`COLUMNS`, a row per
device (a GPU index, ``host``, ``<ib device>:<port>``) per sample: unix time, clocks (MHz), power and its limit (W),
temperature (C), utilization (%), memory used (MiB), NVML's clock-event reasons (a bitmask, :data:`REASONS`),
uncorrected ECC errors, the XIDs reported since the last sample (``;``), a port's error counters summed since boot,
the host's 1-minute load; an empty cell was not measured. ~60 bytes a row: 8 GPUs, a host and 4 ports every 10 s
for a week is ~47 MB; past :data:`MAX_BYTES`, and each time the file doubles again, the interval doubles.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import files

COLUMNS = ("time", "device", "sm_mhz", "mem_mhz", "power_w", "power_limit_w", "temp_c", "util_pct", "mem_used_mib",
           "throttle", "ecc_uncorrected", "xid", "nic_errors", "load")  # fmt: skip
# NVML clock-event reasons (nvmlClocksEventReason*): name -> (bit, a fault of the GPU or its node?)
REASONS = {"idle": (0x1, False), "app_clocks": (0x2, False), "sw_power_cap": (0x4, False), "hw_slowdown": (0x8, True),
           "sync_boost": (0x10, False), "sw_thermal": (0x20, True), "hw_thermal": (0x40, True),
           "hw_power_brake": (0x80, True)}  # fmt: skip
FAULT_MASK = sum(bit for bit, fault in REASONS.values() if fault)


def fault_names(bits: int | None) -> list[str]:
    """The reasons in ``bits`` that are faults (power capping and idle clocks are not)."""
    return [name for name, (bit, fault) in REASONS.items() if fault and (bits or 0) & bit]


NIC_ERRORS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
              "local_link_integrity_errors", "excessive_buffer_overrun_errors")  # fmt: skip
MAX_BYTES = 64 << 20
SYSFS_ENV = "COOKBOOK_IB_SYSFS"  # where the NICs' counters are (tests: a folder per node, ``{node}`` in the path)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _count(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def nic_rows(now: float, sysfs: Path) -> list[dict[str, Any]]:
    """One row per InfiniBand/EFA port: its error counters' sum since boot."""
    ports = sorted(sysfs.glob("*/ports/*"))
    errors = [sum(_count(port / "counters" / name) for name in NIC_ERRORS) for port in ports]
    return [{"time": now, "device": f"{p.parent.parent.name}:{p.name}", "nic_errors": e} for p, e in zip(ports, errors)]


class Nvml:
    """NVML's per-GPU readings; a reading NVML refuses (NotSupported on this GPU) stays empty."""

    def __init__(self, nvml: Any):
        self.nv = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.events = None
        with contextlib.suppress(Exception):
            self.events = nvml.nvmlEventSetCreate()
            for h in self.handles:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self.events)

    def _get(self, fn: str, *args: Any) -> Any:
        with contextlib.suppress(Exception):
            return getattr(self.nv, fn)(*args)
        return None

    def xids(self) -> dict[int, list[int]]:
        """XID events since the last call, per GPU index."""
        out: dict[int, list[int]] = {}
        while self.events is not None:
            try:
                event = self.nv.nvmlEventSetWait_v2(self.events, 0)
            except Exception:  # noqa: BLE001  (NVML's timeout: none pending)
                break
            index = self._get("nvmlDeviceGetIndex", event.device)  # ctypes handles do not compare by value
            out.setdefault(-1 if index is None else int(index), []).append(int(event.eventData))
        return out

    def rows(self, now: float) -> list[dict[str, Any]]:
        nv, xids, rows = self.nv, self.xids(), []
        for i, h in enumerate(self.handles):
            power, limit = self._get("nvmlDeviceGetPowerUsage", h), self._get("nvmlDeviceGetEnforcedPowerLimit", h)
            util, mem = self._get("nvmlDeviceGetUtilizationRates", h), self._get("nvmlDeviceGetMemoryInfo", h)
            rows.append({
                "time": now, "device": i,
                "sm_mhz": self._get("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
                "mem_mhz": self._get("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM),
                "power_w": None if power is None else round(power / 1000, 1),
                "power_limit_w": None if limit is None else round(limit / 1000),
                "temp_c": self._get("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
                "util_pct": getattr(util, "gpu", None), "mem_used_mib": None if mem is None else mem.used >> 20,
                "throttle": next((r for r in (self._get(f"nvmlDeviceGetCurrentClocks{n}Reasons", h)
                                              for n in ("Event", "Throttle")) if r is not None), None),  # old name
                "ecc_uncorrected": self._get("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             nv.NVML_VOLATILE_ECC),
                "xid": ";".join(map(str, xids.get(i, []))),
            })  # fmt: skip
        return rows


NVML_PACKAGE = "nvidia-ml-py"  # the distribution that installs ``pynvml``


def open_nvml() -> tuple[Nvml | None, str]:
    """NVML, or None and why not (one line)."""
    try:
        import pynvml  # noqa: PLC0415  (nvidia-ml-py; optional)

        return Nvml(pynvml), ""
    except ImportError:
        return None, f"{NVML_PACKAGE} is not installed in the nodes' Python"
    except Exception as e:  # noqa: BLE001  (NVMLError_LibraryNotFound, DriverNotLoaded: no GPU here)
        return None, f"NVML did not start ({type(e).__name__}: {e})"


def sample(nvml: Nvml | None, sysfs: Path, now: float) -> list[dict[str, Any]]:
    host = {"time": now, "device": "host", "load": round(os.getloadavg()[0], 2)}
    return [*(nvml.rows(now) if nvml else []), host, *nic_rows(now, sysfs)]


def csv_line(row: dict[str, Any]) -> str:
    return ",".join("" if row.get(c) is None else f"{row[c]:.1f}" if c == "time" else str(row[c]) for c in COLUMNS)


def run(out: Path, interval: float, stop: threading.Event, nvml: Nvml | None = None, sysfs: Path | None = None) -> None:
    """Sample until ``stop`` is set: a row per device appended to ``out`` every ``interval`` seconds."""
    sysfs = sysfs or Path(os.environ.get(SYSFS_ENV, "/sys/class/infiniband").replace("{node}", node_name()))
    new, limit = not out.exists(), MAX_BYTES
    with out.open("a", buffering=1) as f:
        if new:
            f.write(",".join(COLUMNS) + "\n")
        while True:
            t0 = time.monotonic()
            f.write("".join(csv_line(r) + "\n" for r in sample(nvml, sysfs, time.time())))
            if f.tell() > limit:  # a long run: half the rows from here on
                interval, limit = interval * 2, limit * 2
            if stop.wait(max(interval - (time.monotonic() - t0), 0.1)):
                return


# XIDs that mean the GPU or its link needs a reset, a reboot or service (NVIDIA's "XID Errors" catalogue,
# docs.nvidia.com/deploy/xid-errors): a double-bit ECC error (48), the micro-controller halted (62), a page retirement
# or row remap that failed (64), NVLink (74), fallen off the bus (79), too many single-bit errors (92), an
# uncontained ECC error (95), GSP timeouts and errors (119, 120), an unrecovered ECC error (140). Application faults
# (13, 31, 43, 45: a bad kernel, a killed process) are no node fault.
HARDWARE_XIDS = frozenset({48, 62, 64, 74, 79, 92, 95, 119, 120, 140})
XID_WINDOW_S = 24 * 3600.0  # a kernel-log XID older than this is history (the GPU has likely been reset since)
_STAMP = r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[,.]?\d*([+-]\d\d:?\d\d)?\s"  # dmesg's and the journal's ISO times
_XID = re.compile(_STAMP + r".*NVRM: Xid \((PCI:[^)]*)\): (\d+)", re.M)


def kernel_xids(log: str, now: float, window_s: float = XID_WINDOW_S) -> list[str]:
    """The hardware XIDs (:data:`HARDWARE_XIDS`) of the last ``window_s`` seconds in a kernel log with ISO times
    (``dmesg --time-format=iso``, ``journalctl -k -o short-iso``): one line each, ``XID 79 on PCI:0000:3b:00 at
    2026-11-28T10:15:32+00:00``."""
    out: dict[tuple[str, str], str] = {}  # the latest of each XID on each GPU
    for stamp, zone, pci, xid in _XID.findall(log):
        sign, digits = (zone[:1], zone[1:].replace(":", "")) if zone else ("+", "0000")
        offset = (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * (-1 if sign == "-" else 1)
        when = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) - offset
        if int(xid) in HARDWARE_XIDS and 0 <= now - when <= window_s:
            out[(xid, pci)] = f"XID {xid} on {pci} at {stamp}{zone}"
    return list(out.values())


def kernel_log() -> str:
    """The kernel log with ISO times: ``dmesg`` (often refused to users: ``kernel.dmesg_restrict``), else the
    journal's; "" when neither is readable (not judged)."""
    for command in (["dmesg", "--time-format=iso"], ["journalctl", "-k", "-o", "short-iso", "--since=-1d", "-q"]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
            if done.returncode == 0 and done.stdout:
                return done.stdout
    return ""


def memory_faults(index: int, pending_retired: int | None, remapped: Any) -> list[str]:
    """NVML's persistent memory state of GPU ``index``: pages retired but pending a reset (before Ampere), a row
    remap pending a reset or one that failed (Ampere on: ``(corrected, uncorrected, pending, failed)``)."""
    out = [f"GPU {index} has retired pages pending a GPU reset (NVML)"] if pending_retired else []
    if remapped is not None and len(remapped) >= 4 and remapped[3]:
        out.append(f"GPU {index}: a row remap failed (NVML): the GPU needs service")
    elif remapped is not None and len(remapped) >= 4 and remapped[2]:
        out.append(f"GPU {index} has a row remap pending a GPU reset (NVML)")
    return out


def gpu_faults(nvml: Nvml | None = None, log: str | None = None) -> list[str]:
    """The gate's GPU health, one failure per fault (a node fault when its peers show none): an XID NVML reports
    now or the kernel log shows from the last day (:func:`kernel_xids`), NVML's pending page retirements and row
    remaps, uncorrected ECC errors, clocks held by a hardware, thermal or power-brake slowdown (power capping and
    idle clocks are no fault)."""
    nvml, out = nvml or open_nvml()[0], list[str]()
    if nvml is None:
        return out
    for r in nvml.rows(time.time()):
        i, held = r["device"], fault_names(r["throttle"])
        out += [f"GPU {i} has uncorrected ECC errors: {r['ecc_uncorrected']}"] if r["ecc_uncorrected"] else []
        out += [f"GPU {i} reported an XID: {r['xid']} (`dmesg | grep -i xid` on the node)"] if r["xid"] else []
        out += [f"GPU {i} clocks held by a slowdown: {'+'.join(held)}"] if held else []
        h = nvml.handles[i]
        out += memory_faults(i, nvml._get("nvmlDeviceGetRetiredPagesPendingStatus", h),
                             nvml._get("nvmlDeviceGetRemappedRows", h))  # fmt: skip
    xids = kernel_xids(kernel_log() if log is None else log, time.time())  # before this check
    return out + [f"{x} in the kernel log" for x in xids]


def start_from_env() -> threading.Event | None:
    """The sampler thread of this node's launcher (daemon: it ends with the launcher); its stop event."""
    folder, every = os.environ.get(files.TELEMETRY_DIR_ENV), os.environ.get(files.TELEMETRY_S_ENV) or "10"
    interval = float(every) if every.replace(".", "", 1).isdigit() else 10.0
    if not folder or interval <= 0:
        return None
    out = Path(folder) / f"{node_name()}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    nvml, why = open_nvml()
    if nvml is None:
        print(f"cookbook: telemetry on {node_name()}: host only, {why}", file=sys.stderr, flush=True)
    stop = threading.Event()
    threading.Thread(target=run, args=(out, interval, stop, nvml), name="cookbook-telemetry", daemon=True).start()
    return stop
