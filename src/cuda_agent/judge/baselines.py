"""Cache of eager and torch.compile baseline timings, measured in their own clean processes.

Keyed by task content, device name, torch version, precision, judge version and the timing
settings, so a rule change or another machine never reuses a stale figure.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
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
    path = _path(key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    stats = {k: TimingStats(**data[k]) if data.get(k) else None for k in ("eager", "compile")}
    return Baselines(stats["eager"], stats["compile"], data.get("bandwidth_gbs"),
                     data.get("meaning", "wall"))


def store(key: str, baselines: Baselines) -> None:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(baselines)))
    tmp.replace(path)
