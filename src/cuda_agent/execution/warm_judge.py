"""The episode's judge: one warm judge server per workspace, reached by every front end
(docs/warm-judge.md).

    judge = WarmJudge(root, episode_configs("cuda"), owner=True)   # the agent's tools
    result = judge.call("profile")                                     # a JudgeResult
    judge.close()                                                      # the episode ends

The first call starts the server (``warm_judge_server``) and later calls find it at the socket
``address(root)``; the workspace's ``utils/verify`` and ``utils/profile`` reach the same one,
from the agent's shell through ``CUDA_AGENT_JUDGE``, from any other shell by the address.
The server's workers, CUDA contexts and cached baselines stay warm between calls; each
judgement still starts the candidate in fresh confined processes. A server that died is
started again and the call made once more, so a call is never lost to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from cuda_agent.paths import home_dir

ENV = "CUDA_AGENT_JUDGE"
"""Names the socket of the episode's judge in the agent's shell."""

class WarmJudgeConfig(BaseModel):
    """How an episode's judge server is started and when it ends."""

    idle_s: float | None = Field(
        900.0, gt=0, description="A server no call reached for this long ends (None: only "
        "when its owner ends it or ends; an owner starts it again at its next call). A "
        "server started from a shell has no owner.")
    start_timeout_s: float = Field(180.0, gt=0, description="Seconds a new server may take "
                                   "to import torch and start listening.")
    measure_ahead: Literal["auto", "on", "off"] = Field(
        "auto", description="Measure the profile call's baselines as soon as the server "
        "starts, beside the episode's other calls (they share the GPU's turn, so the "
        "baselines' timed phases still hold it alone), so its first profile call finds them. "
        "'auto': on CUDA; on the CPU a build beside them would slow their timed calls.")


class WarmJudgeError(RuntimeError):
    """No verdict: the server could not start, or the judge could not judge."""


def reaches_judge(command: str) -> bool:
    """Whether a shell command may reach the episode's judge (the workspace's ``utils/verify``
    or ``utils/profile``, or this package's CLI): the judge starts before it runs, not for
    every ``ls``."""
    return re.search(r"utils/(verify|profile)|cuda[-_]agent", command) is not None


def run_dir() -> Path:
    """Where the servers' sockets live: a folder under /tmp private to this user. Under /tmp
    because every confined process (a candidate's, an agent command's) gets a fresh /tmp:
    only the agent's shell is shown this folder again, so no candidate reaches a judge."""
    path = Path("/tmp") / f"cuda-agent-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WarmJudgeError(f"{path}: not a folder private to this user (owner "
                             f"{info.st_uid}, mode {oct(info.st_mode & 0o777)})")
    return path


def address(root: Path) -> Path:
    """The socket of the server for the workspace ``root`` (and this cuda-agent home), alone
    in a folder of its own: the agent's shell is shown that folder, no other episode's."""
    key = hashlib.sha256(f"{home_dir().resolve()}\0{Path(root).resolve()}".encode())
    folder = run_dir() / f"s-{key.hexdigest()[:16]}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / "judge.sock"


def _beside(socket_path: Path, suffix: str) -> Path:
    """The lock or log of a server: outside the folder the agent's shell is shown."""
    return socket_path.parent.parent / f"judge-{socket_path.parent.name[2:]}{suffix}"


def episode_configs(device: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Judge settings of the agent's ``verify`` and ``profile`` calls (``in_episode``)."""
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.config import in_episode

    # two sets of workers on a GPU: a profile right after a verify finds one started
    base = {"warm_sets": 2 if device.startswith("cuda") else 1, **(overrides or {}),
            "device": device, "keep_warm": True}
    return {op: in_episode(JudgeConfig.model_validate({**base, "time": op == "profile"}))
            for op in ("verify", "profile")}


class WarmJudge:
    """A client of one workspace's judge server; ``owner`` ties the server's life to this
    process and to ``close()``."""

    def __init__(self, root: Path, configs: dict[str, Any] | None = None, *,
                 device: str | None = None, owner: bool = False,
                 config: WarmJudgeConfig | None = None, socket_path: Path | None = None,
                 task: Any = None):
        """``configs`` (``episode_configs``) or ``device`` (their defaults there) are what a
        server this client starts judges with; with neither it starts none."""
        self.root = Path(root).resolve()
        self.configs = configs
        self.device = device
        self.task = task
        """The owner's trusted task (a ``Task``); None: the server reads the workspace's."""
        self.owner = owner
        self.config = config or WarmJudgeConfig(idle_s=3600.0 if owner else 900.0)
        self.socket = Path(socket_path) if socket_path else address(self.root)
        self._token = secrets.token_hex(16)
        self._proc: subprocess.Popen | None = None
        self._starting = threading.Lock()
        self._owned: list[subprocess.Popen] = []  # what a forgotten owner's finalizer ends
        self._finalizer = weakref.finalize(self, _stop, self.socket, self._token, self._owned)

    @classmethod
    def attach(cls, root: Path, device: str) -> WarmJudge:
        """The judge a shell command reaches: the episode's (``CUDA_AGENT_JUDGE``), else the
        workspace's server, started with the default in-episode settings if none runs."""
        named = os.environ.get(ENV)
        if named:
            return cls(root, socket_path=Path(named))
        return cls(root, device=device)

    def call(self, op: str) -> Any:
        """The ``JudgeResult`` of a ``verify`` or ``profile`` call on the workspace."""
        from cuda_agent.execution.backend import judge_result

        message = {"op": op, "workspace": str(self.root),
                   **({"token": self._token} if self.owner else {})}
        try:
            reply = self._request(message)
        except (OSError, ValueError):
            reply = None
        if reply is None:  # no server, or it died under this call: start one, once
            self._start()
            try:
                reply = self._request(message)
            except (OSError, ValueError) as exc:
                raise WarmJudgeError(f"the episode's judge at {self.socket} did not "
                                        f"answer: {exc}{self._log_tail()}") from None
            if reply is None:
                raise WarmJudgeError(f"the episode's judge at {self.socket} ended during "
                                        f"the call{self._log_tail()}")
        if not reply.get("ok"):
            raise WarmJudgeError(str(reply.get("error", "no verdict")))
        return judge_result(reply["result"])

    def ping(self) -> dict[str, Any] | None:
        try:
            reply = self._request({"op": "ping"}, timeout_s=10.0)
        except (OSError, ValueError):
            return None
        return reply if reply and reply.get("ok") else None

    def ensure(self, wait: bool = False) -> None:
        """Start the server again if the one this owner started ended (an idle timeout, a
        crash), so the agent's shell finds it; ``wait``: until it listens."""
        if self._starting.locked() and not wait:
            return  # a start is under way
        if self.owner and (self._proc is None or self._proc.poll() is not None
                           or (wait and self.ping() is None)):
            self.start(wait=wait)

    def close(self) -> None:
        """End the server if this client owns it (its token stops it, no other)."""
        self._finalizer()
        self._proc = None

    def __enter__(self) -> WarmJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------
    def _request(self, message: dict[str, Any], timeout_s: float | None = None
                 ) -> dict[str, Any] | None:
        """The reply; None when the connection closed without one. Raises OSError when
        nothing listens."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(str(self.socket))
            _check_peer(conn)
            conn.sendall(json.dumps(message).encode() + b"\n")
            chunks = []
            while chunk := conn.recv(1 << 16):
                chunks.append(chunk)
        data = b"".join(chunks)
        return json.loads(data) if data.endswith(b"\n") else None

    def start(self, wait: bool = True) -> None:
        """Start the server now (``wait=False``: in the background, so the episode goes on
        while it imports torch; the start lock is taken before this returns, so a call
        meanwhile, from this process or a shell, waits for it)."""
        if self.configs is None and self.device is None:
            self._start()
            return
        self._starting.acquire()
        try:
            held = self._lock_file("a")
            fcntl.flock(held, fcntl.LOCK_EX)  # one start, whoever else is starting one
        except BaseException:
            self._starting.release()
            raise
        if wait:
            self._start_locked(held)
        else:
            threading.Thread(target=self._start_quietly, args=(held,), daemon=True).start()

    def _start_quietly(self, held: Any) -> None:
        with contextlib.suppress(WarmJudgeError, OSError):
            self._start_locked(held)  # a call that needs the server starts it again

    def _start(self) -> None:
        if self.configs is not None or self.device is not None:
            self.start(wait=True)
            return
        if self.ping() is None:  # the episode starts it before any command that needs it
            raise WarmJudgeError(f"the episode's judge at {self.socket} is not running (it "
                                 f"ends with its episode); the agent's own verify and "
                                 f"profile tools start it again")

    def _start_locked(self, held: Any) -> None:
        try:
            if self.ping() is not None:
                if not self.owner or (self._proc is not None and self._proc.poll() is None):
                    return
                self._stop_other()  # a shell's server: the episode's settings replace it
            self._spawn()
        finally:
            held.close()
            self._starting.release()

    def _ahead(self, configs: dict[str, Any]) -> bool:
        from cuda_agent.judge import JudgeConfig
        from cuda_agent.judge.judge import JudgeError, resolve_device

        if self.config.measure_ahead != "auto":
            return self.config.measure_ahead == "on"
        try:
            device = resolve_device(JudgeConfig.model_validate(configs["profile"]).device)
        except JudgeError:
            return False  # the judge's own calls say why it cannot judge there
        return device.startswith("cuda")

    def _lock_file(self, mode: str) -> Any:
        return open(_beside(self.socket, ".lock"), mode)

    def _spawn(self) -> None:
        from cuda_agent.judge import JudgeConfig

        configs = self.configs or episode_configs(str(self.device))
        spec = {"workspace": str(self.root), "socket": str(self.socket),
                "idle_s": self.config.idle_s or 10.0**9,
                "owner_pid": os.getpid() if self.owner else None, "token": self._token,
                "task": self.task.model_dump(mode="json") if self.task is not None else None,
                "log": str(_beside(self.socket, ".log")),
                "configs": {op: JudgeConfig.model_validate(c).model_dump(mode="json")
                            for op, c in configs.items()},
                "ahead": self._ahead(configs), "turn": str(_beside(self.socket, ".turn"))}
        with open(_beside(self.socket, ".log"), "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "cuda_agent.execution.warm_judge_server"],
                stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                close_fds=True)
        if self.owner:
            self._owned.append(self._proc)
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(spec).encode())  # the token stays off the disk
        self._proc.stdin.close()
        deadline = time.monotonic() + self.config.start_timeout_s
        while self.ping() is None:
            if self._proc.poll() is not None:
                raise WarmJudgeError(f"the episode's judge exited at its start with status "
                                        f"{self._proc.returncode}{self._log_tail()}")
            if time.monotonic() > deadline:
                self._proc.kill()
                raise WarmJudgeError(f"the episode's judge did not start within "
                                        f"{self.config.start_timeout_s:.0f} s"
                                        f"{self._log_tail()}")
            time.sleep(0.05)

    def _stop_other(self) -> None:
        """End a server this client did not start: unlinking its socket makes it stop."""
        self.socket.unlink(missing_ok=True)

    def _log_tail(self) -> str:
        try:
            text = _beside(self.socket, ".log").read_text(errors="replace")
        except OSError:
            return ""
        return f"\n--- its log ---\n{text[-2000:]}" if text.strip() else ""


def _stop(path: Path, token: str, owned: list[subprocess.Popen]) -> None:
    """Stop the servers an owner started: asked with the token, killed if it will not go."""
    if not owned:
        return
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10.0)
        conn.connect(str(path))
        conn.sendall(json.dumps({"op": "stop", "token": token}).encode() + b"\n")
        conn.recv(4096)
    for proc in owned:
        try:
            proc.wait(timeout=60)  # a judgement under way ends first
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    owned.clear()


def _check_peer(conn: socket.socket) -> None:
    """The server must run as this user: the socket's folder is private, this makes sure."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid != os.getuid():
        raise OSError(f"the judge at {conn.getpeername()} runs as uid {uid}, not ours")
