"""Cache of eager and torch.compile baseline timings, measured in their own clean processes.

Keyed by task content, device name, torch version, precision, judge version and the timing
settings, so a rule change or another machine never reuses a stale figure. Each entry says
when and where it was measured (``stamp``): a judgement holds a cached figure to a fresh
check of its own (``recheck``) and names its origin in the verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cuda_agent.paths import home_dir
from cuda_agent.results import TimingStats


@dataclass(frozen=True)
class Baselines:
    eager: TimingStats | None
    compile: TimingStats | None
    bandwidth_gbs: float | None
    meaning: str = "wall"
    """What the times mean (a key of ``timing.TIME_MEANINGS``)."""
    measured_at: float | None = None
    """When they were measured (seconds since the epoch); None where unknown."""
    load: float | None = None
    """The load average over the minute before."""
    cpus: int | None = None
    """The CPUs the measuring process could use."""
    device_name: str = ""
    """The device they were measured on (``device_name``)."""


def stamp(baselines: Baselines, device: str) -> Baselines:
    """``baselines`` marked as measured now, on this machine's ``device``."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return replace(baselines, measured_at=time.time(), load=load,
                   cpus=len(os.sched_getaffinity(0)), device_name=device_name(device))


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    from cuda_agent.build.toolchain import _cpu_model

    return f"cpu:{_cpu_model()}:{os.cpu_count()}"


def cache_key(task_sha: str, device: str, precision: str, judge_version: str,
              timing: dict[str, Any], time_compile: bool) -> str:
    import torch

    parts = [task_sha, device_name(device), torch.__version__, precision, judge_version,
             json.dumps(timing, sort_keys=True), str(time_compile)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _path(key: str) -> Path:
    return home_dir() / "baselines" / f"{key}.json"


def load(key: str) -> Baselines | None:
    """The entry under ``key``; None when there is none or it cannot be read as one."""
    path = _path(key)
    try:
        data = json.loads(path.read_text())
        stats = {k: TimingStats(**data[k]) if data.get(k) else None
                 for k in ("eager", "compile")}
        return Baselines(**{**data, **stats})
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def store(key: str, baselines: Baselines) -> None:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(baselines)))
    tmp.replace(path)


def forget(key: str) -> None:
    """Remove the entry under ``key`` (a figure found wrong), if there is one."""
    _path(key).unlink(missing_ok=True)
