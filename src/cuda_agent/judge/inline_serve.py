"""The judge's side of a single-file candidate's build: each candidate worker's
``load_inline`` requests (``inline_load``), built through the judge's cache.

One ``InlineBuilds`` serves a judgement: a thread per candidate worker reads its build
socket, builds each request with the judge's toolchain (``build.inline.InlineBuilder``:
the judge's flags, the candidate's as far as they are allowed, the single-file symbol
policy) and answers with the module's path or the reasons it was refused. The first process
compiles; the judge's other candidate processes, and later judgements of the same source,
find each object and module in the cache. What a hostile process writes on its socket can
fail its own build, never the judge: every message is parsed as untrusted, at most
``MAX_REQUESTS`` are served per worker, and the thread ends when either side closes.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from dataclasses import replace
from typing import Any

from cuda_agent.build import diagnostics, symbols
from cuda_agent.build.builder import Builder
from cuda_agent.build.inline import InlineBuild, InlineBuilder, InlineRequest, RequestError
from cuda_agent.build.toolchain import ToolchainError
from cuda_agent.judge.guard import ALLOWED
from cuda_agent.judge.inline_load import ProtocolError, receive, send
from cuda_agent.judge.runner import Worker
from cuda_agent.results import BuildResult

MAX_REQUESTS = 16
"""Builds one candidate process may ask for (each a different extension or source)."""
MAX_REPLY = 700
"""The reasons sent back are cut to this (the worker's error report keeps 800 characters);
the verdict's build result holds them all."""


class InlineBuilds:
    """A judgement's single-file builds, served to its candidate workers."""

    def __init__(self, builder: Builder):
        self.builder = InlineBuilder(builder, symbols.single_file_policy(ALLOWED))
        self.device = builder.config.device
        self.builds: list[InlineBuild] = []
        self._lock = threading.Lock()

    def serve(self, worker: Worker) -> None:
        """Answer ``worker``'s requests on a thread of their own until it closes."""
        if worker.inline_sock is not None:
            threading.Thread(target=self._serve, args=(worker.inline_sock,), daemon=True,
                             name="judge-inline-build").start()

    def _serve(self, sock: Any) -> None:
        """Until the worker closes its end, sends what is no message, or has asked
        ``MAX_REQUESTS`` times; then its end sees the socket closed."""
        try:
            for served in itertools.count():
                message = receive(sock)
                if served == MAX_REQUESTS:
                    send(sock, {"t": "refused", "message": f"at most {MAX_REQUESTS} builds "
                                "a process"})
                    return
                send(sock, self.answer(message))
        except (ProtocolError, OSError):
            return
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply to one request: ``built`` with the module's path, or ``refused``."""
        try:
            request = InlineRequest.parse(message)
            build = self.builder.build(request)
        except RequestError as exc:
            build = InlineBuild(False, None, refused=(("load_inline", str(exc)),))
        except (ToolchainError, OSError) as exc:  # the judge's machine: said as such
            build = InlineBuild(False, None, refused=(
                ("judge", f"cannot build here: {exc}"),))
        with self._lock:
            self.builds.append(build)
        if build.ok and build.path is not None:
            return {"t": "built", "path": str(build.path)}
        return {"t": "refused", "message": _reasons(build)}

    def result(self) -> BuildResult | None:
        """Every build served so far, as one build result (None before any)."""
        with self._lock:
            builds = list(self.builds)
        if not builds:
            return None
        results = [b.result(self.device) for b in builds]
        done = results[-1]
        return replace(
            done, ok=all(r.ok for r in results),
            extension_path=next((r.extension_path for r in reversed(results)
                                 if r.extension_path), None),
            diagnostics=tuple(d for r in results for d in r.diagnostics
                              )[:diagnostics.MAX_DIAGNOSTICS],
            compiled=tuple(c for r in results for c in r.compiled),
            cached=tuple(c for r in results for c in r.cached),
            seconds=sum(r.seconds for r in results),
            log=diagnostics.trim_log("\n".join(b.log for b in builds if b.log)))


def _reasons(build: InlineBuild) -> str:
    errors = [str(d) for d in build.result("").errors]
    text = "; ".join(errors) if errors else build.log
    return text if len(text) <= MAX_REPLY else text[:MAX_REPLY - 3] + "..."
