from pathlib import Path

from cuda_agent.agent.compaction import (
    SUMMARY_HEADER,
    CompactionConfig,
    clip,
    compact,
    estimate_tokens,
)
from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.tools import ToolsConfig
from cuda_agent.agent.types import Message
from tests.agent.conftest import ScriptedPolicy, act, call


def test_clip_keeps_head_and_tail():
    text = "".join(f"{i:05d}\n" for i in range(2000))
    cut = clip(text, 600)
    assert cut.startswith("00000\n") and cut.endswith("01999\n")
    assert f"[... {len(text) - 600} characters cut ...]" in cut
    assert clip("short", 600) == "short"


def _history(turns: int, output_chars: int) -> list[Message]:
    messages = [Message("system", "SYSTEM " * 50), Message("user", "the task")]
    for i in range(turns):
        build = call("build") if i % 3 == 0 else call("write_file", {"path": f"kernels/k{i}.cpp",
                                                                     "content": "x" * 500})
        messages.append(act(build, text=f"step {i}"))
        out = (f"build FAILED in 1.0 s: 1 compiled, 0 cached\nkernels/k.cpp:{i}:3: error: "
               f"boom {i}" if build.name == "build" else f"created kernels/k{i}.cpp")
        messages.append(Message("tool", out + "\n" + "y" * output_chars,
                                tool_call_id=build.id, name=build.name))
    return messages


def test_small_history_only_clips_tool_outputs():
    messages = _history(2, 5000)
    shown = compact(messages, 100_000, CompactionConfig(max_tool_output_chars=1000))
    assert [m.role for m in shown] == [m.role for m in messages]
    assert all(len(m.content) < 1100 for m in shown if m.role == "tool")
    assert shown[2] == messages[2]


def test_old_turns_become_one_summary():
    messages = _history(40, 3000)
    config = CompactionConfig(max_tool_output_chars=1000, keep_last_turns=3)
    shown = compact(messages, 4000, config)
    assert shown[:2] == messages[:2]
    summary = shown[2]
    assert summary.role == "user" and summary.content.startswith(SUMMARY_HEADER)
    assert "build() -> build FAILED" in summary.content
    assert "write_file(path=kernels/k1.cpp, content=<500 chars>) -> created" in summary.content
    assert shown[3:][0].role == "assistant" and shown[-1].tool_call_id == messages[-1].tool_call_id
    assert estimate_tokens(shown) <= 0.75 * 4000
    assert compact(messages, 4000, config) == shown  # deterministic


def test_custom_token_counter_is_used():
    messages = _history(10, 100)
    calls = []

    def count(ms):
        calls.append(len(ms))
        return 10 * len(ms)

    shown = compact(messages, 100, CompactionConfig(keep_last_turns=2), count)
    assert calls and len(shown) == 2 + 1 + 2 * 2  # head, summary, two kept turns


def test_long_episode_stays_within_budget(workspace: Path, gelu_task, tmp_path: Path):
    budget = 8000
    big_echo = call("shell", {"command": "yes 'echo line of output' | head -c 30000"})
    replies = [act(call("shell", {"command": "yes 'line' | head -n 5000 > big.txt"}))]
    for turn in range(2, 150):
        if turn % 10 == 0:
            replies.append(act(big_echo))
        else:
            replies.append(act(call("read_file", {"path": "big.txt", "offset": turn}),
                               text=f"reading more, turn {turn}"))
    replies.append(act(call("submit")))
    policy = ScriptedPolicy(replies)
    config = AgentConfig(max_turns=200, max_tokens=budget, final_judge=False,
                         tools=ToolsConfig(output_cap_chars=20_000),
                         compaction={"max_tool_output_chars": 2000, "keep_last_turns": 3,
                                     "summary_max_chars": 3000})
    result = run_episode(gelu_task, workspace, policy, config, tmp_path / "long.jsonl")
    assert result.stop_reason == "done" and result.turns == 150, result.error
    sizes = [estimate_tokens(seen) for seen in policy.seen]
    assert max(sizes) <= 0.75 * budget
    last = policy.seen[-1]
    assert last[0].role == "system" and last[1].content == policy.seen[0][1].content
    assert last[2].content.startswith(SUMMARY_HEADER)
    assert "shell(command=yes 'echo line of output' | head -c 30000) -> exit code 0" in \
        last[2].content and "earlier actions omitted" in last[2].content
