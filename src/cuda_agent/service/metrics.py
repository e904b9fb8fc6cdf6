"""Counters and latency percentiles of the service, as JSON or Prometheus text.

Latencies are kept for the last ``WINDOW`` calls of each tool; percentiles are nearest-rank.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from typing import Any

WINDOW = 2048
PERCENTILES = (50, 90, 99)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


class Metrics:
    """Thread-safe counts of tool calls by name and outcome, with recent latencies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, int] = defaultdict(int)
        self._errors: dict[str, int] = defaultdict(int)
        self._latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=WINDOW))

    def record(self, tool: str, seconds: float, status: int) -> None:
        with self._lock:
            self._calls[tool] += 1
            if status >= 400:
                self._errors[tool] += 1
            self._latency[tool].append(seconds)

    def tools(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            snapshot = {name: (self._calls[name], self._errors[name], list(self._latency[name]))
                        for name in self._calls}
        out = {}
        for name, (calls, errors, seconds) in sorted(snapshot.items()):
            out[name] = {"calls": calls, "errors": errors,
                         **{f"p{p}_s": round(percentile(seconds, p), 6) for p in PERCENTILES}}
        return out


def prometheus(snapshot: dict[str, Any]) -> str:
    """The ``/metrics`` JSON snapshot in the Prometheus text exposition format."""
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[str, float]], kind: str = "gauge"
              ) -> None:
        lines.append(f"# HELP cuda_agent_{name} {help_text}")
        lines.append(f"# TYPE cuda_agent_{name} {kind}")
        for labels, value in samples:
            lines.append(f"cuda_agent_{name}{labels} {value}")

    episodes = snapshot["episodes"]
    gauge("episodes_open", "Episodes open now.", [("", episodes["open"])])
    gauge("episodes_opened_total", "Episodes opened since start.",
          [("", episodes["opened_total"])], "counter")
    gauge("episodes_closed_total", "Episodes closed by a client or for idling.",
          [('{reason="client"}', episodes["closed_total"]),
           ('{reason="idle"}', episodes["expired_total"])], "counter")
    tools = snapshot["tools"]
    gauge("tool_calls_total", "Tool calls by tool.",
          [(f'{{tool="{n}"}}', t["calls"]) for n, t in tools.items()], "counter")
    gauge("tool_errors_total", "Tool calls answered with a 4xx or 5xx status.",
          [(f'{{tool="{n}"}}', t["errors"]) for n, t in tools.items()], "counter")
    gauge("tool_latency_seconds", "Recent tool-call latency percentiles.",
          [(f'{{tool="{n}",quantile="{p / 100:g}"}}', t[f"p{p}_s"])
           for n, t in tools.items() for p in PERCENTILES])
    jobs = snapshot["judge_jobs"]
    gauge("judge_jobs", "Judge jobs by state.",
          [(f'{{state="{k}"}}', v) for k, v in jobs.items() if v is not None])
    return "\n".join(lines) + "\n"
