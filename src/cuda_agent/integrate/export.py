"""Ship a result as a small installable package that does not need cuda-agent.

    cuda-agent export runs/gelu --name gelu_fast --out dist/gelu_fast
    pip install --no-build-isolation dist/gelu_fast && pytest dist/gelu_fast/tests

``OUT`` gets ``pyproject.toml`` and ``setup.py`` (setuptools; the extension is compiled
ahead of time by ``torch.utils.cpp_extension``: ``CppExtension`` for CPU kernels,
``CUDAExtension`` when ``kernels/`` holds ``.cu`` files), ``NAME/`` (``model_new.py`` with
its ``import cuda_extension`` pointed at ``NAME.cuda_extension``, ``reference.py`` = the
task, ``csrc/`` = the fixed binding layer + ``kernels/``) and ``tests/test_reference.py``.
The binding layer's ``PYBIND11_MODULE(cuda_extension, ...)`` is kept as is: the extension's
full name is ``NAME.cuda_extension`` and Python only needs its last part to match.
"""

from __future__ import annotations

import ast
import json
import keyword
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2

from cuda_agent.build.builder import MODULE_NAME, TIMER_SOURCE
from cuda_agent.integrate.load import IntegrateError, ResultFolder, locate, task_code
from cuda_agent.paths import TEMPLATES as WORKSPACE_TEMPLATES
from cuda_agent.workspace.examples import unused_example_files

TEMPLATES = Path(__file__).resolve().parent / "templates"
KERNEL_SUFFIXES = (".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc")


@dataclass(frozen=True)
class ExportResult:
    """The package ``export`` wrote."""

    out: Path
    name: str
    device: str
    files: tuple[str, ...]


def export(result_dir: str | Path, name: str, out: str | Path, *,
           task: str | Path | None = None, version: str = "0.1.0",
           force: bool = False) -> ExportResult:
    """Write the package ``name`` for the result in ``result_dir`` into ``out``."""
    if not name.isidentifier() or keyword.iskeyword(name) or name == MODULE_NAME:
        raise IntegrateError(f"--name {name!r}: the package name must be a Python identifier "
                             "such as gelu_fast")
    folder = locate(result_dir, task)
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        if not force:
            raise IntegrateError(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    code = task_code(folder)
    model_new = relative_import(folder.model_new.read_text(), str(folder.model_new))
    package = out / name
    _copy_sources(folder, package / "csrc")
    (package / "model_new.py").write_text(model_new)
    (package / "reference.py").write_text(code)
    values = {"name": name, "dist": name.replace("_", "-"), "version": version,
              "device": folder.device, "task_name": _task_name(folder),
              "init_signature": _init_signature(code)}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    for template, target in (("pyproject.toml.j2", out / "pyproject.toml"),
                             ("setup.py.j2", out / "setup.py"),
                             ("README.md.j2", out / "README.md"),
                             ("__init__.py.j2", package / "__init__.py"),
                             ("test_reference.py.j2", out / "tests" / "test_reference.py")):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(env.get_template(template).render(**values))
    files = tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
    return ExportResult(out, name, folder.device, files)


def relative_import(source: str, where: str = "model_new.py") -> str:
    """``model_new.py`` with ``import cuda_extension`` made package-relative."""
    tree = ast.parse(source, where)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == MODULE_NAME for a in node.names):
            if len(node.names) != 1 or node.lineno != node.end_lineno:
                raise IntegrateError(f"{where}:{node.lineno}: import cuda_extension on a line "
                                     "of its own to export this model")
            alias = node.names[0].asname
            new = f"from . import {MODULE_NAME}" + (f" as {alias}" if alias else "")
            edits.append((node.lineno, _indent(lines[node.lineno - 1]) + new + "\n"))
        elif isinstance(node, ast.ImportFrom) and node.module == MODULE_NAME and not node.level:
            text = "".join(lines[node.lineno - 1 : node.end_lineno])
            edits.append((node.lineno, text.replace(f"from {MODULE_NAME}",
                                                    f"from .{MODULE_NAME}", 1)))
            for extra in range(node.lineno + 1, (node.end_lineno or node.lineno) + 1):
                edits.append((extra, ""))
    if not any(new for _, new in edits):
        raise IntegrateError(f"{where}: never imports cuda_extension; nothing to export")
    for lineno, new in edits:
        lines[lineno - 1] = new
    return "".join(lines)


def _copy_sources(folder: ResultFolder, csrc: Path) -> None:
    csrc.mkdir(parents=True)
    for name in ("binding.cpp", "binding_registry.h"):
        shutil.copy2(WORKSPACE_TEMPLATES / "common" / name, csrc / name)
    if folder.device == "cuda":
        shutil.copy2(TIMER_SOURCE, csrc / TIMER_SOURCE.name)
    unused = set(unused_example_files(folder.model_new, folder.kernels))
    for path in sorted(folder.kernels.rglob("*")):
        if path.is_symlink():
            raise IntegrateError(f"{path}: symbolic links are not exported")
        if path.is_file() and path.suffix in KERNEL_SUFFIXES and path not in unused:
            target = csrc / "kernels" / path.relative_to(folder.kernels)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def _task_name(folder: ResultFolder) -> str:
    path = Path(folder.task)
    meta = path.parent / ".cuda-agent" / "workspace.json"
    if meta.is_file():  # an optimize workspace names its task
        try:
            return str(json.loads(meta.read_text())["task"])
        except (ValueError, KeyError):
            pass
    return path.stem if path.is_file() else folder.task.split(":")[-1]


def _init_signature(code: str) -> str:
    from cuda_agent.tasks.task import init_signature

    try:
        return init_signature(code) or "*get_init_inputs()"
    except Exception:  # a task we can still export; the signature is only documentation
        return "*get_init_inputs()"


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]
