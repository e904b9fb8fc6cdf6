"""Start a judge worker in its own process group, wait with a limit, read its result."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
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


def run_worker(job: dict[str, Any], out_dir: Path, timeout_s: float) -> WorkerOutcome:
    """Run ``job`` in a fresh interpreter; crashes and hangs become a ``failure`` string."""
    out_dir.mkdir(parents=True, exist_ok=True)
    job = {**job, "out_dir": str(out_dir)}
    job_path = out_dir / "job.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    with open(out_dir / "stdout.log", "wb") as stdout, open(out_dir / "stderr.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cuda_agent.judge.worker", str(job_path)],
                                stdout=stdout, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            code = None
        _kill_group(proc)
    stderr_tail = _tail(out_dir / "stderr.log")
    result_path = out_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    stage_path = out_dir / "stage"
    stage = stage_path.read_text() if stage_path.exists() else "start"
    if timed_out:
        return WorkerOutcome(False, result, f"timed out after {timeout_s:.0f} s "
                             f"(stage: {stage})", stderr_tail)
    if not result:
        return WorkerOutcome(False, {"stage": stage},
                             f"{_describe_exit(code, stderr_tail)} (stage: {stage})", stderr_tail)
    if not result.get("ok"):
        return WorkerOutcome(False, result, f"{result.get('stage')}: {result.get('error')}",
                             stderr_tail)
    return WorkerOutcome(True, result, None, stderr_tail)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


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
