"""The ReAct loop: the policy answers, the tools act on the workspace, until it submits.

    result = run_episode(task, workspace, policy, AgentConfig(), Path("runs/ep0.jsonl"))

Each turn the policy gets the (compacted) conversation and the tool specs; every tool call
in its answer runs through the ``Toolbox`` and comes back as a 'tool' message; calls the
model wrote as text (a server without a tool-call parser) are read too (``text_calls``),
and one that looks like a call but cannot be read ends the episode with 'error'. The episode
ends 'done' when ``submit`` is called or the policy answers twice in a row without a tool
call (it is nudged once), 'turn_limit' after ``max_turns``, 'token_limit' when a step's
context passes ``max_tokens`` (or the episode's total passes ``max_total_tokens``), and
'error' when the policy fails. Then the workspace gets the final judgement (the same judge
as ``cuda-agent judge``), whose reward the episode returns. The trajectory always ends with
an ``episode_end`` record.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from pydantic import BaseModel, Field

from cuda_agent.agent.compaction import CompactionConfig, TokenCounter, compact, estimate_tokens
from cuda_agent.agent.text_calls import read_text_calls
from cuda_agent.agent.tools import Toolbox, ToolsConfig
from cuda_agent.agent.trajectory import Recorder
from cuda_agent.agent.types import EpisodeResult, Message, Policy, PolicyError, StopReason
from cuda_agent.results import to_dict
from cuda_agent.tasks.task import Task

PROMPTS = Path(__file__).resolve().parent / "prompts"
JUDGED_TOOLS = ("build", "verify", "profile")

EventHandler = Callable[[str, dict[str, Any]], None]


class AgentConfig(BaseModel):
    """One episode's limits, tools, compaction and final judgement; ``agent:`` in the YAML."""

    max_turns: int = Field(200, ge=1, description="Policy steps at most.")
    max_tokens: int = Field(
        128_000, gt=0, description="Context budget of one step (prompt + completion tokens). "
        "Compaction keeps the prompt under compaction.threshold x this; a step that still "
        "passes it stops the episode with 'token_limit'.")
    max_total_tokens: int | None = Field(
        None, description="Budget of the whole episode (prompt + completion tokens summed "
        "over all steps); None: no limit.")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="The tools' limits.")
    compaction: CompactionConfig = Field(default_factory=CompactionConfig,
                                         description="How the history is shrunk.")
    final_judge: bool = Field(True, description="Judge the workspace when the episode ends.")
    judge: dict[str, Any] = Field(
        default_factory=dict, description="JudgeConfig overrides for the final judgement "
        "(timed by default); device always comes from the workspace.")


def run_episode(task: Task, root: Path, policy: Policy, config: AgentConfig | None = None,
                trajectory: Path | None = None, on_event: EventHandler | None = None,
                count_tokens: TokenCounter | None = None) -> EpisodeResult:
    """Run one episode on the workspace ``root`` (made by ``init_workspace`` for ``task``)."""
    config = config or AgentConfig()
    recorder = Recorder(trajectory) if trajectory is not None else None
    episode = _Episode(task, Path(root), policy, config, recorder, on_event,
                       count_tokens or estimate_tokens)
    stop: StopReason = "error"
    error: str | None = "interrupted"
    final: dict[str, Any] | None = None
    reward: int | None = None
    try:
        if recorder is not None:
            recorder.episode_start(task.name, policy.name, config.model_dump(mode="json"))
        stop, error = episode.run()
        episode.toolbox.close()  # the episode's warm judge: the final judgement is separate
        if config.final_judge:
            final, reward, judge_error = episode.final_judgement()
            error = error or judge_error
    finally:
        episode.toolbox.close()
        result = EpisodeResult(
            task=task.name, policy=policy.name, stop_reason=stop, turns=episode.turns,
            prompt_tokens=episode.prompt_tokens, completion_tokens=episode.completion_tokens,
            seconds=time.perf_counter() - episode.start, reward=reward, final=final,
            error=error, trajectory=str(trajectory) if trajectory is not None else None)
        if recorder is not None:
            recorder.episode_end(result)
            recorder.close()
        episode.emit("end", {"result": result})
    return result


class _Episode:
    def __init__(self, task: Task, root: Path, policy: Policy, config: AgentConfig,
                 recorder: Recorder | None, on_event: EventHandler | None,
                 count: TokenCounter):
        self.task, self.root, self.policy, self.config = task, root, policy, config
        self.recorder, self.on_event, self.count = recorder, on_event, count
        self.toolbox = Toolbox(root, config.tools, task)
        self.device = _device(root)  # read before the agent can edit the workspace's record
        self.messages: list[Message] = []
        self.turns = self.prompt_tokens = self.completion_tokens = self.used_tokens = 0
        self.start = time.perf_counter()

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)

    def add(self, message: Message) -> None:
        self.messages.append(message)
        if self.recorder is not None:
            self.recorder.message(message)

    def run(self) -> tuple[StopReason, str | None]:
        """Run the turns; (stop reason, error message or None)."""
        try:
            for message in initial_messages(self.task, self.root):
                self.add(message)
            return self._turns(), None
        except PolicyError as exc:
            return "error", f"policy error: {exc}"
        except Exception as exc:
            tail = "".join(traceback.format_exception(exc)[-3:]).strip()
            return "error", f"{type(exc).__name__}: {exc}\n{tail}"

    def _turns(self) -> StopReason:
        specs = self.toolbox.specs()
        budget = self.config.max_tokens
        idle = 0
        for turn in range(1, self.config.max_turns + 1):
            self.turns = turn
            self.emit("turn", {"turn": turn})
            shown = compact(self.messages, budget, self.config.compaction, self.count)
            prompt_estimate = self.count(shown)
            if prompt_estimate > budget:
                return "token_limit"
            begin = time.perf_counter()
            step = self.policy.step(shown, specs)
            seconds = step.seconds or time.perf_counter() - begin
            read = read_text_calls(step.message, f"text-{turn}")
            reply = step.message if read is None else read.message
            self.add(reply)
            if self.recorder is not None:
                self.recorder.step(turn, step, seconds,
                                   read.record(step.message.content) if read else None)
            if read is not None:
                self.emit("text_calls", {"turn": turn, "form": read.form,
                                         "calls": len(read.message.tool_calls)})
            used = step.usage.prompt_tokens + step.usage.completion_tokens
            self.prompt_tokens += step.usage.prompt_tokens
            self.completion_tokens += step.usage.completion_tokens
            context = used or prompt_estimate + self.count([reply])
            self.used_tokens += context
            self.emit("step", {"turn": turn, "message": reply, "usage": step.usage})
            if read is not None and read.problem:
                raise PolicyError(read.problem)
            if not reply.tool_calls:
                idle += 1
                if idle >= 2:
                    return "done"
                self.add(Message(role="user", content=(PROMPTS / "nudge.md").read_text()))
            else:
                idle = 0
                if self._act(turn, reply):
                    return "done"
            total = self.config.max_total_tokens
            if context > budget or (total is not None and self.used_tokens > total):
                return "token_limit"
        return "turn_limit"

    def _act(self, turn: int, reply: Message) -> bool:
        """Run the reply's tool calls; True when one of them was a successful submit."""
        submitted = False
        for call in reply.tool_calls:
            self.emit("tool_call", {"turn": turn, "name": call.name, "arguments": call.arguments})
            result = self.toolbox.call(call.name, call.arguments, call.raw_arguments)
            self.add(Message(role="tool", content=result.output, tool_call_id=call.id,
                             name=call.name))
            if self.recorder is not None:
                self.recorder.tool_result(turn, call.id, call.name, result)
            self.emit("tool_result", {"turn": turn, "name": call.name, "result": result})
            if call.name in JUDGED_TOOLS and result.data is not None:
                if self.recorder is not None:
                    self.recorder.judge(call.name, result.data, turn)
                self.emit("judge", {"source": call.name, "result": result.data})
            submitted = submitted or (call.name == "submit" and result.ok)
        return submitted

    def final_judgement(self) -> tuple[dict[str, Any] | None, int | None, str | None]:
        """(JudgeResult as a dict, reward, error); the same judge as ``cuda-agent judge``."""
        from cuda_agent.judge import Candidate, Judge, JudgeConfig
        from cuda_agent.workspace import read_workspace

        try:
            device = self.device or read_workspace(self.root).device
            config = JudgeConfig.model_validate({"time": True, **self.config.judge,
                                                 "device": device})
            judged = Judge(config).judge(self.task, Candidate("workspace", self.root))
        except Exception as exc:
            error = f"final judgement failed: {type(exc).__name__}: {exc}"
            if self.recorder is not None:
                self.recorder.judge("final", None, error=error)
            return None, None, error
        data = to_dict(judged)
        if self.recorder is not None:
            self.recorder.judge("final", data)
        self.emit("judge", {"source": "final", "result": data})
        return data, judged.reward, None


def initial_messages(task: Task, root: Path) -> list[Message]:
    """The system prompt (SKILL.md + the reference code) and the task message."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROMPTS)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    skill_path = Path(root) / "SKILL.md"
    skill = skill_path.read_text() if skill_path.is_file() else ""
    system = env.get_template("system.md.j2").render(skill=skill.strip(),
                                                     reference=task.code.strip())
    user = env.get_template("task.md.j2").render(task_name=task.name)
    return [Message(role="system", content=system), Message(role="user", content=user)]


def _device(root: Path) -> str | None:
    from cuda_agent.workspace import WorkspaceError, read_workspace

    try:
        return read_workspace(root).device
    except WorkspaceError:
        return None  # the final judgement says why
