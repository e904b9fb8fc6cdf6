"""Rejection fine-tuning (RFT) selection: which trajectories the actor is fine-tuned on.

    report = select_trajectories(sorted(Path("runs/trajectories").glob("*.jsonl")),
                                 SelectConfig(min_reward=1))

A trajectory is kept when it passes every rule below; each rule is a named check that
returns the reasons it fails (an empty list when it passes), so a dropped trajectory is
listed with every rule it broke.

- ``complete``: the file has an ``episode_end`` record and the episode stopped ``done``
  (submitted), not on a turn/token limit, a policy error or a kill.
- ``positive_reward``: the final reward is at least ``min_reward`` (1: correct; 2 and 3:
  faster than eager / than torch.compile). An unjudged episode has no reward and fails.
- ``well_formed_calls``: every tool call's arguments decoded to a JSON object.
- ``valid_behaviour``: no call of an unknown tool, no path that leaves the workspace,
  no write to a fixed file (the tools refuse these; the refusal texts are matched).
- ``no_redundant_loops``: no identical tool call (same name, same arguments) made
  ``max_repeats`` times in a row or more.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cuda_agent.agent.tool_specs import spec_by_name
from cuda_agent.agent.trajectory import Trajectory, TrajectoryError, read_trajectory


class SelectConfig(BaseModel):
    """Thresholds of the RFT selection rules."""

    min_reward: float = Field(1.0, description="Smallest final reward kept (1 = correct).")
    max_repeats: int = Field(3, ge=2, description="Identical consecutive tool calls that count "
                             "as a redundant loop.")
    rules: tuple[str, ...] | None = Field(None, description="Rules to apply (names from "
                                          "RULES); None: all of them.")


INVALID_MARKERS = (
    "unknown tool ",
    "absolute paths are not allowed",
    "'..' is not allowed",
    "leads outside the workspace",
    "is a fixed file of the workspace",
    "patterns are relative to the workspace",
)
"""Texts of the tools' refusals that mark invalid behaviour (see agent/file_tools.py)."""

Rule = Callable[[Trajectory, SelectConfig], list[str]]


def _end(traj: Trajectory) -> dict[str, Any] | None:
    ends = [r for r in traj.records if r.get("type") == "episode_end"]
    return (ends[-1].get("result") or {}) if ends else None


def _calls(traj: Trajectory) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for record in traj.records:
        message = record.get("message") if record.get("type") == "message" else None
        if message and message.get("role") == "assistant":
            calls += [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return calls


def check_complete(traj: Trajectory, config: SelectConfig) -> list[str]:
    end = _end(traj)
    if end is None:
        return ["no episode_end record (unfinished episode)"]
    if end.get("stop_reason") != "done":
        return [f"stopped {end.get('stop_reason')!r}, not 'done'"]
    return []


def check_positive_reward(traj: Trajectory, config: SelectConfig) -> list[str]:
    reward = (_end(traj) or {}).get("reward")
    if reward is None:
        return ["no reward (episode not judged)"]
    if reward < config.min_reward:
        return [f"reward {reward} < {config.min_reward}"]
    return []


def check_well_formed_calls(traj: Trajectory, config: SelectConfig) -> list[str]:
    return [f"tool call {c.get('name')!r} with malformed arguments: "
            f"{str(c.get('raw_arguments', ''))[:80]!r}"
            for c in _calls(traj) if not isinstance(c.get("arguments"), dict)]


def check_valid_behaviour(traj: Trajectory, config: SelectConfig) -> list[str]:
    known = spec_by_name()
    problems = [f"call of unknown tool {c.get('name')!r}" for c in _calls(traj)
                if c.get("name") not in known]
    for record in traj.records:
        if record.get("type") != "tool_result" or record.get("ok"):
            continue
        output = str(record.get("output", ""))
        marker = next((m for m in INVALID_MARKERS if m in output), None)
        if marker is not None and not output.startswith("unknown tool "):
            problems.append(f"{record.get('name')}: refused: {output.splitlines()[0][:120]}")
    return problems


def check_no_redundant_loops(traj: Trajectory, config: SelectConfig) -> list[str]:
    problems: list[str] = []
    previous, run = None, 0
    for call in _calls(traj):
        key = (call.get("name"), json.dumps(call.get("arguments"), sort_keys=True)
               if isinstance(call.get("arguments"), dict) else call.get("raw_arguments"))
        run = run + 1 if key == previous else 1
        previous = key
        if run == config.max_repeats:
            problems.append(f"{key[0]!r} called {run} times in a row with the same arguments")
    return problems


RULES: dict[str, Rule] = {
    "complete": check_complete,
    "positive_reward": check_positive_reward,
    "well_formed_calls": check_well_formed_calls,
    "valid_behaviour": check_valid_behaviour,
    "no_redundant_loops": check_no_redundant_loops,
}


@dataclasses.dataclass(frozen=True)
class SelectionReport:
    """Kept files, dropped files with the reasons (``rule: why``), failures per rule."""

    kept: list[Path]
    dropped: dict[Path, list[str]]
    counts: dict[str, int]
    """How many trajectories each rule rejected ("unreadable" for files that failed to load)."""

    def summary(self) -> str:
        total = len(self.kept) + len(self.dropped)
        parts = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items() if n)
        return f"kept {len(self.kept)} of {total}" + (f" (dropped by {parts})" if parts else "")


def check_trajectory(traj: Trajectory, config: SelectConfig) -> list[str]:
    """Every failure of ``traj`` as ``rule: reason`` (empty when it is kept)."""
    names = config.rules if config.rules is not None else tuple(RULES)
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise ValueError(f"unknown selection rule(s) {unknown}; known: {sorted(RULES)}")
    return [f"{name}: {why}" for name in names for why in RULES[name](traj, config)]


def select_trajectories(paths: Iterable[Path | str], config: SelectConfig | None = None
                        ) -> SelectionReport:
    """Apply the rules to each trajectory file; see the module docstring."""
    config = config or SelectConfig()
    kept: list[Path] = []
    dropped: dict[Path, list[str]] = {}
    counts: Counter[str] = Counter({name: 0 for name in config.rules or RULES})
    for raw in paths:
        path = Path(raw)
        try:
            reasons = check_trajectory(read_trajectory(path), config)
        except (OSError, TrajectoryError) as exc:
            reasons = [f"unreadable: {exc}"]
        if reasons:
            dropped[path] = reasons
            counts.update({reason.split(":", 1)[0] for reason in reasons})
        else:
            kept.append(path)
    return SelectionReport(kept, dropped, dict(counts))
