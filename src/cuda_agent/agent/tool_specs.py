"""The agent's tools as the model sees them, and the check of a call's arguments.

Each spec's ``parameters`` is the JSON schema sent to the model; ``check_arguments`` holds a
call to it (required keys, no extra keys, types) and returns a message the model can act on.
"""

from __future__ import annotations

from typing import Any

from cuda_agent.agent.types import ToolSpec


def _obj(required: list[str], **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def _s(desc: str) -> dict[str, Any]:
    return {"type": "string", "description": desc}


def _i(desc: str) -> dict[str, Any]:
    return {"type": "integer", "description": desc}


PATH = _s("Path relative to the workspace root, e.g. kernels/my_op.cpp.")

SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("shell", "Run a shell command in the workspace (its root is the working "
             "directory; no network). Returns the exit code, stdout and stderr.",
             _obj(["command"], command=_s("The command, run by /bin/sh -c."))),
    ToolSpec("read_file", "Read a text file of the workspace, with numbered lines.",
             _obj(["path"], path=PATH, offset=_i("First line to show (1-based; default 1)."),
                  limit=_i("Most lines to show (default 2000)."))),
    ToolSpec("write_file", "Create or overwrite a file of the workspace with `content`.",
             _obj(["path", "content"], path=PATH, content=_s("The whole new file."))),
    ToolSpec("edit_file", "Replace the exact text `old` with `new` in a file. `old` must "
             "occur exactly once unless replace_all is true.",
             _obj(["path", "old", "new"], path=PATH, old=_s("Exact text to replace."),
                  new=_s("Replacement text."),
                  replace_all={"type": "boolean",
                               "description": "Replace every occurrence (default false)."})),
    ToolSpec("multi_edit", "Apply several exact-text replacements to one file, in order; "
             "either all apply or none does.",
             _obj(["path", "edits"], path=PATH, edits={
                 "type": "array", "description": "Replacements applied in order.",
                 "items": _obj(["old", "new"], old=_s("Exact text to replace."),
                               new=_s("Replacement text."),
                               replace_all={"type": "boolean",
                                            "description": "Replace every occurrence."})})),
    ToolSpec("glob", "List workspace files matching a glob pattern, e.g. kernels/*.cpp or "
             "**/*.py.", _obj(["pattern"], pattern=_s("Glob pattern relative to the root."))),
    ToolSpec("grep", "Search file contents with a regular expression; prints file:line: text.",
             _obj(["pattern"], pattern=_s("Python regular expression."),
                  path=_s("Glob of files to search (default: all files)."))),
    ToolSpec("build", "Compile kernels/ into the cuda_extension module (incremental). "
             "Reports compiler errors first, as file:line:col.", _obj([])),
    ToolSpec("verify", "Build, then check ModelNew against the reference on fresh inputs "
             "(no timing). Reports the reward and why.", _obj([])),
    ToolSpec("profile", "Build, check, and time ModelNew against eager PyTorch and "
             "torch.compile, with an operator profile.", _obj([])),
    ToolSpec("submit", "Finish the episode: the workspace is judged as it is now.",
             _obj([], message=_s("Optional note on what was done."))),
)

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "boolean": (bool,), "array": (list,),
    "object": (dict,), "number": (int, float),
}


def spec_by_name() -> dict[str, ToolSpec]:
    return {s.name: s for s in SPECS}


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """None when ``arguments`` fit the spec; otherwise what is wrong, for the model to fix."""
    problem = _check(spec.parameters, arguments, "")
    return f"{spec.name}: {problem}" if problem else None


def _check(schema: dict[str, Any], value: Any, label: str) -> str | None:
    kind = schema.get("type")
    types = _TYPES.get(kind or "", (object,))
    if not isinstance(value, types) or (kind in ("integer", "number")
                                        and isinstance(value, bool)):
        return (f"argument {label} must be {_a(kind)}, got {type(value).__name__} "
                f"{str(value)[:80]!r}")
    if kind == "object":
        where = f" in {label}" if label else ""
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return (f"missing required argument(s) {', '.join(missing)}{where}; "
                    f"expected {_describe(schema)}")
        extra = sorted(set(value) - set(props))
        if extra and schema.get("additionalProperties") is False:
            return (f"unknown argument(s) {', '.join(extra)}{where}; "
                    f"expected {_describe(schema)}")
        for key, sub in props.items():
            if key in value:
                problem = _check(sub, value[key], f"{label}.{key}" if label else f"'{key}'")
                if problem:
                    return problem
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            problem = _check(schema["items"], item, f"{label}[{i}]")
            if problem:
                return problem
    return None


def _a(kind: str | None) -> str:
    return {"integer": "an integer", "array": "an array", "object": "an object"}.get(
        kind or "", f"a {kind}")


def _describe(schema: dict[str, Any]) -> str:
    props = schema.get("properties", {})
    if not props:
        return "no arguments"
    required = set(schema.get("required", []))
    return "{" + ", ".join(f"{k}: {p.get('type')}{'' if k in required else ' (optional)'}"
                           for k, p in props.items()) + "}"
