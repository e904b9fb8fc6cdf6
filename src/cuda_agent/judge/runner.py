"""Start judge workers in their own sessions, hand them jobs, read back their results.

A worker starts at once (importing torch) and waits for its job on stdin, so its start-up
overlaps the build. It runs in a new session; when it ends, every process left in that
session is killed and counted. Timing marks come through a pipe that this process reads
and timestamps with its own clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerOutcome:
    """What came back from one worker process."""

    ok: bool
    result: dict[str, Any]
    failure: str | None
    stderr_tail: str
    marks: tuple[tuple[str, float], ...] = ()
    leftover: int = 0


class Worker:
    """One fresh interpreter for one job."""

    def __init__(self, out_dir: Path, memory_limit_bytes: int | None = None):
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        self._stdout = open(out_dir / "stdout.log", "wb")  # noqa: SIM115
        self._stderr = open(out_dir / "stderr.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cuda_agent.judge.worker", str(out_dir), str(write_fd)],
            stdin=subprocess.PIPE, stdout=self._stdout, stderr=self._stderr, env=env,
            pass_fds=(write_fd,), start_new_session=True,
            preexec_fn=_limit_memory(memory_limit_bytes) if memory_limit_bytes else None)
        os.close(write_fd)
        self.marks: list[tuple[str, float]] = []
        self._reader = threading.Thread(target=self._read_marks, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read_marks(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                if len(self.marks) < 16:
                    self.marks.append((line.decode(errors="replace").strip()[:40],
                                       time.monotonic()))

    def run(self, job: dict[str, Any], timeout_s: float) -> WorkerOutcome:
        """Send ``job`` and wait for the result, at most ``timeout_s`` seconds."""
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = self.proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            code, timed_out = None, True
        leftover = self._stop()
        self._reader.join(timeout=1.0)
        return self._outcome(code, timed_out, timeout_s, leftover)

    def cancel(self) -> None:
        """Stop a worker that will not be given a job."""
        self._stop()

    def _stop(self) -> int:
        """Kill the worker's session and group; return how many other processes were left."""
        leftover = _kill_session(self.proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stdout.close()
        self._stderr.close()
        return leftover

    def _outcome(self, code: int | None, timed_out: bool, timeout_s: float, leftover: int
                 ) -> WorkerOutcome:
        out = self.out_dir
        stderr_tail = _tail(out / "stderr.log")
        result_path = out / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        stage_path = out / "stage"
        stage = stage_path.read_text() if stage_path.exists() else "start"
        marks = tuple(self.marks)
        if timed_out:
            return WorkerOutcome(False, result, f"timed out after {timeout_s:.0f} s "
                                 f"(stage: {stage})", stderr_tail, marks, leftover)
        if not result:
            return WorkerOutcome(False, {"stage": stage},
                                 f"{_describe_exit(code, stderr_tail)} (stage: {stage})",
                                 stderr_tail, marks, leftover)
        if not result.get("ok"):
            return WorkerOutcome(False, result, f"{result.get('stage')}: {result.get('error')}",
                                 stderr_tail, marks, leftover)
        return WorkerOutcome(True, result, None, stderr_tail, marks, leftover)


def _limit_memory(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def _kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` other than its leader; return how many."""
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == sid:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # field 6 of stat: session id
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def _describe_exit(code: int | None, stderr_tail: str) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = f"process killed by {name}"
    else:
        what = f"process exited with code {code} before reporting"
    last = stderr_tail.strip().splitlines()[-1:] if stderr_tail.strip() else []
    return what + (f": {last[0][:300]}" if last else "")


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
