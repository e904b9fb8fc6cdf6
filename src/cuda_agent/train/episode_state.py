"""One RL episode at the token level, without any trainer: the workspace it owns, the tools
acting on it, the token trace with its loss mask, and the milestone reward at the end.

    async def generate(ids):                 # any engine: verl's server, vLLM, a script
        return reply_ids, reply_logprobs     # logprobs may be None
    with AgentEpisode(task, EpisodeSettings(), LocalJudge()) as episode:
        rollout = await run_rollout(episode, ChatCodec(tokenizer), generate, 131_072)
    rollout.trace.response_mask              # 1 on generated tokens, 0 on tool outputs

The trainer adapters (``verl_loop.py``) only move tokens between this and their engine.
The reward is the judge's milestone reward (-1/1/2/3), the same judge as ``cuda-agent
judge``, run in-process or through a judge pool (``execution.make_pool``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from cuda_agent.agent.loop import PROMPTS, initial_messages
from cuda_agent.agent.policies.calls import parse_tool_calls
from cuda_agent.agent.policies.hf_template import (
    PLAIN_END,
    end_marker,
    render_plain,
    template_messages,
    tool_dict,
)
from cuda_agent.agent.tools import Toolbox, ToolsConfig
from cuda_agent.agent.types import Message, ToolSpec
from cuda_agent.tasks.task import Task

Generate = Callable[[list[int]], Awaitable[tuple[list[int], list[float] | None]]]
"""Prompt ids -> (reply ids, their log-probabilities or None)."""
RolloutStop = Literal["done", "turn_limit", "token_limit"]


class EpisodeSettings(BaseModel):
    """One training episode's limits and its final judgement."""

    max_turns: int = Field(150, ge=1, description="Policy turns at most (the paper: 150).")
    device: Literal["cpu", "cuda"] = Field("cuda", description="The workspace's device.")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="The tools' limits.")
    judge: dict[str, Any] = Field(
        default_factory=lambda: {"time": True}, description="JudgeConfig overrides of the "
        "final judgement (timed: the milestone reward needs eager/compile timings).")
    failed_reward: float = Field(
        -1.0, description="Reward when the final judgement could not run at all.")


@dataclasses.dataclass
class TokenTrace:
    """The token sequence of one episode: the first prompt, then everything after it.

    ``response_mask[i]`` is 1 where the policy generated ``response_ids[i]`` and 0 on tool
    outputs and template scaffolding between turns; ``logprobs`` is 0.0 where unknown."""

    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    scored: bool = True
    """False once a turn came without log-probabilities (``logprobs`` is then partial)."""

    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_generated(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probabilities")
        self.scored = self.scored and logprobs is not None
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def cut(self, limit: int) -> TokenTrace:
        """The trace with its response cut to ``limit`` tokens."""
        return TokenTrace(list(self.prompt_ids), self.response_ids[:limit],
                          self.response_mask[:limit], self.logprobs[:limit], self.scored)


class ChatCodec:
    """Messages <-> token ids through the tokenizer's chat template (or the plain template
    of ``hf_template`` when it has none). Tool outputs are encoded as the text the template
    adds after the history, so the trace stays the template's own rendering."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def render(self, messages: list[Message], tools: list[ToolSpec], open_turn: bool) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                template_messages(messages), tools=[tool_dict(t) for t in tools] or None,
                add_generation_prompt=open_turn, tokenize=False)
        text = render_plain(messages, tools, end_marker(self.tokenizer))
        return text if open_turn else text.removesuffix("<|assistant|>\n")

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[Message], tools: list[ToolSpec]) -> list[int]:
        return self.encode(self.render(messages, tools, open_turn=True))

    def observation_ids(self, history: list[Message], new: list[Message],
                        tools: list[ToolSpec]) -> list[int]:
        """Tokens of ``new`` (tool outputs, a nudge) after ``history``, ending with the open
        assistant turn."""
        before = self.render(history, tools, open_turn=False)
        after = self.render(history + new, tools, open_turn=True)
        if not after.startswith(before):  # a template that rewrites earlier turns
            after, before = self.render(new, [], open_turn=True), ""
        return self.encode(after[len(before):])

    def decode_reply(self, ids: list[int], call_prefix: str) -> Message:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not getattr(self.tokenizer, "eos_token", None):
            text = text.split(PLAIN_END, 1)[0]
        content, calls = parse_tool_calls(text, id_prefix=call_prefix)
        return Message(role="assistant", content=content, tool_calls=calls)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The final judgement: reward, the JudgeResult as a dict, or why there is none."""

    reward: float
    result: dict[str, Any] | None
    error: str | None = None


class EpisodeJudge(Protocol):
    def judge(self, task: Task, root: Path, config: dict[str, Any],
              failed_reward: float) -> Verdict: ...


class LocalJudge:
    """The judge in this process (``Judge(...).judge``), as ``cuda-agent judge`` runs it."""

    def judge(self, task: Task, root: Path, config: dict[str, Any],
              failed_reward: float) -> Verdict:
        from cuda_agent.judge import Candidate, Judge, JudgeConfig
        from cuda_agent.results import to_dict
        from cuda_agent.workspace import read_workspace

        try:
            fields = {**config, "device": read_workspace(root).device}
            result = Judge(JudgeConfig.model_validate(fields)).judge(
                task, Candidate("workspace", root))
        except Exception as exc:
            return Verdict(failed_reward, None, f"{type(exc).__name__}: {exc}")
        return Verdict(float(result.reward), to_dict(result))


class PoolJudge:
    """A judge pool (``JudgePool`` or ``RayJudgePool``): the candidate travels by content,
    so the pool's machines need not share this one's file system. The pool's own
    ``PoolConfig.judge`` decides how it judges; ``config`` is ignored here."""

    def __init__(self, pool: Any, timeout_s: float | None = None):
        self.pool, self.timeout_s = pool, timeout_s

    def judge(self, task: Task, root: Path, config: dict[str, Any],
              failed_reward: float) -> Verdict:
        from cuda_agent.execution.backend import JobFailed
        from cuda_agent.results import to_dict

        try:
            result = self.pool.submit(task, root).result(self.timeout_s)
        except Exception as exc:
            return Verdict(failed_reward, None, f"{type(exc).__name__}: {exc}")
        if isinstance(result, JobFailed):
            return Verdict(failed_reward, None, f"judge job failed: {result.reason}")
        return Verdict(float(result.reward), to_dict(result))


class AgentEpisode:
    """Owns one workspace (a temporary folder, removed on exit) and its conversation."""

    def __init__(self, task: Task, settings: EpisodeSettings, judge: EpisodeJudge):
        self.task, self.settings, self.judge_backend = task, settings, judge
        self.messages: list[Message] = []
        self.done = False
        self._idle = 0
        self._folder: Path | None = None
        self.root: Path | None = None
        self.toolbox: Toolbox | None = None

    def __enter__(self) -> AgentEpisode:
        from cuda_agent.judge.cpu_size import workspace_sizing
        from cuda_agent.workspace import init_workspace

        self._folder = Path(tempfile.mkdtemp(prefix="cuda-agent-episode-"))
        try:
            device = self.settings.device
            self.root = init_workspace(self.task, self._folder / "ws", device,
                                       sizing=workspace_sizing(self.task, device))
        except BaseException:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.toolbox = Toolbox(self.root, self.settings.tools, self.task)
        self.messages = initial_messages(self.task, self.root)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.toolbox is not None:
            self.toolbox.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def specs(self) -> list[ToolSpec]:
        return self._box().specs()

    def act(self, reply: Message) -> list[Message]:
        """Record the reply, run its tool calls; the messages that answer it (tool outputs,
        or a nudge after a reply without a call). Sets ``done`` on a successful submit or a
        second reply in a row without a call."""
        box = self._box()
        self.messages.append(reply)
        new: list[Message] = []
        if not reply.tool_calls:
            self._idle += 1
            self.done = self._idle >= 2
            if not self.done:
                new.append(Message(role="user", content=(PROMPTS / "nudge.md").read_text()))
        else:
            self._idle = 0
            for call in reply.tool_calls:
                result = box.call(call.name, call.arguments, call.raw_arguments)
                new.append(Message(role="tool", content=result.output, tool_call_id=call.id,
                                   name=call.name))
                self.done = self.done or (call.name == "submit" and result.ok)
        self.messages += new
        return new

    def verdict(self) -> Verdict:
        if self.root is None:
            raise RuntimeError("the episode has no workspace: use it as a context manager")
        if self.toolbox is not None:  # nothing the agent started may run beside the reward
            self.toolbox.close()
        return self.judge_backend.judge(self.task, self.root, self.settings.judge,
                                        self.settings.failed_reward)

    def _box(self) -> Toolbox:
        if self.toolbox is None:
            raise RuntimeError("the episode has no workspace: use it as a context manager")
        return self.toolbox


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What one episode gives the trainer."""

    trace: TokenTrace
    reward: float
    stop: RolloutStop
    turns: int
    verdict: Verdict


async def run_rollout(episode: AgentEpisode, codec: ChatCodec, generate: Generate,
                      response_length: int) -> Rollout:
    """Turns until submit, ``max_turns`` or ``response_length`` tokens, then the judge.
    Tool calls and the judge block, so they run in the event loop's executor."""
    loop = asyncio.get_running_loop()
    specs = episode.specs()
    trace = TokenTrace(codec.prompt_ids(episode.messages, specs))
    stop: RolloutStop = "turn_limit"
    turns = 0
    for turn in range(episode.settings.max_turns):
        if len(trace.response_ids) >= response_length:
            stop = "token_limit"
            break
        turns = turn + 1
        ids, logprobs = await generate(trace.context())
        trace.add_generated(list(ids), None if logprobs is None else list(logprobs))
        reply = codec.decode_reply(list(ids), f"call-{turn}")
        new = await loop.run_in_executor(None, episode.act, reply)
        if episode.done:
            stop = "done"
            break
        if turns == episode.settings.max_turns:
            break
        trace.add_observation(codec.observation_ids(episode.messages[:-len(new)], new, specs))
    verdict = await loop.run_in_executor(None, episode.verdict)
    return Rollout(trace.cut(response_length), verdict.reward, stop, turns, verdict)
