import re
from pathlib import Path

import pytest

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.tools import ToolsConfig
from cuda_agent.agent.trajectory import read_trajectory
from cuda_agent.agent.types import Message, PolicyError, PolicyStep, TokenView, Usage
from cuda_agent.tasks.loaders import builtin_dir
from tests.agent.conftest import ScriptedPolicy, act, call, say

FAST_JUDGE = {"trials": 2, "scales": [], "time": False}
SOLUTION = builtin_dir() / "gelu_bias_scale" / "solution" / "cpu"
GOOD_LINE = "const float half_scale = 0.5f * scale;"


def fast_config(**fields) -> AgentConfig:
    return AgentConfig(tools=ToolsConfig(judge=FAST_JUDGE), judge=FAST_JUDGE,
                       **{"final_judge": False, **fields})


def records(path: Path, kind: str) -> list[dict]:
    return [r for r in read_trajectory(path).records if r["type"] == kind]


@pytest.mark.slow
def test_solves_gelu_bias_scale_end_to_end(workspace: Path, gelu_task, tmp_path: Path):
    kernel = (SOLUTION / "kernels" / "gelu_bias_scale.cpp").read_text()
    assert GOOD_LINE in kernel
    broken = kernel.replace(GOOD_LINE, GOOD_LINE[:-1])  # a missing semicolon
    binding = (SOLUTION / "kernels" / "gelu_bias_scale_binding.cpp").read_text()
    model_new = (SOLUTION / "model_new.py").read_text()
    seen: dict[str, str] = {}

    def fix_after_reading_error(messages: list[Message]) -> Message:
        seen["build"] = messages[-1].content
        return act(call("edit_file", {"path": "kernels/gelu_bias_scale.cpp",
                                      "old": GOOD_LINE[:-1], "new": GOOD_LINE}))

    def submit_after_verify(messages: list[Message]) -> Message:
        seen["verify"] = messages[-1].content
        return act(call("submit", {"message": "fused bias + gelu + scale"}))

    policy = ScriptedPolicy([
        act(call("read_file", {"path": "model.py"}), text="Let me look at the task."),
        act(call("write_file", {"path": "kernels/gelu_bias_scale.cpp", "content": broken}),
            call("write_file", {"path": "kernels/gelu_bias_scale_binding.cpp",
                                "content": binding}),
            call("write_file", {"path": "model_new.py", "content": model_new})),
        act(call("build")),
        fix_after_reading_error,
        act(call("build")),
        act(call("verify")),
        submit_after_verify,
    ], usage=Usage(prompt_tokens=1000, completion_tokens=50))
    traj = tmp_path / "ep.jsonl"
    events: list[str] = []
    result = run_episode(gelu_task, workspace, policy, fast_config(final_judge=True), traj,
                         on_event=lambda kind, payload: events.append(kind))

    assert result.stop_reason == "done" and result.error is None, result.error
    assert result.turns == 7 and result.prompt_tokens == 7000
    assert result.reward is not None and result.reward >= 1
    assert result.final is not None and result.final["correct"]
    assert seen["build"].startswith("build FAILED")
    assert re.search(r"gelu_bias_scale\.cpp:\d+:\d+: error", seen["build"]), seen["build"]
    assert seen["verify"].startswith("reward 1") and "NOT correct" not in seen["verify"]
    # the system prompt is SKILL.md + the reference; the task is stated by a user message
    system, task = policy.seen[0][:2]
    assert system.role == "system" and "## Rules" in system.content
    assert gelu_task.code.strip() in system.content
    assert task.role == "user" and "gelu_bias_scale" in task.content
    assert {"turn", "tool_call", "tool_result", "judge", "end"} <= set(events)

    kinds = [r["type"] for r in read_trajectory(traj).records]
    assert kinds[0] == "episode_start" and kinds[-1] == "episode_end"
    assert kinds.count("step") == 7 and kinds.count("tool_result") == 9
    judged = [(r["source"], r["result"].get("ok", r["result"].get("correct")))
              for r in records(traj, "judge")]
    assert judged == [("build", False), ("build", True), ("verify", True), ("final", True)]
    messages = [r["message"] for r in records(traj, "message")]
    assert [m["role"] for m in messages[:4]] == ["system", "user", "assistant", "tool"]
    assert records(traj, "episode_end")[0]["result"]["reward"] == result.reward


def test_bad_calls_come_back_as_errors_and_the_loop_goes_on(workspace: Path, gelu_task):
    policy = ScriptedPolicy([
        act(call("read_file", {})),
        act(call("read_file", {"path": 7})),
        act(call("launch_rockets", {"count": 3})),
        act(call("write_file", None, raw='{"path": "kernels/x.cpp", "content": "int')),
        act(call("write_file", {"path": "../escape.cpp", "content": "x"})),
        act(call("write_file", {"path": "model.py", "content": "x"})),
        act(call("submit")),
    ])
    result = run_episode(gelu_task, workspace, policy, fast_config())
    assert result.stop_reason == "done" and result.turns == 7
    outputs = [seen[-1].content for seen in policy.seen[1:]]
    for output, expected in zip(outputs, ["missing required argument(s) path",
                                          "must be a string", "unknown tool 'launch_rockets'",
                                          "not a valid JSON object", "'..' is not allowed",
                                          "fixed file"], strict=True):
        assert expected in output


def test_no_tool_call_is_nudged_once_then_done(workspace: Path, gelu_task):
    policy = ScriptedPolicy([say("thinking"), say("I am done")])
    result = run_episode(gelu_task, workspace, policy, fast_config())
    assert result.stop_reason == "done" and result.turns == 2
    assert policy.seen[1][-1].role == "user" and "submit" in policy.seen[1][-1].content


def test_turn_limit(workspace: Path, gelu_task, tmp_path: Path):
    policy = ScriptedPolicy([act(call("glob", {"pattern": "*"}))] * 10)
    result = run_episode(gelu_task, workspace, policy, fast_config(max_turns=3),
                         tmp_path / "t.jsonl")
    assert result.stop_reason == "turn_limit" and result.turns == 3
    assert read_trajectory(tmp_path / "t.jsonl").complete


def test_token_limits(workspace: Path, gelu_task):
    glob = act(call("glob", {"pattern": "*"}))
    context = ScriptedPolicy([glob] * 5, usage=Usage(prompt_tokens=9000, completion_tokens=500))
    result = run_episode(gelu_task, workspace, context, fast_config(max_tokens=9400))
    assert result.stop_reason == "token_limit" and result.turns == 1
    total = ScriptedPolicy([glob] * 10, usage=Usage(prompt_tokens=4000, completion_tokens=100))
    result = run_episode(gelu_task, workspace, total,
                         fast_config(max_tokens=50_000, max_total_tokens=10_000))
    assert result.stop_reason == "token_limit" and result.turns == 3
    assert result.prompt_tokens == 12_000 and result.completion_tokens == 300


def test_policy_error_ends_the_episode_with_a_complete_trajectory(workspace: Path, gelu_task,
                                                                  tmp_path: Path):
    tokens = TokenView(prompt_ids=(1, 2, 3), response_ids=(4, 5), logprobs=(-0.1, -0.2),
                       loss_mask=(1, 1))
    policy = ScriptedPolicy([PolicyStep(act(call("glob", {"pattern": "*.py"})), tokens=tokens),
                             PolicyError("server unreachable after 3 retries")])
    traj = tmp_path / "err.jsonl"
    result = run_episode(gelu_task, workspace, policy, fast_config(), traj)
    assert result.stop_reason == "error" and "server unreachable" in (result.error or "")
    loaded = read_trajectory(traj)
    assert loaded.complete and loaded.truncated_line is None
    end = records(traj, "episode_end")[0]["result"]
    assert end["stop_reason"] == "error" and end["turns"] == 2
    assert records(traj, "step")[0]["tokens"]["response_ids"] == [4, 5]


def test_unexpected_exception_is_an_error_too(workspace: Path, gelu_task, tmp_path: Path):
    def boom(messages):
        raise KeyError("surprise")

    result = run_episode(gelu_task, workspace, ScriptedPolicy([boom]), fast_config(),
                         tmp_path / "e.jsonl")
    assert result.stop_reason == "error" and "KeyError" in (result.error or "")
    assert read_trajectory(tmp_path / "e.jsonl").complete
