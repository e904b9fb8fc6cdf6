"""Probe tasks in a pool of worker processes with a time limit per task.

A task that crashes its worker or runs past ``timeout_s`` costs that worker (its whole
process group is killed and a fresh one starts on the next task); the task gets a failed
verdict naming what happened, and the pipeline goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cuda_agent.paths import home_dir


class TaskTimeout(RuntimeError):
    pass


class Worker:
    """One ``cuda_agent.synth.worker`` process."""

    def __init__(self, threads: int, memory_limit_gb: float | None):
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the worker
            prefix="synth-worker-", suffix=".log", delete=False)
        env = {**os.environ, "CUDA_AGENT_SYNTH_THREADS": str(threads),
               "OMP_NUM_THREADS": str(threads), "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_OFFLINE": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(home_dir() / "synth" / "inductor"),
               "CUDA_AGENT_SYNTH_MEMORY_GB": str(memory_limit_gb or 0)}
        self.proc = subprocess.Popen([sys.executable, "-m", "cuda_agent.synth.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, start_new_session=True)
        self.served = 0

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        self.served += 1
        deadline = time.monotonic() + timeout_s
        fd, buf = self.proc.stdout.fileno(), b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TaskTimeout(f"no result within {timeout_s:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(_died(self.proc.wait(), self.tail()))
                buf += chunk
        return json.loads(buf)

    def tail(self) -> str:
        text = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return text[-1][:300] if text else "(no output)"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        Path(self.log.name).unlink(missing_ok=True)


def _died(code: int, tail: str) -> str:
    """Why a worker ended without answering, in words a user can act on."""
    if code == -signal.SIGKILL:
        return ("worker killed by SIGKILL, most likely out of memory: the task's tensors may "
                f"not fit this machine (shrink its sizes, e.g. --max-numel); last output: {tail}")
    if code < 0:
        return f"worker killed by {signal.Signals(-code).name}: {tail}"
    return f"worker exited with code {code} before answering: {tail}"


class WorkerPool:
    """``size`` workers shared by threads; ``probe`` blocks until one is free."""

    def __init__(self, size: int, device: str, recycle_after: int = 50,
                 memory_limit_gb: float | None = None):
        self.device = device
        self.recycle_after = recycle_after
        cores = os.cpu_count() or 1
        self.threads = max(1, cores // size) if device == "cpu" else 1
        self.memory_limit_gb = memory_limit_gb if device == "cpu" else None
        self.idle: queue.Queue[Worker | None] = queue.Queue()
        for _ in range(size):
            self.idle.put(None)  # started lazily

    def probe(self, code: str, filters: dict[str, Any], seed: int, timeout_s: float
              ) -> dict[str, Any]:
        worker = self.idle.get() or Worker(self.threads, self.memory_limit_gb)
        request = {"code": code, "device": self.device, "filters": filters, "seed": seed}
        try:
            result = worker.call(request, timeout_s)
        except TaskTimeout as exc:
            worker.kill()
            self.idle.put(None)
            return {"error": f"timeout: {exc}"}
        except Exception as exc:
            worker.kill()
            self.idle.put(None)
            return {"error": f"crash: {exc}"}  # the filter names the kind once
        if worker.served >= self.recycle_after:
            worker.kill()
            worker = None
        self.idle.put(worker)
        return result

    def close(self) -> None:
        while not self.idle.empty():
            worker = self.idle.get_nowait()
            if worker is not None:
                worker.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
