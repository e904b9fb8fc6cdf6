"""An MCP server over one workspace, so any Model Context Protocol client can drive it.

    cuda-agent mcp path/to/ws --set trials=2

Tools: ``workspace_info``; ``read_file``, ``write_file`` and ``delete_file`` (model_new.py and
kernels/* only); ``build``, ``verify``, ``profile`` and ``judge``. Each returns a JSON object
as structured content (its schema advertised: ``mcp_schemas``) plus a short text summary.
Build and judge work runs in a worker thread, one at a time per workspace, so the protocol
loop keeps answering while it runs.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from cuda_agent import __version__
from cuda_agent.agent import mcp_schemas as out
from cuda_agent.build import Builder
from cuda_agent.execution.warm_judge import WarmJudge, WarmJudgeError
from cuda_agent.judge import Candidate, CandidateError, Judge, JudgeConfig
from cuda_agent.judge.config import in_episode
from cuda_agent.judge.judge import JudgeError
from cuda_agent.results import BuildResult, JudgeResult, to_dict
from cuda_agent.workspace import read_workspace
from cuda_agent.workspace.init import META_DIR

EDITABLE = "model_new.py and kernels/<file>"
FIXED = ("model.py", "binding.cpp", "binding_registry.h", "utils", META_DIR, "SKILL.md", "build")
READABLE = ("SKILL.md", "model.py", "binding.cpp", "binding_registry.h")
"""Fixed files an agent may read (never write): the playbook, the reference, the bindings."""
SUMMARY_KEYS = ("task", "device", "precision", "compiled", "correct", "reward", "reasons",
                "runtime_ms", "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile")


class McpConfig(BaseModel):
    """The MCP server: how its tools judge and what its file tools accept."""

    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="Judge settings for verify, profile and judge "
        "(and build, through judge.build); the device always comes from the workspace.")
    max_file_bytes: int = Field(1_000_000, gt=0, description="Largest file read or written.")
    name: str = Field("cuda-agent", description="Server name announced to clients.")


class FileAccessError(ValueError):
    """A path the file tools refuse: outside the workspace, fixed, or a symbolic link."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """What one tool call returns: a short text for the model and the JSON-ready record."""

    summary: str
    data: dict[str, Any]


class WorkspaceTools:
    """The tools' work on one workspace, without any protocol: plain calls returning Reply."""

    def __init__(self, workspace: Path, config: McpConfig | None = None):
        self.config = config or McpConfig()
        self.info = read_workspace(workspace)
        self.root = self.info.root
        self._lock = threading.Lock()
        self._warm: WarmJudge | None = None

    def workspace_info(self) -> Reply:
        skill = self.root / "SKILL.md"
        data = {"task": self.info.task.name, "device": self.info.device,
                "precision": self.info.task.precision.value, "root": str(self.root),
                "editable": self._editable_files(), "editable_rule": EDITABLE,
                "readable": [n for n in READABLE if (self.root / n).is_file()],
                "skill": skill.read_text() if skill.is_file() else ""}
        return Reply(f"task {data['task']} on {data['device']}; editable: "
                     f"{', '.join(data['editable']) or '(none yet)'}; SKILL.md follows\n\n"
                     f"{data['skill']}", data)

    def read_file(self, path: str) -> Reply:
        target = self._resolve(path, write=False)
        if not target.is_file():
            raise FileAccessError(f"{path}: no such file in the workspace")
        size = target.stat().st_size
        if size > self.config.max_file_bytes:
            raise FileAccessError(f"{path}: {size} bytes, over the {self.config.max_file_bytes} "
                                  "byte limit")
        text = target.read_text(errors="replace")
        return Reply(text, {"path": _rel(path), "text": text, "bytes": size})

    def write_file(self, path: str, content: str) -> Reply:
        target = self._resolve(path, write=True)
        raw = content.encode()
        if len(raw) > self.config.max_file_bytes:
            raise FileAccessError(f"{path}: {len(raw)} bytes, over the "
                                  f"{self.config.max_file_bytes} byte limit")
        with self._lock:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            tmp.write_bytes(raw)
            tmp.replace(target)
        return Reply(f"wrote {_rel(path)} ({len(raw)} bytes)",
                     {"path": _rel(path), "bytes": len(raw)})

    def delete_file(self, path: str) -> Reply:
        target = self._resolve(path, write=True)
        if _rel(path) == "model_new.py":
            raise FileAccessError("model_new.py cannot be deleted; rewrite it with write_file")
        if not target.is_file():
            raise FileAccessError(f"{path}: no such file in the workspace")
        with self._lock:
            target.unlink()
        return Reply(f"deleted {_rel(path)}", {"path": _rel(path), "deleted": True})

    def build(self) -> Reply:
        config = self.config.judge.build.model_copy(update={"device": self.info.device})
        with self._lock:
            result = Builder(config).build(self.root, publish=True)
        return Reply(_build_text(result), _build_data(result))

    def verify(self) -> Reply:
        result = self._judge(time=False, profile=False)
        config = self.judge_config(time=False)
        data = {k: v for k, v in _summary(result).items() if "_ms" not in k and "speedup" not in k}
        # the settings' trials (at scale 1) apart from every call compared, scaled ones too
        data.update(trials=config.trials, scales=list(config.scales), checked_calls=None)
        if result.correctness is not None:
            data.update(checked_calls=result.correctness.checked_calls,
                        max_abs_error=result.correctness.max_abs_error,
                        max_rel_error=result.correctness.max_rel_error)
        data["flags"] = list(result.flags)
        if result.build is not None and not result.build.ok:
            data["build"] = _build_data(result.build)
        verdict = "correct" if result.correct else "NOT correct"
        checked = "" if data["checked_calls"] is None else (
            f" on {data['checked_calls']} calls: trials={config.trials} at scale 1"
            + (f", scales {', '.join(f'{s:g}' for s in config.scales)}" if config.scales
               else ""))
        return Reply(_with_reasons(f"verify: {verdict}{checked} (reward {result.reward} "
                                   "without timing)", result), data)

    def profile(self) -> Reply:
        result = self._judge(time=True, profile=True)
        data = {**_summary(result), "flags": list(result.flags), "profile": result.profile,
                "timing": to_dict(result.timing) if result.timing else None}
        text = _with_reasons(f"profile: {_timing_line(result)}", result)
        return Reply(f"{text}\n\n{result.profile}" if result.profile else text, data)

    def judge(self) -> Reply:
        result = self._judge(time=self.config.judge.time, profile=False, final=True)
        return Reply(_with_reasons(f"judge: {_timing_line(result)}", result),
                     judge_record(result))

    def judge_config(self, time: bool, final: bool = False) -> JudgeConfig:
        """Verify and profile time the candidate as an episode's own calls do
        (``in_episode``); ``judge`` as configured."""
        base = self.config.judge if final else in_episode(self.config.judge)
        return base.model_copy(update={"device": self.info.device, "time": time})

    def _judge(self, time: bool, profile: bool, final: bool = False) -> JudgeResult:
        """Verify and profile through the workspace's warm judge (docs/warm-judge.md), which
        ends with this process; ``judge`` in a judge of its own, as the final verdict."""
        if final:
            if self._warm is not None:  # nothing the agent started runs beside the verdict
                self._warm.close()
                self._warm = None
            with self._lock:
                return Judge(self.judge_config(time, final)).judge(
                    self.info.task, Candidate("workspace", self.root), profile)
        if self._warm is None:
            configs = {op: self.judge_config(op == "profile").model_copy(
                update={"keep_warm": True}) for op in ("verify", "profile")}
            self._warm = WarmJudge(self.root, configs, owner=True)
        try:
            return self._warm.call("profile" if time else "verify")
        except WarmJudgeError as exc:
            raise JudgeError(str(exc)) from None

    def _resolve(self, path: str, write: bool) -> Path:
        if not path or not path.strip():
            raise FileAccessError("empty path; give one relative to the workspace, "
                                  "such as model_new.py or kernels/my_kernel.cpp")
        posix = PurePosixPath(path.replace("\\", "/"))
        if posix.is_absolute() or (len(path) > 1 and path[1] == ":"):
            raise FileAccessError(f"{path}: absolute paths are refused; give a path relative to "
                                  "the workspace")
        if ".." in posix.parts:
            raise FileAccessError(f"{path}: '..' is refused; paths stay inside the workspace")
        parts = [p for p in posix.parts if p != "."]
        rel = "/".join(parts)
        if not parts:
            raise FileAccessError(f"{path}: names the workspace itself, not a file")
        editable = rel == "model_new.py" or (parts[0] == "kernels" and len(parts) > 1)
        if not editable and not (not write and rel in READABLE):
            if parts[0] in FIXED:
                verb = "written" if write else "read"
                raise FileAccessError(f"{rel}: a fixed file of the workspace cannot be {verb}; "
                                      f"edit only {EDITABLE}")
            raise FileAccessError(f"{rel}: not an editable file; edit only {EDITABLE}")
        target = self.root
        for part in parts:
            target = target / part
            if target.is_symlink():
                raise FileAccessError(f"{rel}: symbolic links are refused "
                                      f"({target.relative_to(self.root)} is one)")
        if target.is_dir():
            raise FileAccessError(f"{rel}: is a folder, not a file")
        return target

    def _editable_files(self) -> list[str]:
        found = ["model_new.py"] if (self.root / "model_new.py").is_file() else []
        kernels = self.root / "kernels"
        if kernels.is_dir() and not kernels.is_symlink():
            found += sorted(str(p.relative_to(self.root)) for p in kernels.rglob("*")
                            if p.is_file() and not p.is_symlink())
        return found


def judge_record(result: JudgeResult) -> dict[str, Any]:
    """The judgement as ``cuda-agent judge --json`` prints it: the summary first, then details."""
    from cuda_agent.cli.render import judge_summary

    return judge_summary(result)


def build_server(workspace: Path, config: McpConfig | None = None) -> MCPServer:
    """An MCP server whose tools act on ``workspace``; raises WorkspaceError for a bad one.

    Serve it over stdio with ``build_server(ws, config).run("stdio")``.
    """
    tools = WorkspaceTools(workspace, config)
    server = MCPServer(name=tools.config.name, version=__version__, instructions=(
        f"Make the task '{tools.info.task.name}' faster with custom kernels on "
        f"{tools.info.device}. Start with workspace_info (it carries SKILL.md), edit "
        f"{EDITABLE} with write_file, then build, verify, profile and judge."))
    for fn in _tool_functions(tools):
        server.add_tool(fn)
    return server


def _tool_functions(tools: WorkspaceTools) -> list[Callable[..., Any]]:
    async def workspace_info() -> Annotated[CallToolResult, out.WorkspaceInfoOut]:
        """The task, the device, the files you may edit and the SKILL.md playbook."""
        return await _run(tools.workspace_info)

    async def read_file(path: str) -> Annotated[CallToolResult, out.ReadFileOut]:
        """Read model_new.py, a kernels/ file, or SKILL.md, model.py and the bindings."""
        return await _run(tools.read_file, path)

    async def write_file(path: str, content: str) -> Annotated[CallToolResult, out.WriteFileOut]:
        """Create or replace model_new.py or kernels/<file> (path relative to the workspace)."""
        return await _run(tools.write_file, path, content)

    async def delete_file(path: str) -> Annotated[CallToolResult, out.DeleteFileOut]:
        """Delete a kernels/<file> (model_new.py can only be rewritten)."""
        return await _run(tools.delete_file, path)

    async def build() -> Annotated[CallToolResult, out.BuildOut]:
        """Incrementally compile kernels/; errors come back with file, line and message."""
        return await _run(tools.build)

    async def verify() -> Annotated[CallToolResult, out.VerifyOut]:
        """Build, then check ModelNew against the reference on seeded inputs (no timing)."""
        return await _run(tools.verify)

    async def profile() -> Annotated[CallToolResult, out.ProfileOut]:
        """Build, check and time against eager PyTorch and torch.compile; operator profile."""
        return await _run(tools.profile)

    async def judge() -> Annotated[CallToolResult, out.JudgeOut]:
        """The full judgement (as `cuda-agent judge`): reward, speed-ups and reasons."""
        return await _run(tools.judge)

    return [workspace_info, read_file, write_file, delete_file, build, verify, profile, judge]


async def _run(fn: Callable[..., Reply], *args: Any) -> CallToolResult:
    try:
        reply = await anyio.to_thread.run_sync(fn, *args)
    except (FileAccessError, JudgeError, CandidateError, OSError) as exc:
        raise ToolError(str(exc)) from None
    return CallToolResult.model_validate({"content": [{"type": "text", "text": reply.summary}],
                                          "structuredContent": reply.data})


def _rel(path: str) -> str:
    return "/".join(p for p in PurePosixPath(path.replace("\\", "/")).parts if p != ".")


def _summary(result: JudgeResult) -> dict[str, Any]:
    data = to_dict(result)
    return {k: data[k] for k in SUMMARY_KEYS}


def _build_data(result: BuildResult) -> dict[str, Any]:
    data = {"ok": result.ok, "device": result.device, "seconds": round(result.seconds, 3),
            "compiled": list(result.compiled), "cached": list(result.cached),
            "errors": [to_dict(d) for d in result.errors],
            "warnings": [to_dict(d) for d in result.diagnostics if d not in result.errors]}
    if not result.ok and not result.diagnostics:
        data["log"] = result.log[-4000:]
    return data


def _build_text(result: BuildResult) -> str:
    head = (f"build {'ok' if result.ok else 'FAILED'} in {result.seconds:.2f} s: "
            f"{len(result.compiled)} compiled, {len(result.cached)} cached")
    lines = [head, *(str(d) for d in result.diagnostics)]
    if not result.ok and not result.diagnostics and result.log:
        lines.append(result.log[-2000:])
    return "\n".join(lines)


def _timing_line(result: JudgeResult) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g} ms"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    return (f"reward {result.reward}, correct {result.correct}; candidate "
            f"{ms(result.runtime_ms)}, eager {ms(result.eager_ms)} "
            f"({x(result.speedup_vs_eager)}), torch.compile {ms(result.compile_ms)} "
            f"({x(result.speedup_vs_compile)})")


def _with_reasons(text: str, result: JudgeResult) -> str:
    extra = [f"- {r}" for r in result.reasons] + [f"flag: {f}" for f in result.flags]
    if result.build is not None and not result.build.ok:
        extra.append(_build_text(result.build))
    return "\n".join([text, *extra])
