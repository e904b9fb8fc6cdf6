"""The episode's judge server: one process per workspace that keeps a judge warm between the
episode's calls (docs/warm-judge.md). Started by ``warm_judge.WarmJudge``:

    python -m cuda_agent.execution.warm_judge_server < SPEC.json

The spec (on stdin, so its stop token is never on disk) names the workspace, the socket, the
judge settings of each call kind (``verify``, ``profile``) and when to end: ``stop`` asked
with the token, the owner process gone, the workspace or the socket gone, or no call for
``idle_s``. One judgement runs at a time; each still starts the candidate in fresh
confined processes (``Judge``), and a judgement that raises leaves the server serving.

Messages are one JSON object per connection each way, newline-ended: in ``{"op": "verify" |
"profile" | "ping" | "stop", "workspace": PATH}``, out ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": "..."}``. A client can choose nothing but the call kind: the settings
are the spec's, so no caller can change how the judge measures (or what it caches).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

OPS = {"verify": False, "profile": True}
"""Call kinds and whether each asks for the operator profile."""

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
MAX_CLIENTS = 8
"""Calls of clients other than the owner under way or waiting at once; past them such a
client is told the judge is busy. The owner's calls (they carry its token) always go."""
MAX_THREADS = 64
"""Connections open at once, each read within ``REQUEST_TIMEOUT_S``."""


class Server:
    """Serves one workspace's judgements on a listening Unix socket."""

    def __init__(self, spec: dict[str, Any]):
        from cuda_agent.judge import Judge, JudgeConfig
        from cuda_agent.tasks.task import Task
        from cuda_agent.workspace import read_workspace

        self.root = Path(spec["workspace"]).resolve()
        # the owner's trusted task; a shell's server reads the workspace's record, which is
        # its user's own
        self.task = (Task.model_validate(spec["task"]) if spec.get("task")
                     else read_workspace(self.root).task)
        self.idle_s = float(spec["idle_s"])
        self.owner = spec.get("owner_pid")
        self.token = str(spec["token"]).encode()
        self.socket = Path(spec["socket"])
        self.inode: int | None = None
        configs = {op: JudgeConfig.model_validate(spec["configs"][op]) for op in OPS}
        self.ahead: Judge | None = None
        """The judge measuring the profile call's baselines in the background (``spec``'s
        ``ahead``); None when none does."""
        if spec.get("ahead") and configs["profile"].time:
            # the background measurement and the calls share a turn (judge.gpu_turn), so
            # its timed phases hold the GPU alone while a verify runs beside its compiles
            turn = next((c.gpu_lock for c in configs.values() if c.gpu_lock), spec["turn"])
            configs = {op: c.model_copy(update={"gpu_lock": c.gpu_lock or turn})
                       for op, c in configs.items()}
            self.ahead = Judge(configs["profile"])
        self.judges = {op: Judge(configs[op]) for op in OPS}
        self._measured = threading.Event()
        self.ahead_error: str | None = None
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self._last = time.monotonic()
        self._busy = 0
        self._stop = threading.Event()
        self._clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self._threads = threading.BoundedSemaphore(MAX_THREADS)
        self.judged = 0

    def warm(self) -> None:
        """Start the first call's workers now: they start up while the client waits; and
        the profile call's baselines, measured in the background where ``ahead`` is on."""
        self.judges["verify"].warm(timeout_s=0.0)
        if self.ahead is None:
            self._measured.set()
        else:
            threading.Thread(target=self._measure_ahead, daemon=True,
                             name="baselines-ahead").start()

    def _measure_ahead(self) -> None:
        """The profile judge's baselines, so that the episode's first profile call finds
        them; one that fails is measured (and its failure reported) by that call itself."""
        from cuda_agent.judge.measure import measure_ahead

        assert self.ahead is not None
        try:
            measure_ahead(self.ahead, self.task)
            self.judges["profile"]._baselines.update(self.ahead._baselines)
        except Exception as exc:
            self.ahead_error = f"{type(exc).__name__}: {exc}"
            print(f"baselines measured ahead failed: {self.ahead_error}", flush=True)
        finally:
            self.ahead.close()
            self._measured.set()

    def serve(self, listener: socket.socket) -> None:
        owner = _pidfd(self.owner)
        listener.settimeout(1.0)
        try:
            while not self._stop.is_set() and not self._should_end(owner):
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                if not self._threads.acquire(blocking=False):
                    _refuse(conn)
                    continue
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        finally:
            with self._lock:  # a judgement under way finishes before the workers go
                for judge in self.judges.values():
                    judge.close()

    def _should_end(self, owner: int | None) -> bool:
        if owner is not None and select.select([owner], [], [], 0)[0]:
            return True  # the owning episode ended without saying so
        if not self.root.is_dir():
            return True
        try:
            if self.socket.stat().st_ino != self.inode:
                return True  # another server took the address
        except FileNotFoundError:
            return True  # unlinked: asked to end by someone who may not hold the token
        return not self._busy and time.monotonic() - self._last > self.idle_s

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            self._threads.release()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = _read_request(conn)
                owner = secrets.compare_digest(
                    str(request.get("token", "")).encode(errors="replace"), self.token)
                if owner or request.get("op") == "ping":
                    reply = self._reply(request, conn, owner)
                elif not self._clients.acquire(blocking=False):
                    reply = {"ok": False, "error": f"busy: {MAX_CLIENTS} calls are under way "
                             "or waiting; call again"}
                else:
                    try:
                        reply = self._reply(request, conn, owner)
                    finally:
                        self._clients.release()
            except ValueError as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            except Exception as exc:  # whatever a request holds, the server goes on
                reply = {"ok": False, "error": f"bad request: {type(exc).__name__}"}
            try:
                conn.settimeout(REQUEST_TIMEOUT_S)
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass  # the client went away; the verdict is lost to it alone

    def _reply(self, request: dict[str, Any], conn: socket.socket, owner: bool
               ) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            ahead = ("off" if self.ahead is None else "error" if self.ahead_error
                     else "done" if self._measured.is_set() else "measuring")
            measured = self.ahead._baselines if self.ahead is not None else {}
            eager = next(iter(measured.values()), None)
            return {"ok": True, "pid": os.getpid(), "judged": self.judged,
                    "baselines_ahead": ahead,
                    "eager_ms": eager.eager.median_ms if eager and eager.eager else None}
        if op == "stop":
            if not owner:
                return {"ok": False, "error": "stop: only the episode that started this "
                        "judge ends it"}
            self._stop.set()
            return {"ok": True}
        if not isinstance(op, str) or op not in OPS:
            return {"ok": False, "error": f"unknown op {op!r}; ops: ping, stop, "
                    f"{', '.join(OPS)}"}
        asked = request.get("workspace")
        if not isinstance(asked, str) or Path(asked).resolve() != self.root:
            return {"ok": False, "error": f"this judge serves the workspace {self.root}, "
                    f"not {asked!r}"}
        return self._judge(op, conn)

    def _judge(self, op: str, conn: socket.socket) -> dict[str, Any]:
        from cuda_agent.judge import Candidate
        from cuda_agent.judge.judge import JudgeError
        from cuda_agent.results import to_dict

        with self._count:
            self._busy += 1
        try:
            if op == "profile":  # it waits for the baselines measured for it ahead
                while not self._measured.wait(1.0):
                    if _hung_up(conn) or self._stop.is_set():
                        return {"ok": False, "error": "the client hung up"}
            with self._lock:
                if _hung_up(conn):  # asked and gone: no one waits for this verdict
                    return {"ok": False, "error": "the client hung up"}
                judge = self.judges[op]
                for other in self.judges.values():
                    judge.take_spares(other)
                try:
                    result = judge.judge(self.task, Candidate("workspace", self.root),
                                         OPS[op])
                except JudgeError as exc:
                    return {"ok": False, "error": str(exc), "judge_error": True}
                except Exception as exc:  # the server outlives a judgement that failed
                    traceback.print_exc()
                    return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                self.judged += 1
                return {"ok": True, "result": to_dict(result)}
        finally:
            with self._count:
                self._busy -= 1
                self._last = time.monotonic()


def _hung_up(conn: socket.socket) -> bool:
    """Whether the client closed its end (a request is whole before it is judged, so any
    readable state now is its end of file)."""
    try:
        return bool(select.select([conn], [], [], 0)[0]) and not conn.recv(
            1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return True


def _refuse(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(1.0)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"ok": False, "error": f"busy: {MAX_THREADS} connections "
                                     "are open; call again"}).encode() + b"\n")


def _read_request(conn: socket.socket) -> dict[str, Any]:
    conn.settimeout(REQUEST_TIMEOUT_S)
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            raise ValueError("no complete request within "
                             f"{REQUEST_TIMEOUT_S:.0f} s") from None
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError(f"over {MAX_REQUEST} bytes")
    try:
        request = json.loads(data)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    return request


def _pidfd(pid: int | None) -> int | None:
    """A descriptor that turns readable when ``pid`` ends (None: no owner, or gone already,
    which ends the server at once through a closed descriptor's readability)."""
    if pid is None:
        return None
    try:
        return os.pidfd_open(int(pid))
    except ProcessLookupError:
        return os.open("/dev/null", os.O_RDONLY)  # always readable: end now


def listen(path: Path) -> socket.socket:
    """Bind ``path`` (replacing a stale socket there) readable and writable by us alone."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    return listener


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print("usage: python -m cuda_agent.execution.warm_judge_server < SPEC.json",
              file=sys.stderr)
        return 2
    spec = json.loads(sys.stdin.read())
    server = Server(spec)
    path = Path(spec["socket"])
    listener = listen(path)
    mine = server.inode = path.stat().st_ino
    try:
        server.warm()
        print(f"judge server {os.getpid()} serving {server.root}", flush=True)
        server.serve(listener)
        if spec.get("log"):
            Path(spec["log"]).unlink(missing_ok=True)  # a clean end leaves no log
    finally:
        listener.close()
        try:
            if path.stat().st_ino == mine:  # not a newer server's socket
                path.unlink()
        except FileNotFoundError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
