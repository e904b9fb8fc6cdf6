"""No worker outlives its judge, and a held candidate's worker outlives its own report.

A judge killed by SIGKILL leaves no worker behind: each dies by its lifeline (SIGIO when the
judge's end of a pipe closes) or, its leader, with the thread that started it. That thread
is the judge's spawning thread, not the caller's: a judge called from a thread that ends
keeps its workers. A candidate whose code breaks what its worker does after reporting still
stays, held, while the judge reads what it loaded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cuda_agent.execution.sandbox_local import namespaces_work
from cuda_agent.judge import confine
from cuda_agent.judge.runner import Worker, _confine_prefix
from cuda_agent.judge.worker import LIFELINE_ENV
from cuda_agent.procs import descendants
from tests.conftest import SCALE_ADD_TASK
from tests.judge.adversarial.helpers import (
    ROOT,
    judge,
    said,
    scale_add_model,
    write_file_candidate,
    write_scale_add,
    write_task,
)

# the reference's forward never returns: its worker spins, as one stuck in an OpenMP barrier
SPINNING_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        while True:
            x = x + 1


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
'''
PLAIN_CANDIDATE = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + 1
'''
# a hostile candidate: SIGIO ignored (its lifeline cut), its forward never returns
SPINNING_CANDIDATE = '''
import signal

import torch.nn as nn

signal.signal(signal.SIGIO, signal.SIG_IGN)


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()

    def forward(self, x, y):
        while True:
            x = x + 1
'''
JUDGE = '''
import sys
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.tasks import load_task
# cpu_size="full": sizing runs the forward on meta first, where the spinning one never returns
config = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.5,
                     process_timeout_s=3600, cpu_size="full")
Judge(config).judge(load_task(sys.argv[1]), Candidate.from_ref(sys.argv[2]))
'''
GONE_WITHIN_S = 60.0
"""A generous bound on how long the killed judge's workers may take to die."""


def _state(pid: int) -> tuple[str, int] | None:
    """A live process's state letter and start time, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[19])


def _alive(processes: dict[int, int]) -> list[int]:
    """Those of ``processes`` (pid: start time) still running (a zombie has ended)."""
    found = []
    for pid, start in processes.items():
        state = _state(pid)
        if state is not None and state[0] != "Z" and state[1] == start:
            found.append(pid)
    return found


def _workers(judge_pid: int) -> list[tuple[int, Path]]:
    """The worker interpreters below ``judge_pid`` and their folders."""
    found = []
    for pid in descendants(judge_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cuda_agent.judge.worker" in argv:
            at = argv.index(b"cuda_agent.judge.worker")
            found.append((pid, Path(argv[at + 1].decode())))
    return found


def _stage(folder: Path) -> str:
    try:
        return (folder / "stage").read_text()
    except OSError:
        return ""


def _spinning(judge_pid: int, preload: str) -> bool:
    """Whether a worker of the kind ``preload`` names (``torch``: a baseline's, ``trace``: a
    candidate's) is in its forward or timing stage (where the spinning calls are)."""
    for pid, folder in _workers(judge_pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2] == preload.encode() \
                    and _stage(folder) in ("forward", "timing"):
                return True
    return False


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("task_code", "candidate_code", "spinner"), [
    (SPINNING_TASK, PLAIN_CANDIDATE, "torch"),
    (SCALE_ADD_TASK, SPINNING_CANDIDATE, "trace")], ids=["reference", "confined-candidate"])
def test_a_judge_killed_by_sigkill_leaves_no_worker(tmp_path: Path, task_code: str,
                                                    candidate_code: str, spinner: str):
    """Every process below the judge (the worker spinning in its forward, the others
    waiting; a confined one's namespace) ends once the judge is killed, a candidate that
    ignores SIGIO too (its confined namespace dies with its leader)."""
    if spinner == "trace" and not namespaces_work():
        pytest.skip("the candidate's namespace: confinement is not available here")
    task = tmp_path / "task.py"
    task.write_text(task_code)
    candidate = write_file_candidate(tmp_path / "c", candidate_code)
    process = subprocess.Popen([sys.executable, "-c", JUDGE, str(task), str(candidate)],
                               cwd=ROOT, start_new_session=True)
    left: dict[int, int] = {}
    try:
        while not _spinning(process.pid, spinner):
            assert process.poll() is None, "the judge ended before a worker spun"
            time.sleep(0.2)
        time.sleep(1.0)  # it spins
        left = {pid: state[1] for pid in descendants(process.pid)
                if (state := _state(pid)) is not None}
        assert len(_workers(process.pid)) >= 2, "the reference and a candidate worker"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        began = time.monotonic()
        while _alive(left) and time.monotonic() - began < GONE_WITHIN_S:
            time.sleep(0.2)
        assert not _alive(left), f"processes outlived their judge: {_alive(left)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
        for pid in _alive(left):  # only what this test's judge started, by its id
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("confined", [False, True], ids=["plain", "confined"])
def test_the_lifeline_alone_ends_a_worker(tmp_path: Path, confined: bool):
    """A process holding its lifeline (no parent-death signal) is ended by SIGIO the moment
    the other end closes; confined, through ``unshare`` and the namespace's init shell (which
    then exits with 128 + SIGIO, ending the namespace)."""
    if confined and not namespaces_work():
        pytest.skip("confinement is not available here")
    end, judges_end = os.pipe()
    armed = "from cuda_agent.judge.worker import hold_lifeline; hold_lifeline(); " \
            "print('armed', flush=True); import time; time.sleep(3600)"
    argv = [sys.executable, "-c", armed]
    if confined:
        argv = _confine_prefix(tmp_path, confine.confinement("on")) + argv
    process = subprocess.Popen(argv, cwd=ROOT, pass_fds=(end,), start_new_session=True,
                               env={**os.environ, LIFELINE_ENV: str(end)},
                               stdout=subprocess.PIPE)
    os.close(end)
    try:
        assert process.stdout.readline().strip() == b"armed"
        os.close(judges_end)
        expected = 128 + signal.SIGIO if confined else -signal.SIGIO
        assert process.wait(timeout=GONE_WITHIN_S) == expected
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.timeout(300)
def test_a_worker_outlives_the_thread_that_asked_for_it():
    """Workers are started from the judge's spawning thread: the end of the caller's thread
    (a service's request thread) does not end them."""
    made: list[Worker] = []
    caller = threading.Thread(target=lambda: made.append(Worker(trace=False)))
    caller.start()
    caller.join()
    worker = made[0]
    try:
        assert worker.wait_idle(240.0), "the worker did not start"
        time.sleep(0.5)
        assert worker.proc.poll() is None, "the worker died with the caller's thread"
    finally:
        worker.close()


# the worker's own report writer, reached through the harness, replaced by one that writes
# the report and then fails; an exception that reaches the top ends the process at once
BREAKS_AFTER_REPORT = '''
import os
import sys

_W = type(sys.meta_path[0]).find_spec.__globals__["make_inputs"].__globals__
_real_report = _W["_report"]


def _report(result, path):
    _real_report(result, path)
    sys.excepthook = lambda *exc: os._exit(0)
    raise RuntimeError("the candidate broke what follows the report")


_W["_report"] = _report
'''


@pytest.mark.timeout(900)
def test_a_candidate_that_breaks_the_post_report_path_is_still_checked(tmp_path: Path):
    """rt2 G1: the held worker stays while the judge reads what its process loaded (were it
    gone, its code could not be checked and the candidate would be refused)."""
    candidate = write_scale_add(tmp_path / "c", scale_add_model(
        "return cuda_extension.scale_add(x, y, self.alpha)", BREAKS_AFTER_REPORT))
    result = judge(write_task(tmp_path, "scale_add"), candidate)
    assert result.correct and result.reward >= 1, said(result)

