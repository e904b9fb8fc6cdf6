"""``cuda-agent mcp``: a real server subprocess driven over stdio by the SDK's client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cuda_agent import __version__
from cuda_agent.agent.mcp_server import FileAccessError, McpConfig, WorkspaceTools
from cuda_agent.judge import JudgeConfig
from cuda_agent.tasks import load_task
from cuda_agent.tasks.loaders import builtin_dir
from cuda_agent.workspace import init_workspace

SOLUTION = builtin_dir() / "gelu_bias_scale" / "solution" / "cpu"
FAST = ("--set", "trials=2", "--set", "scales=[0.5]", "--set", "time=false",
        "--set", "time_compile=false", "--set", "time_budget_s=0.3", "--set", "min_runs=3")
TOOLS = {"workspace_info", "read_file", "write_file", "delete_file", "build", "verify", "profile",
         "judge"}
BROKEN = "#include <cstdint>\nextern \"C\" void f(int64_t n) {\n  int x = ;\n}\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return init_workspace(load_task("builtin:gelu_bias_scale"), tmp_path / "ws", "cpu")


def _solution() -> dict[str, str]:
    files = {"model_new.py": (SOLUTION / "model_new.py").read_text()}
    for path in sorted((SOLUTION / "kernels").iterdir()):
        files[f"kernels/{path.name}"] = path.read_text()
    return files


async def _call(session: ClientSession, name: str, **arguments: Any) -> Any:
    return await session.call_tool(name, arguments, read_timeout_seconds=300)


def _error_text(result: Any) -> str:
    assert result.is_error, result
    return result.content[0].text


async def _drive(workspace: Path, log: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cuda_agent", "mcp", str(workspace), *FAST],
        env={**os.environ, "CUDA_AGENT_HOME": os.environ["CUDA_AGENT_HOME"]})
    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            started = await session.initialize()
            assert started.server_info.version == __version__ and __version__
            listed = (await session.list_tools()).tools
            assert {t.name for t in listed} == TOOLS
            outputs = {t.name: t.output_schema for t in listed}
            assert all(s and s["type"] == "object" and s["properties"] for s in outputs.values())
            assert {"trials", "scales", "checked_calls", "correct"} <= set(
                outputs["verify"]["properties"])
            assert "line" in str(outputs["build"]) and "reward" in outputs["judge"]["properties"]
            schemas = {t.name: t.input_schema for t in listed}
            assert set(schemas["write_file"]["required"]) == {"path", "content"}
            assert schemas["read_file"]["properties"]["path"]["type"] == "string"

            info = await _call(session, "workspace_info")
            assert info.structured_content["device"] == "cpu"
            assert info.structured_content["task"] == "gelu_bias_scale"
            assert "model_new.py" in info.structured_content["editable"]
            assert "SKILL" in info.structured_content["skill"]

            for path in ("../escape.py", "/etc/passwd", "kernels/../model.py"):
                text = _error_text(await _call(session, "write_file", path=path, content="x"))
                assert "refused" in text, text
            for path in ("model.py", "binding.cpp", "utils/build", ".cuda-agent/workspace.json"):
                text = _error_text(await _call(session, "write_file", path=path, content="x"))
                assert "fixed file" in text and "cannot be written" in text, text
            assert (workspace / "model.py").read_text() != "x"

            await _call(session, "write_file", path="kernels/gelu_bias_scale.cpp", content=BROKEN)
            broken = await _call(session, "build")
            assert not broken.is_error and broken.structured_content["ok"] is False
            error = broken.structured_content["errors"][0]
            assert error["file"].endswith("gelu_bias_scale.cpp") and error["line"] == 3
            assert "gelu_bias_scale.cpp:3" in broken.content[0].text

            for path, text in _solution().items():
                wrote = await _call(session, "write_file", path=path, content=text)
                assert not wrote.is_error, wrote
            back = await _call(session, "read_file", path="model_new.py")
            assert back.structured_content["text"] == _solution()["model_new.py"]

            built = await _call(session, "build")
            assert built.structured_content["ok"] is True, built.content[0].text
            verified = await _call(session, "verify")
            assert verified.structured_content["correct"] is True, verified.content[0].text
            # --set trials=2 is what verify reports; every call compared is counted apart
            checked = verified.structured_content
            assert (checked["trials"], checked["scales"], checked["checked_calls"]) == (
                2, [0.5], 3), checked
            assert "on 3 calls: trials=2 at scale 1, scales 0.5" in verified.content[0].text
            profiled = await _call(session, "profile")
            assert not profiled.is_error, profiled.content[0].text
            assert profiled.structured_content["runtime_ms"] > 0
            await _call(session, "write_file", path="kernels/scratch.h", content="// x\n")
            deleted = await _call(session, "delete_file", path="kernels/scratch.h")
            assert deleted.structured_content == {"path": "kernels/scratch.h", "deleted": True}
            judged = await _call(session, "judge")
            assert judged.structured_content["reward"] >= 1, judged.content[0].text
            assert judged.structured_content["task"] == "gelu_bias_scale"


@pytest.mark.slow
def test_mcp_server_over_stdio(workspace: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    try:
        asyncio.run(asyncio.wait_for(_drive(workspace, log), timeout=240))
    except BaseException:
        print(log.read_text() if log.exists() else "(no server log)")
        raise


def test_bad_workspace_exits_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cuda_agent", "mcp", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "not a cuda-agent workspace" in done.stderr


def test_file_policy(workspace: Path, tmp_path: Path) -> None:
    tools = WorkspaceTools(workspace, McpConfig(judge=JudgeConfig(trials=1), max_file_bytes=1000))
    outside = tmp_path / "outside.cpp"
    outside.write_text("// outside\n")
    (workspace / "kernels" / "link.cpp").symlink_to(outside)
    with pytest.raises(FileAccessError, match="symbolic links are refused"):
        tools.write_file("kernels/link.cpp", "x")
    with pytest.raises(FileAccessError, match="symbolic links are refused"):
        tools.read_file("kernels/link.cpp")
    assert outside.read_text() == "// outside\n"
    with pytest.raises(FileAccessError, match="not an editable file"):
        tools.write_file("notes.txt", "x")
    with pytest.raises(FileAccessError, match="byte limit"):
        tools.write_file("kernels/big.cpp", "x" * 1001)
    with pytest.raises(FileAccessError, match="cannot be read"):
        tools.read_file(".cuda-agent/workspace.json")
    assert tools.read_file("./model.py").data["path"] == "model.py"
    reply = tools.write_file("kernels/sub/extra.h", "// header\n")
    assert reply.data == {"path": "kernels/sub/extra.h", "bytes": 10}
    assert "kernels/sub/extra.h" in tools.workspace_info().data["editable"]
    tools.delete_file("kernels/sub/extra.h")
    assert not (workspace / "kernels" / "sub" / "extra.h").exists()
    with pytest.raises(FileAccessError, match="cannot be deleted"):
        tools.delete_file("model_new.py")
    with pytest.raises(FileAccessError, match="cannot be written"):
        tools.delete_file("model.py")


def test_verify_and_profile_are_quick_and_judge_is_steady(workspace: Path) -> None:
    """verify and profile time the candidate in one process; judge keeps the settings."""
    tools = WorkspaceTools(workspace, McpConfig(judge=JudgeConfig(trials=1)))
    assert tools.judge_config(time=True).candidate_processes == 1
    final = tools.judge_config(time=True, final=True)
    assert final.candidate_processes is None and final.candidate_processes_for("cuda") == 8
    assert final.trials == 1 and final.device == tools.info.device
    told = WorkspaceTools(workspace, McpConfig(judge=JudgeConfig(candidate_processes=2)))
    assert told.judge_config(time=True).candidate_processes == 2
