"""Samples: rendered conversations with the loss mask on exactly the assistant's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.agent.policies.hf_template import call_block
from cuda_agent.agent.trajectory import Recorder, read_trajectory
from cuda_agent.agent.types import EpisodeResult, Message, PolicyStep, TokenView
from cuda_agent.train.samples import SampleError, samples_from_trajectory
from tests.train.conftest import SHORT_REPLAY


def runs(ids: tuple[int, ...], mask: tuple[int, ...], flag: int) -> list[list[int]]:
    """The maximal runs of ``ids`` where ``mask == flag``."""
    out: list[list[int]] = []
    for i, (tok, m) in enumerate(zip(ids, mask, strict=True)):
        if m == flag:
            if i == 0 or mask[i - 1] != flag:
                out.append([])
            out[-1].append(tok)
    return out


def assistant_messages(path: Path) -> list[dict[str, Any]]:
    return [r["message"] for r in read_trajectory(path).records
            if r["type"] == "message" and r["message"]["role"] == "assistant"]


def test_real_episode_plain_template(episode_trajectory: Path, tiny_tokenizer: Any) -> None:
    sample = samples_from_trajectory(episode_trajectory, tiny_tokenizer)
    assert sample.source == "template" and sample.old_logprobs is None
    assert sample.task == "gelu_bias_scale" and sample.reward == -1.0  # not judged
    assert not sample.truncated and len(sample.input_ids) == len(sample.loss_mask)
    eos = tiny_tokenizer.eos_token
    # the replay's two turns, then the replay's own closing submit
    texts = [tiny_tokenizer.decode(run) for run in runs(sample.input_ids, sample.loss_mask, 1)]
    messages = assistant_messages(episode_trajectory)
    assert len(texts) == len(messages) == 3
    for text, message in zip(texts, messages, strict=True):
        blocks = [call_block(c["name"], c["arguments"]) for c in message["tool_calls"]]
        body = "\n".join(([message["content"]] if message["content"] else []) + blocks)
        assert text == f"{body}\n{eos}"
    for given in SHORT_REPLAY:
        assert any(text.startswith(given["content"]) for text in texts)
    # everything else is masked: system prompt, task, tool outputs, role headers
    context = "".join(tiny_tokenizer.decode(r) for r in runs(sample.input_ids,
                                                             sample.loss_mask, 0))
    assert context.startswith("<|system|>\n") and "# Tools" in context
    assert "class Model" in context  # the read_file output of model.py
    assert context.count("<|assistant|>\n") == 3 and "<|tool|>\n" in context
    # the sample ends with the last assistant token
    assert sample.loss_mask[-1] == 1


def test_chat_template_with_tools(episode_trajectory: Path, chat_tokenizer: Any) -> None:
    sample = samples_from_trajectory(episode_trajectory, chat_tokenizer)
    full = chat_tokenizer.decode(sample.input_ids)
    assert full.startswith("TOOLS: shell read_file write_file")
    texts = [chat_tokenizer.decode(r) for r in runs(sample.input_ids, sample.loss_mask, 1)]
    assert texts[0] == ('I will read the reference first.<tool_call>{"name": "read_file", '
                        '"arguments": {"path": "model.py"}}</tool_call><|endoftext|>')
    assert all("[assistant]" not in t and "[tool]" not in t for t in texts)


def test_truncation_keeps_prefix(episode_trajectory: Path, tiny_tokenizer: Any) -> None:
    full = samples_from_trajectory(episode_trajectory, tiny_tokenizer)
    cut = samples_from_trajectory(episode_trajectory, tiny_tokenizer, max_len=50)
    assert cut.truncated and len(cut.input_ids) == 50
    assert cut.input_ids == full.input_ids[:50] and cut.loss_mask == full.loss_mask[:50]
    same = samples_from_trajectory(episode_trajectory, tiny_tokenizer, max_len=10**6)
    assert same == full and not same.truncated


def write_token_trajectory(path: Path, views: list[TokenView], reward: int | None) -> Path:
    with Recorder(path) as rec:
        rec.episode_start("toy", "hf:x", {})
        rec.message(Message("user", "hi"))
        for turn, view in enumerate(views, start=1):
            step = PolicyStep(Message("assistant", f"turn {turn}"), tokens=view)
            rec.message(step.message)
            rec.step(turn, step, 0.1)
        rec.episode_end(EpisodeResult("toy", "hf:x", "done", len(views), 0, 0, 1.0, reward,
                                      None))
    return path


def test_recorded_token_views_are_concatenated(tmp_path: Path, tiny_tokenizer: Any) -> None:
    views = [TokenView((1, 2, 3), (10, 11), (-0.5, -0.25), (1, 1)),
             TokenView((1, 2, 3, 10, 11, 4, 5), (12,), (-1.0,), (1,))]
    sample = samples_from_trajectory(write_token_trajectory(tmp_path / "t.jsonl", views, 2),
                                     tiny_tokenizer)
    assert sample.source == "tokens" and sample.reward == 2.0
    assert sample.input_ids == (1, 2, 3, 10, 11, 4, 5, 12)
    assert sample.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert sample.old_logprobs == (0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0)
    cut = samples_from_trajectory(tmp_path / "t.jsonl", tiny_tokenizer, max_len=4)
    assert cut.truncated and cut.old_logprobs == (0.0, 0.0, 0.0, -0.5)


def test_inconsistent_token_views_fall_back_to_template(tmp_path: Path,
                                                        tiny_tokenizer: Any) -> None:
    # the second prompt does not extend the first (e.g. compaction): render instead
    views = [TokenView((1, 2, 3), (10,), (-0.5,), (1,)), TokenView((1, 9), (12,), (-1.0,), (1,))]
    sample = samples_from_trajectory(write_token_trajectory(tmp_path / "t.jsonl", views, None),
                                     tiny_tokenizer)
    assert sample.source == "template" and sample.old_logprobs is None
    assert sample.reward == -1.0  # unjudged
    texts = [tiny_tokenizer.decode(r) for r in runs(sample.input_ids, sample.loss_mask, 1)]
    assert texts == ["turn 1\n<|endoftext|>", "turn 2\n<|endoftext|>"]


def test_no_assistant_turn_is_an_error(tmp_path: Path, tiny_tokenizer: Any) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"type": "episode_start", "task": "x"}) + "\n")
    with pytest.raises(SampleError, match="no assistant tokens"):
        samples_from_trajectory(path, tiny_tokenizer)
