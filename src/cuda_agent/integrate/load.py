"""Find a result folder's parts and import its ``ModelNew`` with its own built extension.

    from cuda_agent.integrate.load import locate, load_model_new
    folder = locate("runs/gelu")               # an optimize OUT folder
    folder = locate("runs/gelu/result")        # its result/ (the task is found beside it)
    folder = locate("my/result", task="model.py")   # any result folder + the task's model.py
    ModelNew = load_model_new(folder)

A result folder holds ``model_new.py`` and ``kernels/``; the task (``model.py``, with
``Model``, ``get_inputs`` and ``get_init_inputs``) is ``OUT/workspace/model.py`` for a folder
written by ``cuda-agent optimize``, or any task reference (a path, ``builtin:NAME``).
The kernels are built with the project's incremental builder (cached objects, so a second
load compiles nothing) and imported under the fixed name ``cuda_extension`` only while
``model_new.py`` runs, so several results can live in one process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.build.builder import MODULE_NAME
from cuda_agent.build.sources import SOURCE_SUFFIXES


class IntegrateError(ValueError):
    """A result folder, task or model cannot be put together as asked."""


@dataclass(frozen=True)
class ResultFolder:
    """Where one optimisation result lives: ``root`` holds model_new.py and kernels/."""

    root: Path
    task: str
    device: str

    @property
    def model_new(self) -> Path:
        return self.root / "model_new.py"

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"


def locate(path: str | Path, task: str | Path | None = None) -> ResultFolder:
    """Resolve an optimize OUT folder, or a result folder plus its task, to a ResultFolder."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise IntegrateError(f"{path}: no such folder (expected an optimize output folder "
                             "or its result/ folder)")
    root = path / "result" if (path / "result").is_dir() else path
    missing = [name for name in ("model_new.py", "kernels") if not (root / name).exists()]
    if missing:
        raise IntegrateError(f"{root}: not a result folder, {' and '.join(missing)} missing "
                             "(a result folder holds model_new.py and kernels/)")
    sources = [p for p in (root / "kernels").rglob("*") if p.suffix in SOURCE_SUFFIXES]
    if not sources:
        raise IntegrateError(f"{root / 'kernels'}: holds no kernel sources (*.cpp, *.cu)")
    if task is None:
        beside = root.parent / "workspace" / "model.py"
        if not beside.is_file():
            raise IntegrateError(f"{root}: the task is not beside it ({beside} missing); "
                                 "pass the task's model.py (task=PATH, --task PATH)")
        task = beside
    device = "cuda" if any(p.suffix == ".cu" for p in sources) else "cpu"
    return ResultFolder(root, str(task), device)


def task_code(folder: ResultFolder) -> str:
    """The source of the task (a model.py path or any task reference)."""
    path = Path(folder.task)
    if path.is_file():
        return path.read_text()
    from cuda_agent.tasks import TaskError, load_task

    try:
        return load_task(folder.task).code
    except (TaskError, OSError) as exc:
        raise IntegrateError(f"task {folder.task}: {exc}") from None


def task_namespace(folder: ResultFolder) -> dict[str, Any]:
    """Run the task's code and return its globals (``Model``, ``get_init_inputs``, ...)."""
    code = task_code(folder)
    where = folder.task if Path(folder.task).is_file() else "task.py"
    namespace: dict[str, Any] = {"__name__": f"cuda_agent_task_{_digest(code)}",
                                 "__file__": where}
    try:
        exec(compile(code, where, "exec"), namespace)
    except Exception as exc:  # the task's own code: report whatever it raised
        raise IntegrateError(f"running the task {where} raised {type(exc).__name__}: "
                             f"{exc}") from exc
    if not callable(namespace.get("get_init_inputs")):
        raise IntegrateError(f"{where}: defines no get_init_inputs()")
    return namespace


def build_extension(folder: ResultFolder, config: Any = None) -> str:
    """Build ``kernels/`` incrementally and return the module's path; raise on errors."""
    from cuda_agent.build import BuildConfig, Builder

    config = config or BuildConfig(device=folder.device)
    result = Builder(config).build(folder.root)
    if not result.ok or result.extension_path is None:
        detail = "\n".join(str(d) for d in result.errors[:10]) or result.log[-2000:]
        raise IntegrateError(f"{folder.root}: the kernels failed to build for "
                             f"{config.device}:\n{detail}")
    return result.extension_path


def load_model_new(folder: ResultFolder, config: Any = None) -> type:
    """Build the kernels, then import ``model_new.py`` and return its ``ModelNew`` class."""
    extension = build_extension(folder, config)
    source = folder.model_new.read_bytes()
    name = f"cuda_agent_model_new_{_digest(source, extension.encode())}"
    if name in sys.modules:
        return sys.modules[name].ModelNew
    ext = _import_extension(extension)
    spec = importlib.util.spec_from_file_location(name, folder.model_new)
    if spec is None or spec.loader is None:
        raise IntegrateError(f"cannot import {folder.model_new}")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(MODULE_NAME)
    sys.modules[MODULE_NAME] = ext
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise IntegrateError(f"importing {folder.model_new} raised {type(exc).__name__}: "
                             f"{exc}") from exc
    finally:
        if previous is not None:
            sys.modules[MODULE_NAME] = previous
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        del sys.modules[name]
        raise IntegrateError(f"{folder.model_new}: defines no class ModelNew")
    return model_new


def _import_extension(path: str) -> Any:
    import torch  # noqa: F401  (libtorch must be loaded before the extension)

    # pybind11 caches a module by its spec's full name, and the init function is found by
    # the last part: a dotted name of its own per build keeps several results apart
    unique = f"cuda_agent_ext_{_digest(path)}.{MODULE_NAME}"
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise IntegrateError(f"cannot load the extension {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest.hexdigest()[:16]
