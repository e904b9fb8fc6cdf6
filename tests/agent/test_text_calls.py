"""Tool calls written as text (a server without a tool-call parser): read in the forms open
models write them, said in the trajectory, and an unreadable one ends the episode with the
cause. The episodes run against a real chat-completions server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.text_calls import read_text_calls
from cuda_agent.agent.trajectory import read_trajectory
from cuda_agent.agent.trajectory_view import render
from cuda_agent.agent.types import Message, ToolCall
from tests.agent.test_policies import ScriptedServer, completion, openai_policy

GLOB = {"name": "glob", "arguments": {"pattern": "kernels/*"}}
READ = {"name": "read_file", "arguments": {"path": "model.py"}}
SUBMIT = {"name": "submit", "arguments": {"message": "done"}}


def said(text: str) -> Message:
    return Message("assistant", text)


@pytest.fixture
def server():
    servers: list[ScriptedServer] = []

    def start(*replies: str) -> ScriptedServer:
        servers.append(ScriptedServer([(200, completion(text)) for text in replies]))
        return servers[-1]

    yield start
    for each in servers:
        each.close()


@pytest.mark.parametrize(("text", "form", "content"), [
    (f"Looking.\n<tool_call>\n{json.dumps(GLOB)}\n</tool_call>", "tagged", "Looking."),
    (json.dumps(GLOB), "json", ""),
    (json.dumps([GLOB]), "json", ""),
    (json.dumps({"type": "function", "function": {**GLOB, "arguments": json.dumps(
        GLOB["arguments"])}}), "json", ""),
    (json.dumps({"name": "glob", "parameters": GLOB["arguments"]}), "json", ""),
    (f"Looking.\n```json\n{json.dumps(GLOB, indent=1)}\n```\nThen more.", "fenced",
     "Looking.\n\nThen more."),
])
def test_forms(text: str, form: str, content: str):
    read = read_text_calls(said(text), "text-1")
    assert read is not None and read.form == form and read.problem is None
    assert read.message.content == content
    assert read.message.tool_calls == (ToolCall("text-1-0", "glob", {"pattern": "kernels/*"}),)


@pytest.mark.parametrize("text", [
    "The kernel is done; I will check it next.",
    'A dict such as {"a": 1} in prose.',
    "```json\n{\"pattern\": \"kernels/*\"}\n```",  # JSON, but no call in it
])
def test_prose_is_not_a_call(text: str):
    assert read_text_calls(said(text), "t") is None
    assert read_text_calls(Message("assistant", text, (ToolCall("c", "glob", {}),)), "t") is None


@pytest.mark.parametrize(("text", "what"), [
    ('<tool_call>{"name": "glob", "arguments": {"pattern": </tool_call>', "<tool_call> block"),
    ("<tool_call>glob kernels/*</tool_call>", "<tool_call> block"),
    ("<function=glob><parameter=pattern>kernels/*</parameter></function>", "<function="),
    ('{"name": "glob", "arguments": {"pattern": "kernels/*"}', "does not decode"),
    ('Calling it:\n```json\n{"name": "glob", "arguments": {pattern}}\n```', "does not decode"),
])
def test_unreadable_calls_name_the_cause(text: str, what: str):
    read = read_text_calls(said(text), "t")
    assert read is not None and read.form == "unreadable" and not read.message.tool_calls
    assert what in read.problem and "--tool-call-parser" in read.problem


def test_a_named_tagged_call_with_bad_arguments_goes_to_the_tools():
    read = read_text_calls(said('<tool_call>{"name": "glob", "arguments": "*"}</tool_call>'),
                           "t")
    assert read.form == "tagged" and read.problem is None
    assert read.message.tool_calls[0].name == "glob"
    assert read.message.tool_calls[0].arguments is None


def test_episode_reads_text_calls_from_a_server(workspace: Path, gelu_task, tmp_path: Path,
                                                server):
    served = server(f"Looking.\n<tool_call>\n{json.dumps(GLOB)}\n</tool_call>",
                    f"Reading it:\n```json\n{json.dumps(READ)}\n```",
                    json.dumps(SUBMIT))
    traj = tmp_path / "text.jsonl"
    result = run_episode(gelu_task, workspace, openai_policy(served),
                         AgentConfig(final_judge=False), traj)
    assert result.stop_reason == "done" and result.error is None and result.turns == 3
    records = read_trajectory(traj).records
    steps = [r["tool_calls_from_text"] for r in records if r["type"] == "step"]
    assert [(s["form"], s["calls"], s["problem"]) for s in steps] == [
        ("tagged", 1, None), ("fenced", 1, None), ("json", 1, None)]
    assert steps[0]["content"].startswith("Looking.\n<tool_call>")
    assert "1 tool call(s) read from the text (fenced)" in render(records)
    results = [r for r in records if r["type"] == "tool_result"]
    assert [(r["name"], r["ok"]) for r in results] == [("glob", True), ("read_file", True),
                                                       ("submit", True)]
    assert "gelu" in results[1]["output"].lower()
    # the calls go back to the server as structured calls, answered by tool messages
    second = served.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "glob"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "text-1-0"


def test_unreadable_text_call_ends_the_episode_with_the_cause(workspace: Path, gelu_task,
                                                              tmp_path: Path, server):
    served = server('<tool_call>{"name": "glob", "arguments": {"pattern": </tool_call>',
                    "unused")
    traj = tmp_path / "bad.jsonl"
    result = run_episode(gelu_task, workspace, openai_policy(served),
                         AgentConfig(final_judge=False), traj)
    assert result.stop_reason == "error" and result.turns == 1
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)  # the step counts
    assert "cannot read" in result.error and "--tool-call-parser" in result.error
    [step] = [r for r in read_trajectory(traj).records if r["type"] == "step"]
    assert step["tool_calls_from_text"]["form"] == "unreadable"
    assert len(served.requests) == 1
