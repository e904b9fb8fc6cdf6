"""The agent's tools over one workspace: shell, files, build, verify, profile, submit.

    box = Toolbox(workspace, ToolsConfig())
    box.call("write_file", {"path": "kernels/op.cpp", "content": "..."})
    box.call("verify", {})          # ToolResult(ok, output for the model, data=JudgeResult)

Every call's arguments are checked against its spec first; a bad call (unknown tool,
missing, extra or mistyped argument, malformed JSON, a path outside the workspace, a write
to a fixed file) returns ``ToolResult(ok=False)`` with a message the model can act on, and
never raises. Shell commands run in the sandbox (workspace as cwd, no network, timeout).
Build, verify and profile call the same builder and judge as ``cuda-agent workspace``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cuda_agent.agent.compaction import clip
from cuda_agent.agent.file_tools import ToolError, WorkspaceFiles
from cuda_agent.agent.tool_specs import SPECS, check_arguments, spec_by_name
from cuda_agent.agent.types import ToolResult, ToolSpec
from cuda_agent.execution.sandbox import SandboxConfig
from cuda_agent.execution.warm_judge import reaches_judge
from cuda_agent.results import BuildResult, JudgeResult, to_dict


class ToolsConfig(BaseModel):
    """The tools' limits; one section ``tools:`` of the agent's YAML."""

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig,
                                   description="Isolation and limits of `shell` commands.")
    shell_timeout_s: float = Field(120.0, gt=0, description="Wall-clock limit of one command.")
    output_cap_chars: int = Field(
        20_000, gt=200, description="Longest tool output returned (head and tail are kept).")
    max_results: int = Field(200, ge=1, description="Most files or lines glob/grep list.")
    judge: dict[str, Any] = Field(
        default_factory=dict, description="JudgeConfig overrides for verify and profile, "
        "e.g. {'trials': 2}; device always comes from the workspace. Unless they name it, "
        "the candidate is timed in one process (judge.config.IN_EPISODE).")


class Toolbox:
    """The tools of one workspace; ``call`` never raises for a bad call."""

    def __init__(self, root: Path, config: ToolsConfig | None = None, task: Any = None):
        """``task``: the episode's trusted task, which its judge uses (None: the one the
        workspace's record names, as a user's own workspace)."""
        self.root = Path(root).resolve()
        self.task = task
        self.config = config or ToolsConfig()
        self.files = WorkspaceFiles(self.root, self.config.max_results)
        self._specs = spec_by_name()
        self._info: Any = None
        self._sandbox: Any = None
        self._warm: Any = None

    def specs(self) -> list[ToolSpec]:
        return list(SPECS)

    def call(self, name: str, arguments: dict[str, Any] | None, raw: str = "") -> ToolResult:
        start = time.perf_counter()
        if name in ("verify", "profile"):
            self._start_judge(wait=False)
        elif name == "shell" and reaches_judge(str((arguments or {}).get("command", ""))):
            self._start_judge(wait=True)  # listening before the command looks for it
        result = self._call(name, arguments, raw)
        return ToolResult(result.ok, clip(result.output, self.config.output_cap_chars),
                          result.data, time.perf_counter() - start)

    def _call(self, name: str, arguments: dict[str, Any] | None, raw: str) -> ToolResult:
        spec = self._specs.get(name)
        if spec is None:
            return ToolResult(False, f"unknown tool {name!r}; the tools are: "
                              f"{', '.join(self._specs)}")
        if arguments is None:
            return ToolResult(False, f"{name}: the arguments were not a valid JSON object: "
                              f"{raw[:500]!r}; send them again as JSON, e.g. "
                              '{"path": "model_new.py"}')
        problem = check_arguments(spec, arguments)
        if problem:
            return ToolResult(False, problem)
        try:
            return getattr(self, f"_tool_{name}")(**arguments)
        except ToolError as exc:
            return ToolResult(False, str(exc))
        except Exception as exc:  # a tool's own failure must not end the episode
            return ToolResult(False, f"{name} failed: {type(exc).__name__}: {exc}")

    # -- files -----------------------------------------------------------------------------
    def _tool_read_file(self, path: str, offset: int = 1, limit: int = 2000) -> ToolResult:
        return ToolResult(True, self.files.read(path, offset, limit))

    def _tool_write_file(self, path: str, content: str) -> ToolResult:
        return ToolResult(True, self.files.write(path, content))

    def _tool_edit_file(self, path: str, old: str, new: str,
                        replace_all: bool = False) -> ToolResult:
        return ToolResult(True, self.files.edit(
            path, [{"old": old, "new": new, "replace_all": replace_all}]))

    def _tool_multi_edit(self, path: str, edits: list[dict[str, Any]]) -> ToolResult:
        if not edits:
            raise ToolError("multi_edit: 'edits' is empty")
        return ToolResult(True, self.files.edit(path, edits))

    def _tool_glob(self, pattern: str) -> ToolResult:
        return ToolResult(True, self.files.glob(pattern))

    def _tool_grep(self, pattern: str, path: str | None = None) -> ToolResult:
        return ToolResult(True, self.files.grep(pattern, path))

    # -- shell -----------------------------------------------------------------------------
    def _tool_shell(self, command: str) -> ToolResult:
        from cuda_agent.execution.sandbox import make_sandbox
        from cuda_agent.execution.warm_judge import ENV, address

        if not command.strip():
            raise ToolError("shell: 'command' is empty")
        config = self.config.sandbox.model_copy(update={"timeout_s": self.config.shell_timeout_s})
        socket = address(self.root)  # utils/verify and utils/profile reach the episode's judge
        config = config.model_copy(update={"env_set": {**config.env_set, ENV: str(socket)},
                                           "ro_paths": (*config.ro_paths, str(socket.parent))})
        if self._sandbox is None:
            self._sandbox = make_sandbox(config)
        done = self._sandbox.run(command, self.root, config)
        half = self.config.output_cap_chars // 2
        status = f"exit code {done.exit_code}"
        if done.killed_reason:
            status += f" (killed: {done.killed_reason} after {done.seconds:.1f} s)"
        parts = [status]
        if done.stdout:
            parts.append("--- stdout ---\n" + clip(done.stdout, half))
        if done.stderr:
            parts.append("--- stderr ---\n" + clip(done.stderr, half))
        data = {"exit_code": done.exit_code, "timed_out": done.timed_out,
                "killed_reason": done.killed_reason, "seconds": done.seconds}
        return ToolResult(done.exit_code == 0 and not done.timed_out, "\n".join(parts), data)

    # -- build / verify / profile / submit -------------------------------------------------
    def workspace(self) -> Any:
        if self._info is None:
            from cuda_agent.workspace import WorkspaceError, read_workspace

            try:
                self._info = read_workspace(self.root)
            except WorkspaceError as exc:
                raise ToolError(str(exc)) from None
        return self._info

    def _tool_build(self) -> ToolResult:
        from cuda_agent.build import Builder

        info = self.workspace()
        self._start_judge(wait=False)  # a build comes before a verify: the judge starts now
        build = self.judge_config(timed=False).build.model_copy(update={"device": info.device})
        result = Builder(build).build(self.root, publish=True)
        return ToolResult(result.ok, build_summary(result), to_dict(result))

    def _tool_verify(self) -> ToolResult:
        return self._judge(timed=False, profile=False)

    def _tool_profile(self) -> ToolResult:
        return self._judge(timed=True, profile=True)

    def _tool_submit(self, message: str = "") -> ToolResult:
        return ToolResult(True, "submitted; the workspace will now be judged",
                          {"submitted": True, "message": message})

    def judge_config(self, timed: bool) -> Any:
        return self._configs()["profile" if timed else "verify"]

    def _configs(self) -> dict[str, Any]:
        from cuda_agent.execution.warm_judge import episode_configs

        return episode_configs(self.workspace().device, self.config.judge)

    def _judge(self, timed: bool, profile: bool) -> ToolResult:
        from cuda_agent.execution.warm_judge import WarmJudgeError

        self.workspace()  # not a workspace: the error says so
        self._start_judge(wait=False)
        try:
            result = self._warm.call("profile" if timed else "verify")
        except WarmJudgeError as exc:
            raise ToolError(f"the judge could not run: {exc}") from None
        return ToolResult(result.reward >= 1, judge_summary(result), to_dict(result))

    def _start_judge(self, wait: bool = False) -> None:
        """The episode's warm judge, started in the background at the first build, verify or
        profile call or shell command that may reach it: its workers start up (and on CUDA
        the profile's baselines are measured) while the agent works (docs/warm-judge.md)."""
        if self._warm is not None:
            self._warm.ensure(wait)
            return
        from cuda_agent.execution.warm_judge import WarmJudge, WarmJudgeError

        try:
            configs = self._configs()
        except ToolError:
            return  # not a workspace: the call itself says so
        self._warm = WarmJudge(self.root, configs, owner=True, task=self.task)
        with contextlib.suppress(WarmJudgeError):
            self._warm.start(wait=wait)  # a call that needs it says why it did not start

    def close(self) -> None:
        """End the episode's judge."""
        if self._warm is not None:
            self._warm.close()
            self._warm = None


def build_summary(result: BuildResult) -> str:
    """Errors first (file:line:col), then warnings; the log's tail when nothing parsed."""
    head = (f"build {'ok' if result.ok else 'FAILED'} in {result.seconds:.1f} s: "
            f"{len(result.compiled)} compiled, {len(result.cached)} cached")
    errors = list(result.errors)
    others = [d for d in result.diagnostics if d not in errors]
    lines = [head, *(str(d) for d in errors), *(str(d) for d in others)]
    if not result.ok and not result.diagnostics and result.log:
        lines.append(clip(result.log, 4000))
    return "\n".join(lines)


def judge_summary(result: JudgeResult) -> str:
    """The verdict for the model: reward and why, build errors, timings, profile."""
    verdict = "correct" if result.correct else "NOT correct"
    lines = [f"reward {result.reward}: compiled={result.compiled}, {verdict}"]
    lines += [f"- {reason}" for reason in result.reasons]
    lines += [f"- flag: {flag}" for flag in result.flags]
    if result.build is not None and not result.build.ok:
        lines.append(build_summary(result.build))
    c = result.correctness
    if c is not None and c.max_abs_error is not None:
        lines.append(f"max abs error {c.max_abs_error:.3g}, max rel error "
                     f"{c.max_rel_error:.3g} (atol {c.atol:g}, rtol {c.rtol:g})")
    if result.runtime_ms is not None:
        lines.append(f"runtime {result.runtime_ms:.4g} ms; eager {_ms(result.eager_ms)} "
                     f"(speed-up {_x(result.speedup_vs_eager)}); torch.compile "
                     f"{_ms(result.compile_ms)} (speed-up {_x(result.speedup_vs_compile)})")
    for shape in result.shapes:
        lines.append(f"- shape {shape.name}: {'correct' if shape.correct else 'NOT correct'}, "
                     f"reward {shape.reward}, runtime {_ms(shape.runtime_ms)}, eager "
                     f"{_ms(shape.eager_ms)} ({_x(shape.speedup_vs_eager)})")
    if result.profile:
        lines += ["--- profile ---", clip(result.profile, 6000)]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
