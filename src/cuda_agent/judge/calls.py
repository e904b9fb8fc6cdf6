"""The call protocol: the judge hands a worker every call it makes, one at a time.

A timing worker (candidate or baseline) never chooses its own inputs. For each call it asks
the judge (``need``), which answers with the call's input seed, drawn at random there and
sent only now, its scale and whether it is a ``wall`` call; the worker makes the inputs,
says ``ready``, waits for ``go``, makes the call, copies its outputs and inputs into the
pack and says ``done`` with where they lie; the judge then decides whether to keep the
call, reads a kept call from the pack, and only then answers ``keep`` or ``next``. So the
outputs a call is judged by are committed before anyone can know whether they will be
checked: a candidate that learns the answer early (by writing ``done`` itself) has not
packed its outputs yet, and fails whenever the call is kept. The judge timestamps every
message with its own clock (``driver.CallDriver``), so a call's time is its measurement,
not the worker's.

Messages are JSON lines over a Unix socket pair the worker inherits at start (``ENV_FD``).
The worker side is ``CallChannel``; whatever a hostile process writes on its end can make
its own judgement fail, never the judge unhealthy (``driver`` parses every line defensively).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

ENV_FD = "CUDA_AGENT_CALLS_FD"
"""The environment variable through which a worker learns its call socket's number."""
MAX_LINE = 64 * 1024
"""The longest message either side accepts (a kept call's descriptors are the longest)."""
PHASES = ("calibrate", "warmup", "timed", "record", "tail", "check")
"""In the order a worker goes through them (``check``, when nothing is timed, follows
``calibrate`` alone)."""
"""``calibrate`` runs before any candidate code (a stand-in call, to measure the protocol's
own cost); ``record`` calls go through the device timer's gate (the activity record pairs
them); ``tail`` follows the worker's own stop, while the judge still has calls to keep."""


class ProtocolError(RuntimeError):
    """The other side broke the call protocol (or went away)."""


class Closed(ProtocolError):
    """The other side ended (closed its end, or its process exited)."""


@dataclass(frozen=True)
class Call:
    """One call as the judge hands it out: its inputs' seed and scale, and whether it is a
    ``wall`` call (timed by the judge's clock alone, no device timer)."""

    seed: int
    scale: float = 1.0
    wall: bool = True


def pair() -> tuple[socket.socket, socket.socket]:
    """(judge's end, worker's end); the worker's is inheritable."""
    judge_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker_end.set_inheritable(True)
    return judge_end, worker_end


class Lines:
    """Newline-framed JSON over one socket, each line at most ``MAX_LINE`` bytes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise Closed(f"the other side went away ({exc})") from None

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise ProtocolError(f"a message longer than {MAX_LINE} bytes")
            try:
                chunk = self.sock.recv(65536)
            except OSError as exc:
                raise Closed(f"the other side went away ({exc})") from None
            if not chunk:
                raise Closed("the other side closed the call socket")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a message longer than {MAX_LINE} bytes")
        try:
            message = json.loads(line)
        except ValueError:
            raise ProtocolError("a message that is not JSON") from None
        if not isinstance(message, dict) or not isinstance(message.get("t"), str):
            raise ProtocolError("a message without a type")
        return message


class CallChannel:
    """The worker's end: ask for each call, report its steps, hand over kept outputs."""

    def __init__(self, fd: int | None = None):
        if fd is None:
            text = os.environ.get(ENV_FD, "")
            if not text.isdigit():
                raise ProtocolError("this worker was given no call socket")
            fd = int(text)
        self.lines = Lines(socket.socket(fileno=fd))
        self.calls = 0

    def need(self, phase: str, stop: bool = False) -> Call | None:
        """The next call of ``phase`` (``stop``: this worker would end the phase now), or
        None when the judge ends it."""
        self.lines.send({"t": "need", "phase": phase, "stop": bool(stop)})
        message = self.lines.receive()
        if message["t"] == "end":
            return None
        if message["t"] != "call":
            raise ProtocolError(f"expected a call, got {message['t']!r}")
        seed, scale = message.get("s"), message.get("x", 1.0)
        if type(seed) is not int or not isinstance(scale, int | float):
            raise ProtocolError("a call without a seed or scale")
        self.calls += 1
        return Call(seed, float(scale), bool(message.get("w", True)))

    def ready(self) -> None:
        """The inputs are made; wait for the judge's ``go``."""
        self.lines.send({"t": "ready"})
        message = self.lines.receive()
        if message["t"] != "go":
            raise ProtocolError(f"expected go, got {message['t']!r}")

    def done(self, pack: str | None = None, outputs: list[dict[str, Any]] | None = None,
             inputs: list[dict[str, Any]] | None = None) -> bool:
        """The call returned, its outputs and inputs in the pack (of kind ``pack``, at the
        places these descriptors give; none for a worker that packs nothing); True if the
        judge kept it."""
        self.lines.send({"t": "done", "pack": pack, "outputs": outputs or [],
                         "inputs": inputs or []})
        message = self.lines.receive()
        if message["t"] not in ("keep", "next"):
            raise ProtocolError(f"expected keep or next, got {message['t']!r}")
        return message["t"] == "keep"
