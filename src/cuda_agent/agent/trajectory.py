"""Trajectories: one JSON object per line, flushed and fsynced as each is written.

    cuda-agent trajectories show runs/ep0.jsonl

A killed process leaves every completed line readable; ``read_trajectory`` drops (and
reports) a truncated last line. The record types are documented in docs/agent.md:
``episode_start``, ``message``, ``step``, ``tool_result``, ``judge``, ``episode_end``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cuda_agent.agent.types import Message, PolicyStep, ToolResult, message_to_dict

FORMAT_VERSION = 1


class TrajectoryError(ValueError):
    """A trajectory file that cannot be read: not one whole record, or a malformed line other
    than the last."""


class Recorder:
    """Appends records to ``path`` (JSONL), one fsynced line each."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the record types ------------------------------------------------------------------
    def episode_start(self, task: str, policy: str, config: dict[str, Any]) -> None:
        self.write({"type": "episode_start", "version": FORMAT_VERSION, "task": task,
                    "policy": policy, "config": config, "time": _now()})

    def message(self, message: Message) -> None:
        self.write({"type": "message", "message": message_to_dict(message)})

    def step(self, turn: int, step: PolicyStep, seconds: float,
             from_text: dict[str, Any] | None = None) -> None:
        """``from_text``: the tool calls the loop read from the reply's text
        (``TextCalls.record``), or None."""
        tokens = dataclasses.asdict(step.tokens) if step.tokens is not None else None
        record = {"type": "step", "turn": turn, "usage": dataclasses.asdict(step.usage),
                  "seconds": seconds, "tokens": tokens}
        if from_text is not None:
            record["tool_calls_from_text"] = from_text
        self.write(record)

    def tool_result(self, turn: int, call_id: str, name: str, result: ToolResult) -> None:
        self.write({"type": "tool_result", "turn": turn, "tool_call_id": call_id, "name": name,
                    "ok": result.ok, "output": result.output, "data": result.data,
                    "seconds": result.seconds})

    def judge(self, source: str, result: dict[str, Any] | None, turn: int | None = None,
              error: str | None = None) -> None:
        self.write({"type": "judge", "source": source, "turn": turn, "result": result,
                    "error": error})

    def episode_end(self, result: Any) -> None:
        self.write({"type": "episode_end", "result": dataclasses.asdict(result),
                    "time": _now()})


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """The records of one file, and whether its last line was cut off."""

    records: tuple[dict[str, Any], ...]
    truncated_line: str | None = None

    @property
    def complete(self) -> bool:
        return any(r.get("type") == "episode_end" for r in self.records)


def read_trajectory(path: Path) -> Trajectory:
    """All records of ``path``; a torn last line (a killed writer) is dropped and reported.
    A file without one whole record is not a trajectory: ``TrajectoryError``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise TrajectoryError(f"{path}: not a trajectory (not UTF-8 text)") from None
    records: list[dict[str, Any]] = []
    truncated = None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "type" not in record:
                raise ValueError("not a record")
        except ValueError as exc:
            if all(not rest.strip() for rest in lines[i + 1:]):
                truncated = line
                break
            raise TrajectoryError(f"{path}: line {i + 1} is not a trajectory record: {exc}"
                                  ) from None
        records.append(record)
    if not records:
        what = "it is empty" if truncated is None else \
            "its first line is not a JSON record with a 'type'"
        raise TrajectoryError(f"{path}: not a trajectory: {what} (a trajectory is JSONL, one "
                              "record per line, as `cuda-agent optimize` writes it)")
    return Trajectory(tuple(records), truncated)


@dataclasses.dataclass(frozen=True)
class TokenStep:
    """The training view of one policy step."""

    turn: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]


def token_view(records: Any) -> Iterator[TokenStep]:
    """Each policy step's token ids, loss mask and log-probs, where the policy gave them."""
    for r in getattr(records, "records", records):
        tokens = r.get("tokens") if r.get("type") == "step" else None
        if tokens:
            yield TokenStep(int(r.get("turn", 0)), tuple(tokens["prompt_ids"]),
                            tuple(tokens["response_ids"]), tuple(tokens["loss_mask"]),
                            tuple(tokens["logprobs"]))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
