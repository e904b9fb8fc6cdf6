"""Watching a pool load run: GPU utilisation from nvidia-smi, where each job ran when, and
how the GPU's turn was held (used by ``pool_load.py``)."""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


class GpuSampler:
    """Utilisation of the given GPUs every ``period_ms``: (monotonic time, index, percent)."""

    def __init__(self, gpus: list[int], period_ms: int):
        self.samples: list[tuple[float, int, float]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        if not gpus:
            return
        if shutil.which("nvidia-smi"):
            self.source = f"nvidia-smi -lms {period_ms}"
            # each line carries nvidia-smi's own timestamp: its output through a pipe may be
            # buffered, so the time a line is read is not the time it was sampled
            line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
            self._proc = subprocess.Popen(
                [*line_buffered, "nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
                 "--format=csv,noheader,nounits", "-lms", str(period_ms),
                 "-i", ",".join(map(str, gpus))],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read_smi, daemon=True)
        else:
            try:
                import pynvml  # type: ignore[import-not-found]
            except ImportError:
                return
            self.source = f"pynvml every {period_ms} ms"
            self._thread = threading.Thread(target=self._poll_nvml, args=(pynvml, gpus,
                                                                         period_ms), daemon=True)
        self._thread.start()

    def _read_smi(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        offset = time.time() - time.monotonic()
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                try:  # local time, e.g. 2025/01/31 12:00:00.123
                    at = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"
                                                    ).timestamp() - offset
                except ValueError:
                    at = time.monotonic()
                self.samples.append((at, int(parts[1]), float(parts[2])))

    def _poll_nvml(self, nvml: Any, gpus: list[int], period_ms: int) -> None:
        nvml.nvmlInit()
        handles = {g: nvml.nvmlDeviceGetHandleByIndex(g) for g in gpus}
        while not self._stop.wait(period_ms / 1000):
            now = time.monotonic()
            for g, h in handles.items():
                self.samples.append((now, g, float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)))

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(5)

    def summary(self, gpus: list[int], start: float, end: float) -> dict[str, Any]:
        out = {}
        for g in gpus:
            values = [u for t, i, u in self.samples if i == g and start <= t <= end]
            out[str(g)] = {"samples": len(values),
                           "mean_util": statistics.fmean(values) / 100 if values else None,
                           "busy_share": (sum(u > 0 for u in values) / len(values)
                                          if values else None)}
        return out


class Monitor:
    """Polls the pool and the handles: when each job was handed out and ended, where it ran,
    and the last moment the queue held a job."""

    def __init__(self, pool: Any, handles: list[Any], places: list[str], period_s: float = 0.01):
        self.pool, self.handles, self.places = pool, handles, places
        self.dispatched: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.where: dict[int, str] = {}
        self.last_queued = time.monotonic()
        self.max_running = 0
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _place(self, pid: int) -> str:
        pids = self.pool.worker_pids()
        return self.places[pids.index(pid)] if pid in pids else f"pid{pid}"

    def _run(self) -> None:
        while not self._stop.is_set():  # jobs may still be added to ``handles``
            self._poll()
            self._stop.wait(self._period)

    def _poll(self) -> bool:
        """Record what changed since the last poll; True once every job has ended."""
        now = time.monotonic()
        stats = self.pool.stats()
        if stats.queued:
            self.last_queued = now
        self.max_running = max(self.max_running, stats.running)
        for k, h in enumerate(self.handles):
            if k in self.finished:
                continue
            pid = h.worker_pid
            if pid is not None and k not in self.dispatched:
                self.dispatched[k] = now
                self.where[k] = self._place(pid)
            if h.done():
                self.finished[k] = now
                self.dispatched.setdefault(k, now)
        return len(self.finished) == len(self.handles)

    def stop(self) -> None:
        """Stop polling, then poll once more: the caller may have seen the last result
        before the thread did."""
        self._stop.set()
        self._thread.join(5)
        self._poll()


def turn_shares(log: Path, start: float, end: float) -> dict[str, dict[str, float]]:
    """How each GPU's turn was held over ``[start, end]`` (monotonic seconds), from the
    judges' log of it (``gpu_turn.LOG_ENV``), per lock file: the share of the window it was
    held ``exclusive``; ``held`` at all (shared by one judge or more, or exclusive);
    ``shared_only`` (held, but by no exclusive holder: untimed GPU work of one judge or
    more); ``timing`` (a worker's timed calls running); and ``shared_depth``, the mean
    number of judges holding it shared while any did."""
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    window = end - start
    out: dict[str, dict[str, float]] = {}
    for lock in sorted({r["lock"] for r in rows}):
        def spans(kind: str, lock: str = lock) -> list[tuple[float, float]]:
            return [(max(r["start"], start), min(r["end"], end)) for r in rows
                    if r["lock"] == lock and r["kind"] == kind
                    and r["end"] > start and r["start"] < end]

        exclusive, shared = spans("exclusive"), spans("shared")
        held = _union([*exclusive, *shared])
        shared_any = _union(shared)
        out[lock] = {
            "exclusive": round(sum(e - s for s, e in exclusive) / window, 3),
            "held": round(held / window, 3),
            "shared_only": round((held - sum(e - s for s, e in exclusive)) / window, 3),
            "timing": round(_union(spans("timing")) / window, 3),
            "shared_depth": round(sum(e - s for s, e in shared) / shared_any, 2)
            if shared_any else 0.0}
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    """The seconds covered by any of ``spans``."""
    total, reach = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total
