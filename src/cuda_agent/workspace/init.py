"""Create an agent workspace for a task, and find the trusted task again from one.

    cuda-agent workspace init ../shared/kernelbench/kernelbench.jsonl::1/19 ws --device cpu

Layout: SKILL.md, model.py (frozen reference), model_new.py (stub ModelNew), binding.cpp +
binding_registry.h (the fixed module ``cuda_extension``), kernels/ (a worked example),
utils/{build,verify,profile}. The trusted copy of the task is kept outside the workspace,
under ``$CUDA_AGENT_HOME/tasks``; the workspace only names it by hash.
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2

from cuda_agent import __version__
from cuda_agent.paths import TEMPLATES, home_dir
from cuda_agent.tasks.inspect import TaskSpec, inspect_task
from cuda_agent.tasks.shapes import input_shapes
from cuda_agent.tasks.sizes import Sizing, human_bytes, reduced_task
from cuda_agent.tasks.task import Task
from cuda_agent.workspace.stub import render_stub

META_DIR = ".cuda-agent"
COMMANDS = {"build": "utils/build", "verify": "utils/verify", "profile": "utils/profile"}
READ_ONLY = ("model.py", "binding.cpp", "binding_registry.h", "utils/build", "utils/verify",
             "utils/profile")


class WorkspaceError(RuntimeError):
    """The workspace folder cannot be created or is not a cuda-agent workspace."""


@dataclass(frozen=True)
class WorkspaceInfo:
    """What a workspace records about itself (in ``.cuda-agent/workspace.json``)."""

    root: Path
    task: Task
    device: str


def init_workspace(task: Task, directory: Path, device: str = "cpu", *,
                   spec: TaskSpec | None = None, arch: str = "", force: bool = False,
                   sizing: Sizing | None = None) -> Path:
    """Create the workspace for ``task`` in ``directory`` and return its path. ``sizing``:
    the size the judge runs the task at on the CPU (``judge.cpu_size.workspace_sizing``),
    which SKILL.md states."""
    if device not in ("cpu", "cuda"):
        raise WorkspaceError(f"device must be 'cpu' or 'cuda', not {device!r}")
    root = Path(directory).resolve()
    if root.exists() and any(root.iterdir()):
        if not force:
            raise WorkspaceError(f"{root} exists and is not empty (use --force to replace it)")
        shutil.rmtree(root)
    spec = spec or inspect_task(task)
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.py").write_text(task.code)
    (root / "model_new.py").write_text(render_stub(task.code, task.name))
    for name in ("binding.cpp", "binding_registry.h"):
        shutil.copy2(TEMPLATES / "common" / name, root / name)
    shutil.copytree(TEMPLATES / device / "kernels", root / "kernels")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    (root / "SKILL.md").write_text(env.get_template(f"{device}/SKILL.md.j2").render(
        task_name=task.name, precision=task.precision.value,
        inputs=[str(s) for s in spec.inputs], outputs=[str(s) for s in spec.outputs or ()],
        init_inputs=spec.init_inputs, init_signature=_init_signature(task.code),
        shapes=input_shapes(task.code), arch=f"sm_{arch}" if arch else "", commands=COMMANDS,
        size=_size(task, sizing) if device == "cpu" else None))
    (root / "utils").mkdir()
    for name in ("build", "verify", "profile"):
        script = root / "utils" / name
        script.write_text(env.get_template(f"common/utils/{name}.j2").render(python=sys.executable))
        script.chmod(0o755)
    store_task(task)
    meta = root / META_DIR
    meta.mkdir()
    (meta / "workspace.json").write_text(json.dumps(
        {"task": task.name, "task_sha256": task.sha256, "device": device,
         "version": __version__}, indent=1))
    for name in READ_ONLY:
        path = root / name
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return root


def store_task(task: Task) -> Path:
    """Keep a trusted copy of the task outside any workspace, keyed by its hash."""
    path = home_dir() / "tasks" / f"{task.sha256}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(task.model_dump_json())
        tmp.replace(path)
    return path


def read_workspace(directory: Path) -> WorkspaceInfo:
    """Return the workspace's device and its trusted task (never the workspace's model.py)."""
    root = Path(directory).resolve()
    meta = root / META_DIR / "workspace.json"
    if not meta.is_file():
        raise WorkspaceError(f"{root}: not a cuda-agent workspace (no {META_DIR}/workspace.json)")
    try:
        record = json.loads(meta.read_text())
        sha = str(record["task_sha256"])
        device = str(record["device"])
    except (ValueError, KeyError) as exc:
        raise WorkspaceError(f"{meta}: unreadable ({exc})") from None
    stored = home_dir() / "tasks" / f"{sha}.json"
    if not stored.is_file():
        raise WorkspaceError(f"{root}: its task {sha[:12]} is not in {stored.parent}; "
                             "create the workspace again with `cuda-agent workspace init`")
    task = Task.model_validate_json(stored.read_text())
    if task.sha256 != sha:
        raise WorkspaceError(f"{stored}: the trusted task copy was modified (its code no longer "
                             "matches its hash); create the workspace again")
    return WorkspaceInfo(root, task, device)


def _size(task: Task, sizing: Sizing | None) -> dict | None:
    """What SKILL.md says of the size the task is judged at (None: not known)."""
    if sizing is None:
        return None
    size = {"reduced": sizing.reduced, "full": human_bytes(sizing.full.bytes)}
    if sizing.reduced:
        judged = inspect_task(reduced_task(task, sizing))
        size.update(changes=sizing.describe(), judged=human_bytes(sizing.judged.bytes),
                    inputs=[str(s) for s in judged.inputs])
    return size


def _init_signature(code: str) -> str:
    from cuda_agent.tasks.task import init_signature

    return init_signature(code)
