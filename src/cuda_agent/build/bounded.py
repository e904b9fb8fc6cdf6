"""Reading a tool's output, and caching what it says, in bounded memory, judge-side.

The judge runs binutils (``nm``, ``c++filt``, ``objdump``) on files a candidate built, in
its own process and unconfined: what they print is as large as the candidate makes the
file. ``Lines`` streams a command's output line by line and stops it past a number of lines
or bytes (``OutputLimit``), so a reader that keeps a summary holds nothing more; ``Cache``
keeps results by key up to a number of entries and of bytes together, so a warm judge's
memory does not grow with the builds it has judged.

    with Lines(["nm", "-P", "a.o"], max_lines=100_000, max_bytes=32 << 20) as out:
        names = [line.split()[0] for line in out]
    if out.returncode != 0: ...
"""

from __future__ import annotations

import collections
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class OutputLimit(Exception):
    """A command printed more than its reader takes; ``lines``/``size``: what was read when
    it was stopped."""

    def __init__(self, cmd: list[str], lines: int, size: int):
        super().__init__(f"{Path(cmd[0]).name} printed more than its reader takes "
                         f"({lines} lines, {size} bytes read when it was stopped)")
        self.lines, self.size = lines, size


class Lines:
    """A command's standard output as text lines (newlines cut), read as it runs. Past
    ``max_lines`` lines, ``max_bytes`` bytes or a line of ``max_line`` bytes (a reader
    holds at least one line whole) it is killed and ``OutputLimit`` raised; past
    ``timeout`` seconds it is killed and ``subprocess.TimeoutExpired`` raised. Its error
    output goes to a file (only its start is kept in ``stderr``); ``stdin`` is a file to read
    or nothing. ``returncode`` is set once the output is read to its end."""

    def __init__(self, cmd: list[str], max_lines: int | None = None,
                 max_bytes: int | None = None, timeout: float = 120,
                 stdin: Path | None = None, max_line: int = 1 << 20):
        self.cmd, self.max_lines, self.max_bytes = cmd, max_lines, max_bytes
        self.max_line = max_line
        self.timeout = timeout
        self.returncode: int | None = None
        self.stderr = ""
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _finish)
        try:
            with open(stdin or os.devnull, "rb") as source:
                self._proc = subprocess.Popen(cmd, stdin=source, stdout=subprocess.PIPE,
                                              stderr=self._errors)
        except OSError:
            self._errors.close()
            raise
        self._expired = threading.Event()
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()
        self._lines = self._read()

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        """One iterator however often asked: a second loop goes on where the first stopped."""
        return self._lines

    def _read(self) -> Iterator[str]:
        stdout = self._proc.stdout
        assert stdout is not None
        lines = size = 0
        while True:
            # a line is read up to what the byte budget still allows, never whole
            room = self.max_line if self.max_bytes is None else min(
                self.max_line, self.max_bytes - size)
            raw = stdout.readline(room + 1)
            if not raw:
                break
            lines, size = lines + 1, size + len(raw)
            if (self.max_lines is not None and lines > self.max_lines) or (
                    self.max_bytes is not None and size > self.max_bytes) or (
                    len(raw) > self.max_line):
                self.close()
                raise OutputLimit(self.cmd, lines, size)
            yield raw.decode(errors="surrogateescape").rstrip("\n")
        self._proc.wait()
        self._finish()
        if self._expired.is_set():
            raise subprocess.TimeoutExpired(self.cmd, self.timeout)
        self.returncode = self._proc.returncode

    def close(self) -> None:
        """Stop the command if it still runs (the reader took what it needed)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._finish()

    def _finish(self) -> None:
        self._timer.cancel()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        if not self._errors.closed:
            self._errors.seek(0)
            self.stderr = self._errors.read(4096).decode(errors="replace")
            self._errors.close()

    def _expire(self) -> None:
        self._expired.set()
        if self._proc.poll() is None:
            self._proc.kill()


class Cache:
    """Values by key, the least recently used dropped first, at most ``max_entries`` of them
    and ``max_bytes`` together (as ``size`` measures a value); a value larger than a quarter
    of ``max_bytes`` is not kept. Safe to share between threads."""

    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[Any], int]):
        self.max_entries, self.max_bytes, self.size = max_entries, max_bytes, size
        self.hits = self.bytes = 0
        self._items: collections.OrderedDict[Any, tuple[Any, int]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        """The value kept for ``key``, else ``make()`` (kept when it fits)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key][0]
        value = make()
        cost = self.size(value)
        if cost > self.max_bytes // 4:
            return value
        with self._lock:
            if key not in self._items:
                self._items[key] = (value, cost)
                self.bytes += cost
            while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0
