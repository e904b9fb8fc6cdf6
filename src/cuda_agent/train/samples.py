"""Training samples from trajectories: one token sequence per episode, with a loss mask.

    sample = samples_from_trajectory("runs/trajectories/gelu-0.jsonl", tokenizer, max_len=8192)

Two ways to get the tokens (``Sample.source`` says which was used):

- ``"tokens"``: every ``step`` record carries a TokenView (a local ``hf:`` policy) and each
  step's prompt ids start with everything before it (the previous prompt and response).
  The sequence is the first prompt, then per step the prompt's new ids (mask 0) and the
  response ids (the recorded loss mask, the recorded log-probs in ``old_logprobs``). These
  are exactly the ids the policy saw and produced.
- ``"template"``: otherwise (API policies, compaction that rewrote the history, ids that
  re-tokenise differently). The recorded messages are rendered with the tokenizer's chat
  template (with the agent's tool specs), or the built-in plain template of
  ``cuda_agent.agent.policies.hf_template`` when it has none. Each assistant turn is the
  text its message adds after the generation prompt (content, tool calls and the
  end-of-turn marker): mask 1; everything else (system, user, tool outputs, scaffolding):
  mask 0. Pieces are tokenised one by one so that no token straddles a mask boundary.
  ``old_logprobs`` is None.

Both end at the last assistant token (what follows it is never trained on). The reward is
the ``episode_end`` reward, -1 when there is none (unjudged or unfinished episode).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cuda_agent.agent.policies.hf_template import (
    end_marker,
    render_plain,
    render_prompt,
    template_messages,
    tool_dict,
)
from cuda_agent.agent.tool_specs import SPECS
from cuda_agent.agent.trajectory import Trajectory, read_trajectory, token_view
from cuda_agent.agent.types import Message, ToolSpec, message_from_dict

FAILED_REWARD = -1.0


class SampleError(ValueError):
    """A trajectory that cannot become a sample (no assistant turn, unstable template)."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One episode as a token sequence; ``loss_mask[i]`` is 1 where the policy wrote token i."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    old_logprobs: tuple[float, ...] | None
    """Per-token log-probs under the sampling policy (0.0 where mask is 0); None if unknown."""
    reward: float
    task: str
    source: str
    """How the ids were obtained: "tokens" (recorded TokenViews) or "template" (rendered)."""
    truncated: bool = False
    """True when the sequence was cut to ``max_len`` (the prefix is kept)."""
    first_model_token: int = 0
    """Index of the policy's first token in the uncut sequence (the prompt's length)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def samples_from_trajectory(trajectory: Trajectory | str | Path, tokenizer: Any,
                            max_len: int | None = None) -> Sample:
    """The training sample of one episode (see the module docstring for the two sources)."""
    traj = trajectory if isinstance(trajectory, Trajectory) else read_trajectory(Path(trajectory))
    task, reward = _task_and_reward(traj)
    built = _from_token_views(traj)
    if built is not None:
        ids, mask, logprobs = built
        source = "tokens"
    else:
        ids, mask = _from_template(_messages(traj), list(SPECS), tokenizer)
        logprobs = None
        source = "template"
    if 1 not in mask:
        raise SampleError(f"trajectory of {task!r} has no assistant tokens")
    first, last = mask.index(1), len(mask) - mask[::-1].index(1)
    ids, mask = ids[:last], mask[:last]
    logprobs = logprobs[:last] if logprobs is not None else None
    truncated = max_len is not None and len(ids) > max_len
    if truncated:
        ids, mask = ids[:max_len], mask[:max_len]
        logprobs = logprobs[:max_len] if logprobs is not None else None
    return Sample(tuple(ids), tuple(mask), tuple(logprobs) if logprobs is not None else None,
                  reward, task, source, truncated, first)


def _task_and_reward(traj: Trajectory) -> tuple[str, float]:
    task, reward = "", FAILED_REWARD
    for record in traj.records:
        if record.get("type") == "episode_start":
            task = str(record.get("task", ""))
        elif record.get("type") == "episode_end":
            result = record.get("result") or {}
            task = str(result.get("task", task))
            value = result.get("reward")
            reward = float(value) if value is not None else FAILED_REWARD
    return task, reward


def _messages(traj: Trajectory) -> list[Message]:
    return [message_from_dict(r["message"]) for r in traj.records if r.get("type") == "message"]


def _from_token_views(traj: Trajectory) -> tuple[list[int], list[int], list[float]] | None:
    """Concatenated recorded ids, or None when a step lacks them or the prefixes disagree."""
    steps = [r for r in traj.records if r.get("type") == "step"]
    views = list(token_view(traj))
    if not steps or len(views) != len(steps):
        return None
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for view in views:
        if list(view.prompt_ids[: len(ids)]) != ids:
            return None
        delta = list(view.prompt_ids[len(ids):])
        if len(view.loss_mask) != len(view.response_ids) or len(view.logprobs) != len(
                view.response_ids):
            return None
        ids += delta + list(view.response_ids)
        mask += [0] * len(delta) + [int(m) for m in view.loss_mask]
        logprobs += [0.0] * len(delta) + [float(lp) for lp in view.logprobs]
    return ids, mask, logprobs


def _render_closed(tokenizer: Any, messages: list[Message], tools: list[ToolSpec]) -> str:
    """The conversation rendered without an open assistant turn at the end."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            template_messages(messages), tools=[tool_dict(t) for t in tools] or None,
            add_generation_prompt=False, tokenize=False)
    text = render_plain(messages, tools, end_marker(tokenizer))
    return text.removesuffix("<|assistant|>\n")


def assistant_spans(messages: list[Message], tools: list[ToolSpec], tokenizer: Any
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans the assistant wrote."""
    text = _render_closed(tokenizer, messages, tools)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message.role != "assistant":
            continue
        before = render_prompt(tokenizer, messages[:i], tools)
        after = _render_closed(tokenizer, messages[: i + 1], tools)
        if not after.startswith(before) or not text.startswith(after):
            raise SampleError(f"the chat template does not render message {i} as an extension "
                              "of the conversation before it (a template that rewrites earlier "
                              "turns); cannot locate the assistant's tokens")
        spans.append((len(before), max(len(before), len(after.rstrip("\n")))))
    return text, spans


def _from_template(messages: list[Message], tools: list[ToolSpec], tokenizer: Any
                   ) -> tuple[list[int], list[int]]:
    text, spans = assistant_spans(messages, tools, tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in spans:
        for piece, flag in ((text[cursor:start], 0), (text[start:end], 1)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                mask += [flag] * len(piece_ids)
        cursor = end
    return ids, mask
