"""Which tasks clients may open: ``builtin:NAME`` and files under the configured task roots.

A client never names an arbitrary path: a file reference is taken relative to one of
``ServiceConfig.task_roots`` and must stay inside it after symbolic links are resolved.
"""

from __future__ import annotations

import threading
from pathlib import Path, PurePosixPath

from cuda_agent.service.errors import bad_request
from cuda_agent.tasks import Task, TaskError, load_task
from cuda_agent.tasks.loaders import BUILTIN_PREFIX, builtin_names

MAX_REF = 1024


class TaskSources:
    """Resolves a client's task reference to a ``Task``; remembers what it loaded."""

    def __init__(self, roots: list[Path], allow_builtin: bool = True):
        self.roots = [Path(r).resolve() for r in roots]
        self.allow_builtin = allow_builtin
        self._cache: dict[str, Task] = {}
        self._lock = threading.Lock()

    def resolve(self, ref: str) -> Task:
        """The task named by ``ref``; raises ``ApiError(400)`` with the reason otherwise."""
        with self._lock:
            if ref in self._cache:
                return self._cache[ref]
        task = self._load(ref)
        with self._lock:
            self._cache.setdefault(ref, task)
        return task

    def _load(self, ref: str) -> Task:
        if not ref or len(ref) > MAX_REF or "\x00" in ref:
            raise bad_request(f"task reference must be 1-{MAX_REF} characters without NUL")
        if ref.startswith(BUILTIN_PREFIX):
            return self._builtin(ref)
        path_part, sep, selector = ref.partition("::")
        path = self._inside_root(path_part)
        try:
            return load_task(f"{path}{sep}{selector}")
        except (TaskError, OSError, ValueError) as exc:
            raise bad_request(f"task {ref!r}: {_relative(str(exc), path)}") from None

    def _builtin(self, ref: str) -> Task:
        if not self.allow_builtin:
            raise bad_request("builtin tasks are not allowed by this service")
        name = ref[len(BUILTIN_PREFIX):]
        if name not in builtin_names():
            raise bad_request(f"no builtin task {name!r} (known: {', '.join(builtin_names())})")
        return load_task(ref)

    def _inside_root(self, raw: str) -> Path:
        rel = PurePosixPath(raw)
        if not self.roots:
            raise bad_request("this service serves builtin:NAME tasks only (no task roots)")
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise bad_request("a task file is named by a path relative to a task root, "
                              "without '..'")
        for root in self.roots:
            path = (root / rel).resolve()
            if path.is_relative_to(root) and path.exists():
                return path
        raise bad_request(f"task source {raw!r} is not under any task root of this service")


def _relative(message: str, path: Path) -> str:
    """Error text without the server's absolute folder names."""
    return message.replace(str(path.parent) + "/", "")
