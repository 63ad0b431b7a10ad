"""A fake ``pynvml`` (nvidia-ml-py's module) for the local bench: NVML's calls the telemetry sampler makes, answered
from a JSON file of recorded values, so a CPU node can show a throttled GPU, an XID or ECC errors.

Put this folder first on the job's ``PYTHONPATH`` and name the file in ``COOKBOOK_FAKE_NVML``::

    {"default": {"gpus": 8, "sm_mhz": 1980, "mem_mhz": 2619, "power_w": 650, "power_limit_w": 700,
                 "temp_c": 62, "util_pct": 99, "mem_used_mib": 61000, "throttle": 0, "ecc_uncorrected": 0},
     "nodes": {"n2": {"gpu": {"4": {"sm_mhz": 1410, "throttle": 8}}, "xid": {"3": [79]}, "after_s": 0}}}

A node is the Slurm node the process runs on (``SLURMD_NODENAME``). Its values hold from ``after_s`` seconds after
``nvmlInit`` (0: at once; later, they miss the gate's check and appear in the run's telemetry only); each XID is
reported once, as NVML reports an event once. Not a mock of NVML's behaviour beyond these readings.
"""

from __future__ import annotations

import json
import os
import socket
import time
from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
nvmlEventTypeXidCriticalError = 0x8


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801  (pynvml's name)
    pass


_state: dict[str, Any] = {}


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def nvmlInit() -> None:  # noqa: N802
    with open(os.environ["COOKBOOK_FAKE_NVML"]) as f:
        data = json.load(f)
    node = data.get("nodes", {}).get(_node(), {})
    _state["default"], _state["gpu"] = data.get("default", {}), node.get("gpu", {})
    _state["xids"] = [(int(g), int(x)) for g, codes in node.get("xid", {}).items() for x in codes]
    _state["at"] = time.monotonic() + float(node.get("after_s", 0))


def nvmlShutdown() -> None:  # noqa: N802
    _state.clear()


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return int(_state["default"].get("gpus", 8))


def nvmlDeviceGetHandleByIndex(i: int) -> int:  # noqa: N802
    return i


def nvmlDeviceGetIndex(h: int) -> int:  # noqa: N802
    return h


def _value(h: int, name: str) -> Any:
    own = _state["gpu"].get(str(h), {}) if time.monotonic() >= _state["at"] else {}
    value = own.get(name, _state["default"].get(name))
    if value is None:
        raise NVMLError(f"{name}: NotSupported")
    return value


def nvmlDeviceGetClockInfo(h: int, kind: int) -> int:  # noqa: N802
    return int(_value(h, "sm_mhz" if kind == NVML_CLOCK_SM else "mem_mhz"))


def nvmlDeviceGetPowerUsage(h: int) -> int:  # noqa: N802
    return int(_value(h, "power_w") * 1000)


def nvmlDeviceGetEnforcedPowerLimit(h: int) -> int:  # noqa: N802
    return int(_value(h, "power_limit_w") * 1000)


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:  # noqa: N802
    return int(_value(h, "temp_c"))


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(gpu=int(_value(h, "util_pct")), memory=0)


def nvmlDeviceGetMemoryInfo(h: int) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(used=int(_value(h, "mem_used_mib")) << 20)


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:  # noqa: N802
    return int(_value(h, "throttle"))


def nvmlDeviceGetTotalEccErrors(h: int, kind: int, counter: int) -> int:  # noqa: N802
    return int(_value(h, "ecc_uncorrected"))


def nvmlEventSetCreate() -> str:  # noqa: N802
    return "events"


def nvmlDeviceRegisterEvents(h: int, types: int, event_set: str) -> None:  # noqa: N802
    pass


def nvmlEventSetWait_v2(event_set: str, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
    if not _state.get("xids") or time.monotonic() < _state["at"]:
        raise NVMLError_Timeout("Timeout")
    gpu, xid = _state["xids"].pop(0)
    return SimpleNamespace(device=gpu, eventData=xid, eventType=nvmlEventTypeXidCriticalError)
