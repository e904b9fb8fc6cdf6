"""The main job: optimise one task with an agent and leave a result folder.

    cuda-agent optimize builtin:gelu_bias_scale            # offline, the shipped replay
    cuda-agent optimize model.py --model openai:NAME --base-url http://host:8000/v1

``optimize`` creates the workspace, runs one episode (``loop.run_episode``), judges the
result and writes ``OUT/``: ``workspace/`` (where the agent worked), ``trajectory.jsonl``,
``result/`` (``model_new.py`` and ``kernels/``), ``judge.json`` (the final JudgeResult) and
``report.md`` (speed-ups, what changed, the episode's timeline).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import shutil
from pathlib import Path
from typing import Any

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.types import EpisodeResult, Policy
from cuda_agent.tasks.task import Task

BUILTIN_REPLAY = "replay:builtin"
"""The shipped replay: solves ``builtin:gelu_bias_scale`` on CPU or CUDA, offline."""
BUILTIN_TASK = "gelu_bias_scale"


class OptimizeError(ValueError):
    """The job cannot start: a bad task, model or output folder."""


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    out: Path
    episode: EpisodeResult
    report: Path


def builtin_replay_path(task: Task, device: str) -> Path:
    """The shipped replay for the built-in example on ``device``."""
    from cuda_agent.tasks.loaders import builtin_dir

    if task.name != BUILTIN_TASK:
        raise OptimizeError(f"the built-in replay solves builtin:{BUILTIN_TASK} only, not "
                            f"{task.name}; give a model: --model openai:NAME --base-url URL "
                            "or --model hf:PATH")
    return builtin_dir() / BUILTIN_TASK / "replay" / f"{device}.json"


def optimize(task: Task, policy: Policy, device: str, out: Path, config: AgentConfig,
             on_event=None) -> OptimizeResult:
    """Run the whole job into ``out`` (which must be new or empty)."""
    from cuda_agent.judge.cpu_size import workspace_sizing
    from cuda_agent.workspace import WorkspaceError, init_workspace

    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise OptimizeError(f"{out} is not empty; pick a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    try:
        root = init_workspace(task, out / "workspace", device,
                              sizing=workspace_sizing(task, device))
    except WorkspaceError as exc:
        raise OptimizeError(str(exc)) from None
    start = _snapshot(root)
    episode = run_episode(task, root, policy, config, out / "trajectory.jsonl", on_event)
    copy_result(root, out / "result")
    (out / "judge.json").write_text(json.dumps(episode.final, indent=2) + "\n")
    report = out / "report.md"
    report.write_text(render_report(task, device, episode, start, _snapshot(root),
                                    tool_calls(out / "trajectory.jsonl")))
    return OptimizeResult(out, episode, report)


def copy_result(root: Path, result: Path) -> None:
    """``model_new.py`` and ``kernels/`` of the workspace ``root`` into ``result``, without
    the template's worked example where the agent's code does not use it."""
    from cuda_agent.workspace.examples import unused_example_files

    (result / "kernels").mkdir(parents=True)
    shutil.copy2(root / "model_new.py", result / "model_new.py")
    unused = set(unused_example_files(root / "model_new.py", root / "kernels"))
    for path in sorted((root / "kernels").glob("*")):
        if path.is_file() and path not in unused:
            shutil.copy2(path, result / "kernels" / path.name)


def tool_calls(trajectory: Path) -> list[dict[str, Any]]:
    """Each tool call of the episode as its trajectory records it: turn, name, ok, seconds,
    and for a judgement (verify, profile) where its time went (``phases``, seconds)."""
    calls = []
    with open(trajectory) as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("type") == "tool_result":
                call = {k: record.get(k) for k in ("turn", "name", "ok", "seconds")}
                data = record.get("data")
                phases = data.get("phases") if isinstance(data, dict) else None
                if phases:
                    call["phases"] = {str(k): v for k, v in phases}
                calls.append(call)
    return calls


def _most(phases: dict[str, float] | None, count: int = 4) -> str:
    """A judgement's longest phases, longest first (the GPU turn's totals overlap them)."""
    own = {k: v for k, v in (phases or {}).items() if not k.startswith("gpu_") and "." not in k}
    top = sorted(own.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{k} {v:.2f}" for k, v in top)


def _snapshot(root: Path) -> dict[str, str]:
    files = [root / "model_new.py", *sorted((root / "kernels").glob("*"))]
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in files
            if p.is_file()}


def render_report(task: Task, device: str, episode: EpisodeResult, before: dict[str, str],
                  after: dict[str, str], calls: list[dict[str, Any]] | None = None) -> str:
    """The Markdown report of one job; ``calls`` (``tool_calls``) gives each tool call's
    time, so where an iteration's time goes is in every report."""
    final: dict[str, Any] = episode.final or {}
    lines = [f"# cuda-agent optimize: {task.name}", "",
             f"- policy: `{episode.policy}`, device: {device}",
             f"- episode: {episode.stop_reason} after {episode.turns} turns, "
             f"{episode.prompt_tokens + episode.completion_tokens} tokens, "
             f"{episode.seconds:.1f} s",
             f"- reward: **{episode.reward if episode.reward is not None else 'none'}** "
             f"(judge {final.get('judge_version', '?')}, precision "
             f"{final.get('precision', '?')})"]
    if episode.error:
        lines.append(f"- error: {episode.error}")
    lines += ["", "## Final judgement", "", "| | ms | speed-up |", "|---|---|---|",
              f"| candidate | {_ms(final.get('runtime_ms'))} | |",
              f"| eager PyTorch | {_ms(final.get('eager_ms'))} | "
              f"{_x(final.get('speedup_vs_eager'))} |",
              f"| torch.compile | {_ms(final.get('compile_ms'))} | "
              f"{_x(final.get('speedup_vs_compile'))} |"]
    for reason in final.get("reasons") or []:
        lines.append(f"- {reason}")
    if calls:
        lines += ["", "## Tool calls", "", "| turn | tool | ok | seconds | most of it (s) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c['turn']} | {c['name']} | {'yes' if c['ok'] else 'no'} | "
                  f"{c['seconds']:.2f} | {_most(c.get('phases'))} |" for c in calls]
        lines.append(f"| | final judgement | | {final.get('seconds', 0.0):.2f} | "
                     f"{_most(dict(final.get('phases') or []))} |")
    lines += ["", "## What changed", ""]
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name, ""), after.get(name, "")
        if old == new:
            continue
        diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm=""))
        added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
        removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
        lines.append(f"- `{name}`: +{added} -{removed} lines")
    lines += ["", "The kernels are in `result/`, the whole episode in `trajectory.jsonl` "
              "(`cuda-agent trajectories show trajectory.jsonl`).", ""]
    return "\n".join(lines)


def _ms(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def _x(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"
