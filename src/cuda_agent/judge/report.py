"""What a worker reports, read as typed fields: a candidate's process may write anything in
its report, and nothing it writes can raise in the judge or reach the verdict untyped.

``report`` keeps each field the judge reads only with its declared type (a value of another
type is dropped, a text cut to its length); ``outcome`` turns the report, the stage the
worker last wrote and how it ended into a ``WorkerOutcome``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.build import diagnostics
from cuda_agent.judge.timing import MAX_SAMPLES, clean_samples


@dataclass(frozen=True)
class WorkerOutcome:
    """What came back from one worker process."""

    ok: bool
    result: dict[str, Any]
    failure: str | None
    stderr_tail: str
    marks: tuple[tuple[str, float], ...] = ()
    leftover: int = 0


def outcome(text: str | None, stage_text: str | None, code: int | None, timed_out: bool,
            timeout_s: float, leftover: int = 0, stderr_tail: str = "",
            marks: tuple[tuple[str, float], ...] = (), timed: bool = False) -> WorkerOutcome:
    """What came back from a worker: its report (``text``, read as ``report`` reads it; a
    ``timed`` job's must hold its samples), the stage it last wrote (``stage_text``), its
    exit ``code`` and whether it ran out of time."""
    result = report(text, timed)
    stage = (stage_text or "start").strip()[:80] or "start"
    if timed_out:
        return WorkerOutcome(False, result, f"timed out after {timeout_s:.0f} s "
                             f"(stage: {stage})", stderr_tail, marks, leftover)
    if not result:
        return WorkerOutcome(False, {"stage": stage},
                             f"{_describe_exit(code, stderr_tail)} (stage: {stage})",
                             stderr_tail, marks, leftover)
    if result.get("ok") is not True:
        return WorkerOutcome(False, result,
                             f"{result.get('stage')}: {describe_error(result.get('error'))}",
                             stderr_tail, marks, leftover)
    return WorkerOutcome(True, result, None, stderr_tail, marks, leftover)


ERROR_SHOWN = 800
"""The most of a worker's error a reason quotes, a compiler's diagnostics aside."""
COMPILER_ERRORS_SHOWN = 5
"""The most compiler errors a reason quotes."""
_NINJA_STEP = re.compile(r": \[\d+/\d+\] ")
_BUILD_LOG = re.compile(r"Error building extension|^FAILED: ", re.MULTILINE)
"""What marks an error as a failed build's log (torch's cpp_extension runs ninja)."""


def describe_error(error: str | None) -> str:
    """A worker's error as a verdict's reason. A failed build that ran a compiler (torch's
    ``load_inline`` raises with the whole ninja log, command lines first) becomes its first
    words and the compiler's own error lines (``main.cpp:6:3: error: ...``); any other
    error its first ``ERROR_SHOWN`` characters."""
    text = str(error)
    if not _BUILD_LOG.search(text):
        return text[:ERROR_SHOWN]
    found = [d for d in diagnostics.parse(text) if d.severity in ("error", "fatal error")]
    if not found:
        return text[:ERROR_SHOWN]
    first = text.splitlines()[0]
    step = _NINJA_STEP.search(first)
    head = first[:step.start()] if step else first[:200]
    shown = [str(dataclasses.replace(d, file=os.path.basename(d.file) if d.file else None))
             for d in found[:COMPILER_ERRORS_SHOWN]]
    more = len(found) - len(shown)
    return (f"{head}: " + "; ".join(shown)
            + (f"; and {more} more error(s)" if more > 0 else ""))


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


REPORT_BYTES = 4 << 20
"""The largest report (``result.json``) the judge reads."""


def read_small(path: Path, limit: int) -> str | None:
    """A file of the worker's folder, if it is a regular file of at most ``limit`` bytes
    (never following a link, never blocking on a pipe): the worker may put anything there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.pread(fd, limit + 1, 0)[:limit].decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


_TEXTS = {"stage": 80, "error": 16_000, "traceback": 4000, "time_meaning": 16,
          "profile": 20_000, "float64_error": 300, "seccomp": 300, "degenerate": 2000}
"""A report's text fields, each cut to this many characters."""
_FLAGS = ("ok", "float64")
_WHOLE = ("pid", "io_bytes", "input_bytes")
_REFERENCE = {"outputs": dict, "sizes": dict, "aliases": list, "fan_in": (list, dict)}
"""The reference's records of its calls, read item by item where they are used (``plan``)."""
_DETAIL_COUNTS = ("calls", "unjoined", "overran", "activity_calls", "disturbed", "late",
                  "recorded_calls")
_DETAIL_AMOUNTS = ("overrun_us_max", "warmup_seconds", "timed_seconds", "activity_seconds",
                   "activity_start_seconds")
_DETAIL_NOTES = ("activity_error", "activity_problem")
STAGES_KEPT = 32
"""The most stages (``stage_at``) a report may name: a worker has about a dozen."""
_BIGGEST = 2**53
"""The largest count or amount a report may hold (larger: dropped, as of another type)."""


def report(text: str | None, timed: bool = False) -> dict[str, Any]:
    """A worker's report, parsed and cut to the fields the judge reads, each of its declared
    type (a value of another type is dropped, a text cut to its length; a candidate's
    process may write anything): counts whole numbers and amounts finite numbers, from 0 to
    ``_BIGGEST``, ``timing_details`` only the keys the judge reads. A report that says
    ``ok`` with ``samples_ms`` that are not ``timing.clean_samples``, or none from a
    ``timed`` job, is refused: the result then says why, not ``ok``."""
    try:
        raw = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    found: dict[str, Any] = {k: raw[k] for k in _FLAGS if type(raw.get(k)) is bool}
    found |= {k: raw[k][:n] for k, n in _TEXTS.items() if isinstance(raw.get(k), str)}
    found |= {k: raw[k] for k in _WHOLE if _count(raw.get(k)) is not None}
    found |= {k: raw[k] for k, kind in _REFERENCE.items() if isinstance(raw.get(k), kind)}
    for key in ("bandwidth_gbs", "call_s"):
        if _amount(raw.get(key)) is not None:
            found[key] = float(raw[key])
    if isinstance(raw.get("stage_at"), dict):
        found["stage_at"] = {str(k)[:40]: float(v) for k, v in
                             list(raw["stage_at"].items())[:STAGES_KEPT]
                             if _amount(v) is not None}
    if isinstance(raw.get("timing_details"), dict):
        found["timing_details"] = _details(raw["timing_details"])
    if "samples_ms" in raw or timed:
        samples = clean_samples(raw.get("samples_ms"))
        if samples is not None:
            found["samples_ms"] = samples
        elif found.get("ok") is True:
            what = "none" if raw.get("samples_ms") is None else "samples that are not"
            return {"ok": False, "stage": "report", "stage_at": found.get("stage_at", {}),
                    "error": f"the worker's report was refused: its samples_ms holds {what} "
                             f"a list of 1 to {MAX_SAMPLES} finite times (ms) from 0"}
    return found


def _details(raw: dict[str, Any]) -> dict[str, Any]:
    """The timing details the judge reads, each of its type; other keys dropped."""
    found: dict[str, Any] = {k: raw[k] for k in _DETAIL_COUNTS if _count(raw.get(k)) is not None}
    found |= {k: float(raw[k]) for k in _DETAIL_AMOUNTS if _amount(raw.get(k)) is not None}
    found |= {k: raw[k][:300] for k in _DETAIL_NOTES if isinstance(raw.get(k), str)}
    return found


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= _BIGGEST else None


def _amount(value: Any) -> float | None:
    """``value`` if a finite number from 0 to ``_BIGGEST`` (NaN fails both comparisons)."""
    return float(value) if type(value) in (int, float) and 0 <= value <= _BIGGEST else None
