"""Start judge workers in their own sessions, hand them jobs, read back their results.

A worker starts at once (importing torch) and waits for its job on stdin, so its start-up
overlaps the build. It runs in a new session; when it ends, every process it left (in that
session or below it) is killed and counted. Timing marks come through a pipe that this
process reads and timestamps with its own clock.

A confined worker (the candidate's) runs in namespaces of its own (``Confinement``): the
file system read-only except its folder and the paths named writable, a private /tmp, no
network, and a pid namespace, so nothing it starts outlives it or can signal the judge.
Its outputs come back in a sealed memory file passed down at start, or in device memory
the judge lends it with its job (``device_pack``, through a socket passed down at start).

No worker outlives the judge's process, however that ends (SIGKILL included): each holds
the read end of a pipe whose write end only the judge holds (its lifeline: the judge's
death closes it and the worker takes SIGIO, ``worker.hold_lifeline``), and each worker's
leader is killed when the thread that started it ends (``PR_SET_PDEATHSIG``): every worker
is started from one thread that lasts as long as the judge's process (``_spawn``). A
confined worker's leader is ``unshare --kill-child``, so its death ends the namespace and
every process in it, whatever the candidate did to its own lifeline.

What a worker reports is read as typed fields (``report.report``): a candidate's process may
write anything there, and nothing it writes can raise in the judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent import leftovers
from cuda_agent.judge import calls, device_pack, shared_pack
from cuda_agent.judge.driver import CallDriver, DriverPlan
from cuda_agent.judge.report import REPORT_BYTES, WorkerOutcome, outcome, read_small
from cuda_agent.judge.turn_phases import PhaseTurns
from cuda_agent.judge.worker import LIFELINE_ENV
from cuda_agent.procs import Proc, descendants, die_with_parent, session_members, snapshot

PACK_BYTES = 64 * 2**30
WORKER_DIR = "cuda-agent-worker-"
"""Prefix of a worker's own folder (``leftovers``: swept once its judge is gone)."""
"""Capacity of an unconfined candidate's sealed memory file (sparse: only what is written
takes memory)."""


@dataclass(frozen=True)
class Confinement:
    """Where a confined worker may read (``keep``: paths a private /tmp would hide) and
    write (``rw``) besides its own folder."""

    keep: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    pack_bytes: int = 64 * 2**30
    """Capacity of the sealed memory file the worker hands its outputs over in (sparse)."""


class Worker:
    """One fresh interpreter for one job.

    It imports torch as soon as it starts (and, with ``trace``, what the candidate's
    dispatch-mode trace imports), so it can be started ahead of time (a spare) and given its
    job later. With ``hold`` the worker reports, signals ``ready`` and stays alive
    (its output pack stays mapped) until ``end`` or ``close``. A confined worker given a
    ``device_pack`` (a ``DeviceMemory``) before its job is sent receives it with the job
    (or with ``prepare``).
    """

    def __init__(self, memory_limit_bytes: int | None = None, root: Path | None = None,
                 confine: Confinement | None = None, env: dict[str, str] | None = None,
                 trace: bool = True, candidate: bool = False):
        """``candidate``: a candidate's worker, lent the packs its kept calls are handed
        over in (a sealed memory file, and a socket for a device pack); ``confine``
        confines it. Every worker has a call socket (``calls``) for its timed calls."""
        self.out_dir = leftovers.owned_dir(WORKER_DIR, root)
        read_fd, write_fd = os.pipe()
        life_end, self._lifeline = os.pipe()  # not inherited by any other child (O_CLOEXEC)
        env = {**os.environ, **(env or {}), "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", LIFELINE_ENV: str(life_end)}
        self._stdout = open(self.out_dir / "stdout.log", "wb")  # noqa: SIM115
        self._stderr = open(self.out_dir / "stderr.log", "wb")  # noqa: SIM115
        # read through the judge's own descriptor: the worker may replace the path
        self._stderr_read = os.open(self.out_dir / "stderr.log", os.O_RDONLY)
        # the worker's imports load the package's copy of its module before runpy runs it
        # (as the worker wants: ``worker``'s end); the warning runpy prints for that would
        # end every failed worker's stderr, which the judge's errors quote
        argv = [sys.executable, "-W", _RUNPY_WARNING, "-m", "cuda_agent.judge.worker",
                str(self.out_dir), str(write_fd), "trace" if trace else "torch"]
        prefix = _confine_prefix(self.out_dir, confine) if confine is not None else None
        self.confined = prefix is not None
        self.candidate = candidate
        self.pack_fd: int | None = None
        self.device_pack = None  # a cuda_vmm.DeviceMemory lent with the job (candidates)
        self._pack_sock = worker_sock = None
        self._lent = False  # the device pack's descriptor was passed
        self.calls_sock, calls_end = calls.pair()
        env[calls.ENV_FD] = str(calls_end.fileno())
        fds = [write_fd, calls_end.fileno(), life_end]
        if candidate:
            capacity = confine.pack_bytes if confine is not None else PACK_BYTES
            self.pack_fd = shared_pack.create(capacity)
            self._pack_sock, worker_sock = device_pack.channel()
            env[shared_pack.ENV_FD] = str(self.pack_fd)
            env[device_pack.ENV_SOCK] = str(worker_sock.fileno())
            fds += [self.pack_fd, worker_sock.fileno()]
        self.proc = _spawn(lambda: subprocess.Popen(
            prefix + argv if prefix else argv,
            stdin=subprocess.PIPE, stdout=self._stdout, stderr=self._stderr, env=env,
            pass_fds=tuple(fds), start_new_session=True,
            preexec_fn=_in_child(memory_limit_bytes, os.getpid())))
        os.close(write_fd)
        os.close(life_end)
        calls_end.close()
        if worker_sock is not None:
            worker_sock.close()
        self.ended = False
        self.marks: list[tuple[str, float]] = []
        self.driver: CallDriver | None = None
        self._ready = threading.Event()
        self._idle = threading.Event()
        self._gone = False
        self._prepares = threading.Condition()
        self._asked = self._prepared = 0  # prepare lines sent, and done by the worker
        self._hold = False
        self._timed = False  # the job times its calls: its report must hold samples
        self._followups = 0
        self._leftover: int | None = None
        self._reader = threading.Thread(target=self._read_marks, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read_marks(self, fd: int) -> None:
        """The worker's marks, a line each, read 64 bytes at most at a time (a candidate's
        process can write there: a line without end is not held in memory)."""
        with os.fdopen(fd, "rb") as pipe:
            while line := pipe.readline(64):
                label = line.decode(errors="replace").strip()[:40]
                if label == "ready":
                    self._ready.set()
                elif label == "idle":
                    self._idle.set()
                elif label == "prepared":
                    with self._prepares:
                        self._prepared += 1
                        self._prepares.notify_all()
                elif len(self.marks) < 16:
                    self.marks.append((label, time.monotonic()))
        with self._prepares:
            self._gone = True  # the worker (and whatever it started) has closed its end
            self._prepares.notify_all()
        self._idle.set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the worker has started and preloaded (it then waits for its job);
        False if the time ran out or it ended first."""
        return self._idle.wait(timeout_s) and not self._gone

    def prepare(self, device: str, fields: dict[str, Any] | None = None,
                record: bool = False) -> None:
        """Before the job: have the worker initialise ``device`` (a CUDA context takes a
        tenth of a second or more) while the judge still builds, and with ``record`` start
        and stop the activity recorder once (``activity.warm_recorder``); with ``fields``
        naming a ``cuda-fd`` pack (``confine.stage_candidate``'s), the lent pack goes now and
        is mapped then, not with the job."""
        line: dict[str, Any] = {"prepare": device, "record": record}
        # counted before the write: a worker gone already never does it, so a wait for it
        # lasts until the reader has seen the worker's end, not until a race is lost
        self._asked += 1
        try:
            if fields is not None and self._lend(fields):
                line.update({k: fields[k] for k in ("pack", "pack_bytes", "pack_device")})
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def wait_prepared(self, timeout_s: float) -> bool:
        """Wait until the worker has done every ``prepare`` sent (its device work over);
        False if the time ran out or it ended first."""
        with self._prepares:
            return self._prepares.wait_for(
                lambda: self._gone or self._prepared >= self._asked, timeout_s) \
                and not self._gone

    def _lend(self, job: dict[str, Any]) -> bool:
        """Pass the device pack's descriptor once, if ``job`` names it; True if it went now."""
        if self.device_pack is None or job.get("pack") != "cuda-fd" or self._lent:
            return False
        self._lent = True
        device_pack.send(self._pack_sock, self.device_pack)
        return True

    def kill(self) -> None:
        """Kill the worker's process group at once; whoever waits on it sees it end."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def drive(self, plan: DriverPlan, read_kept: Any = None,
              at_counted: Callable[[], None] | None = None,
              turns: PhaseTurns | None = None) -> CallDriver:
        """Serve this worker's calls (``driver.CallDriver``) from now until it ends;
        ``at_counted`` and ``turns`` as ``CallDriver``'s."""
        self.driver = CallDriver(calls.Lines(self.calls_sock), plan, read_kept,
                                 at_counted, self.interpreter, turns, self.kill).start()
        return self.driver

    def followup(self, job: dict[str, Any], timeout_s: float) -> WorkerOutcome:
        """A further job for a held worker that has reported (the reference's kept calls):
        its result, read once the worker signals ``ready`` again."""
        self._followups += 1
        self._ready.clear()
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.01):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                timed_out = self.proc.poll() is None
                leftover = self._stop()
                return self._outcome(self.proc.returncode, timed_out, timeout_s, leftover,
                                     f"result-{self._followups}.json")
        return self._outcome(0, False, timeout_s, 0, f"result-{self._followups}.json")

    def start(self, job: dict[str, Any], hold: bool = False) -> None:
        """Send ``job``; the worker begins at once."""
        self._hold, self._timed = hold, bool(job.get("time"))
        try:
            self._lend(job)
            self.proc.stdin.write((json.dumps({**job, "hold": hold}) + "\n").encode())
            self.proc.stdin.flush()
            if not hold:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def wait(self, timeout_s: float) -> WorkerOutcome:
        """Wait for the result (or, with ``hold``, for ``ready``), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        ready = False
        while True:
            if self._hold and self._ready.wait(0.01):
                ready = True
                break
            code = self.proc.poll() if self._hold else _wait(self.proc, deadline)
            if code is not None or time.monotonic() > deadline:
                break
        if ready:
            return self._outcome(0, False, timeout_s, 0)
        timed_out = self.proc.poll() is None
        leftover = self._stop()
        self._reader.join(timeout=1.0)
        return self._outcome(self.proc.returncode, timed_out, timeout_s, leftover)

    def run(self, job: dict[str, Any], timeout_s: float, hold: bool = False) -> WorkerOutcome:
        self.start(job, hold)
        return self.wait(timeout_s)

    def end(self) -> int:
        """End the worker (it exits once its stdin closes), kill what is left of its session
        and pid namespace (then nothing of it can write its output pack any more); return
        how many other processes it had left running."""
        if self.ended:
            return self._leftover or 0
        if self._leftover is None and self.proc.poll() is None:
            self._leftover = self._count_leftovers()  # before the worker's exit hides them
        if self.proc.poll() is None and self._hold and not self.candidate:
            # a held candidate owes the judge nothing more once checked: killed at once, it
            # spares the judge its interpreter's (and CUDA context's) orderly exit
            with contextlib.suppress(BrokenPipeError, OSError):
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5.0)
        return self._stop()

    def close(self) -> int:
        """``end``, then remove the worker's folder and close its descriptors (a device
        pack stays mapped while the judge holds tensors of it). Returns ``end``'s count."""
        leftover = self.end()
        shutil.rmtree(self.out_dir, ignore_errors=True)
        if self.pack_fd is not None:
            os.close(self.pack_fd)
            self.pack_fd = None
        if self._pack_sock is not None:
            self._pack_sock.close()
            self._pack_sock = None
        with contextlib.suppress(OSError):
            self.calls_sock.shutdown(socket.SHUT_RDWR)  # wakes a driver blocked on it
        self.calls_sock.close()
        if self._stderr_read is not None:
            os.close(self._stderr_read)
            self._stderr_read = None
        if self._lifeline is not None:  # the worker has ended: its lifeline can go
            os.close(self._lifeline)
            self._lifeline = None
        if self.driver is not None:
            self.driver.join(5.0)
        self.device_pack = None
        return leftover

    cancel = close

    def interpreter(self) -> int | None:
        """The pid (in this process's view) of the worker's Python interpreter, while it
        runs: the leader itself, or, confined, the first process the namespace's init
        started."""
        if not self.confined:
            return self.proc.pid if self.proc.poll() is None else None
        procs = snapshot()
        inits = {pid for pid, p in procs.items() if p.ppid == self.proc.pid}
        return next(iter(self._own(procs) - inits - {self.proc.pid}), None)

    def _own(self, procs: dict[int, Proc]) -> set[int]:
        """The processes that are the worker itself: its leader (and, confined, the
        namespace's init shell and the interpreter it started first)."""
        own = {self.proc.pid}
        if self.confined:
            inits = [pid for pid, p in procs.items() if p.ppid == self.proc.pid]
            own.update(inits)
            for init in inits:
                children = sorted((p.start, pid) for pid, p in procs.items() if p.ppid == init)
                own.update(pid for _, pid in children[:1])
        return own

    def _below(self, procs: dict[int, Proc]) -> set[int]:
        """Processes below the worker's leader or in its session, the leader excluded."""
        found = set(descendants(self.proc.pid, procs)) | set(
            session_members(self.proc.pid, procs))
        found.discard(self.proc.pid)
        return found

    def others(self) -> int:
        """How many processes the worker has running besides itself, now."""
        return self._count_leftovers()

    def _count_leftovers(self) -> int:
        """Processes running below the worker, or in its session, other than itself."""
        procs = snapshot()
        return len(self._below(procs) - self._own(procs))

    def _stop(self) -> int:
        """Kill the worker's session, group and every process below it; return how many
        other processes were left (counted once, before any was killed)."""
        if self._leftover is None:
            self._leftover = self._count_leftovers()
        for _ in range(50):
            victims = self._below(snapshot())
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not victims:
                break
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self._stdout.close()
        self._stderr.close()
        self.ended = True
        return self._leftover

    def _outcome(self, code: int | None, timed_out: bool, timeout_s: float, leftover: int,
                 name: str = "result.json") -> WorkerOutcome:
        if self.confined and code is not None and code > 128:
            code = 128 - code  # the init shell reports a child killed by signal N as 128 + N
        return outcome(read_small(self.out_dir / name, REPORT_BYTES),
                       read_small(self.out_dir / "stage", 200), code, timed_out, timeout_s,
                       leftover, _tail(self._stderr_read), tuple(self.marks),
                       timed=self._timed and name == "result.json")


def close_all(workers: list[Worker]) -> None:
    """Close every worker of ``workers``, emptying the list."""
    while workers:
        workers.pop().close()


def _wait(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None




_RUNPY_WARNING = "ignore:'cuda_agent.judge.worker' found in sys.modules:RuntimeWarning:runpy"


def _in_child(memory_limit: int | None, judge: int) -> Callable[[], None]:
    """What a worker's leader does between fork and exec: die with the thread that started
    it (``_spawn``'s, which lasts as long as ``judge``'s process; a judge already gone ends
    it at once) and take its address-space limit."""
    die = die_with_parent()

    def apply() -> None:
        die()
        if os.getppid() != judge:
            os._exit(1)
        if memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    return apply


_spawner: queue.SimpleQueue | None = None
_spawner_lock = threading.Lock()


def _forked() -> None:
    """A forked copy of the judge has no spawning thread (and maybe a held lock): anew."""
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _spawn(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """Run ``start`` on the spawning thread: one thread per judge process, never ending, so a
    worker's leader, which dies with the thread that started it, dies with the judge alone
    (a judge called from a thread that ends, such as a service's, keeps its workers)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(jobs,), name="judge-spawner",
                             daemon=True).start()
            _spawner = jobs
        jobs = _spawner
    done: Future = Future()
    jobs.put((start, done))
    return done.result()


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        start, done = jobs.get()
        try:
            done.set_result(start())
        except BaseException as exc:  # the caller raises it
            done.set_exception(exc)


def _confine_prefix(out_dir: Path, confine: Confinement) -> list[str] | None:
    """The argv prefix that confines a worker, or None where namespaces cannot be made."""
    from cuda_agent.execution.sandbox_local import confine_argv, namespace_prefix

    prefix = namespace_prefix(network=False)
    if prefix is None:
        return None
    return confine_argv(prefix, out_dir, list(confine.keep), list(confine.rw), init=True)


def _tail(fd: int | None, limit: int = 2000) -> str:
    """The last ``limit`` bytes the worker wrote to its stderr, read through the judge's own
    descriptor of the file it was given."""
    if fd is None:
        return ""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)).decode(errors="replace")
    except OSError:
        return ""
