"""Load tasks from files and data sets.

Sources:
- ``model.py``: one KernelBench-format file.
- ``kernelbench.jsonl``: rows with ``level, problem_id, name, code``.
- ``ops.jsonl`` / ``ops.parquet``: CUDA-Agent-Ops rows with ``ops, data_source, code``.
- a directory: a KernelBench checkout (``level1/19_ReLU.py``), a folder of ``.py`` files,
  a folder of parquet/JSONL shards, or a ``datasets`` folder written by ``save_to_disk``.
- ``builtin:NAME``: an example task shipped with the package.

A reference may carry a selector after ``::`` to pick one task from a set:
``kernelbench.jsonl::1/19`` (level/problem), ``::19_ReLU`` (name) or ``::#5`` (row index).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cuda_agent.tasks.task import Precision, Task, TaskError, check_source

BUILTIN_PREFIX = "builtin:"
_LEVEL_DIR = re.compile(r"level(\d+)$")
_PROBLEM_FILE = re.compile(r"(\d+)_(.+)\.py$")


def builtin_dir() -> Path:
    """Folder holding the example tasks shipped with the package."""
    return Path(__file__).resolve().parent.parent / "examples"


def builtin_names() -> list[str]:
    return sorted(p.name for p in builtin_dir().iterdir() if (p / "model.py").is_file())


def load_task(ref: str | Path, precision: Precision | None = None) -> Task:
    """Load exactly one task from ``ref`` (a path, optionally with a ``::`` selector)."""
    ref = str(ref)
    path_part, _, selector = ref.partition("::")
    tasks = list(load_tasks(path_part, precision=precision))
    if selector:
        return select(tasks, selector, ref)
    if len(tasks) != 1:
        raise TaskError(
            f"{ref}: holds {len(tasks)} tasks; pick one with a selector, "
            f"e.g. '{ref}::1/19', '{ref}::NAME' or '{ref}::#0'"
        )
    return tasks[0]


def select(tasks: list[Task], selector: str, ref: str) -> Task:
    """Pick one task by ``level/problem_id``, ``#index`` or name."""
    if selector.startswith("#") and selector[1:].isdigit():
        index = int(selector[1:])
        if index >= len(tasks):
            raise TaskError(f"{ref}: row {index} out of range (0..{len(tasks) - 1})")
        return tasks[index]
    match = re.fullmatch(r"(\d+)/(\d+)", selector)
    for task in tasks:
        if match and (task.level, task.problem_id) == (int(match[1]), int(match[2])):
            return task
        if not match and task.name == selector:
            return task
    raise TaskError(f"{ref}: no task matches selector '{selector}'")


def load_tasks(source: str | Path, precision: Precision | None = None) -> Iterator[Task]:
    """Yield every task in ``source``; each one is statically checked, and the first
    malformed one raises its ``TaskError``."""
    for item in each_task(source, precision):
        if isinstance(item, TaskError):
            raise item
        yield item


def each_task(source: str | Path, precision: Precision | None = None
              ) -> Iterator[Task | TaskError]:
    """Every task in ``source`` in order, or in its place the ``TaskError`` that names what is
    wrong with it, and on to the next one (``tasks check`` reports them all); a source that
    cannot be read at all is one ``TaskError``."""
    source = str(source)
    if source.startswith(BUILTIN_PREFIX):
        yield _builtin(source[len(BUILTIN_PREFIX) :], precision)
        return
    path = Path(source)
    if not path.exists():
        yield TaskError(f"{path}: no such file or directory")
    elif path.is_dir():
        yield from _directory(path, precision)
    elif path.suffix == ".py":
        yield _attempt(path.read_text, str(path), name=path.stem, precision=precision)
    elif path.suffix in (".jsonl", ".json"):
        yield from _rows(_jsonl_rows(path), str(path), precision)
    elif path.suffix == ".parquet":
        yield from _rows(_parquet_rows(path), str(path), precision)
    else:
        yield TaskError(f"{path}: unknown task format (expected .py, .jsonl, .parquet or a "
                        "folder)")


def _builtin(name: str, precision: Precision | None) -> Task | TaskError:
    path = builtin_dir() / name / "model.py"
    if not path.is_file():
        return TaskError(f"builtin:{name}: no such example; known: {', '.join(builtin_names())}")
    return _attempt(path.read_text, f"builtin:{name}", name=name, origin="builtin",
                    precision=precision)


def _directory(path: Path, precision: Precision | None) -> Iterator[Task | TaskError]:
    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        import datasets

        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            data = data[next(iter(data))]
        yield from _rows(data, str(path), precision)
        return
    levels = sorted(p for p in path.iterdir() if p.is_dir() and _LEVEL_DIR.match(p.name))
    if levels:
        for level_dir in levels:
            level = int(_LEVEL_DIR.match(level_dir.name)[1])
            files = [(f, _PROBLEM_FILE.match(f.name)) for f in level_dir.glob("*.py")]
            for file, m in sorted((x for x in files if x[1]), key=lambda x: int(x[1][1])):
                yield _attempt(file.read_text, str(file), name=file.stem,
                               origin="kernelbench", level=level, problem_id=int(m[1]),
                               precision=precision)
        return
    shards = sorted([*path.glob("*.jsonl"), *path.glob("*.parquet")])
    if shards:
        for shard in shards:
            yield from each_task(shard, precision)
        return
    files = sorted(path.glob("*.py"))
    if not files:
        yield TaskError(f"{path}: folder holds no tasks (.py files, level*/ folders or shards)")
    for file in files:
        yield _attempt(file.read_text, str(file), name=file.stem, precision=precision)


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any] | TaskError]:
    with path.open() as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield TaskError(f"{path}:{lineno}: invalid JSON: {exc.msg}")
                continue
            if not isinstance(row, dict):
                yield TaskError(f"{path}:{lineno}: each line must be a JSON object")
                continue
            row.setdefault("_where", f"{path}:{lineno}")
            yield row


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for index, row in enumerate(pq.read_table(path).to_pylist()):
        row.setdefault("_where", f"{path}#{index}")
        yield row


def _rows(rows: Iterable[dict[str, Any] | TaskError], where: str,
          precision: Precision | None) -> Iterator[Task | TaskError]:
    for index, row in enumerate(rows):
        if isinstance(row, TaskError):
            yield row
            continue
        row = dict(row)
        loc = row.pop("_where", f"{where}#{index}")
        try:
            yield _row(row, loc, index, precision)
        except TaskError as exc:
            yield exc


def _row(row: dict[str, Any], loc: str, index: int, precision: Precision | None) -> Task:
    if "code" not in row:
        raise TaskError(f"{loc}: row has no 'code' field (fields: {sorted(row)})")
    if "ops" in row or "data_source" in row:
        return _ops_row(row, loc, index, precision)
    if "level" in row and "problem_id" in row:
        try:
            level, problem = int(row["level"]), int(row["problem_id"])
        except (TypeError, ValueError):
            raise TaskError(f"{loc}: 'level' and 'problem_id' must be whole numbers") from None
        return _make(row["code"], loc, name=str(row.get("name") or f"{problem}"),
                     origin="kernelbench", level=level, problem_id=problem,
                     precision=precision)
    return _make(row["code"], loc, name=str(row.get("name") or f"row_{index:06d}"),
                 precision=precision)


def _ops_row(row: dict[str, Any], loc: str, index: int, precision: Precision | None) -> Task:
    ops = row.get("ops") or []
    if isinstance(ops, str):
        try:
            ops = json.loads(ops)
        except json.JSONDecodeError:
            ops = [op.strip() for op in ops.split(",") if op.strip()]
    ops = tuple(str(op) for op in ops)
    short = "_".join(op.split(".")[-1] for op in ops)[:60]
    name = str(row.get("name") or f"ops_{index:06d}" + (f"_{short}" if short else ""))
    extra = {k: v for k, v in row.items() if k not in ("code", "ops", "name", "precision")}
    return _make(row["code"], loc, name=name, origin="synthesized", ops=ops,
                 precision=precision or row.get("precision"), metadata=extra)


def _attempt(read: Any, where: str, **fields: Any) -> Task | TaskError:
    """``_make`` of the code ``read()`` returns, or the ``TaskError`` saying why not."""
    try:
        return _make(read(), where, **fields)
    except TaskError as exc:
        return exc
    except (OSError, UnicodeDecodeError) as exc:
        return TaskError(f"{where}: cannot read: {exc}")


def _make(code: str, where: str, *, name: str, origin: str = "file",
          precision: Precision | str | None = None, **fields: Any) -> Task:
    if not isinstance(code, str) or not code.strip():
        raise TaskError(f"{where}: task code is empty")
    check_source(code, where)
    try:
        declared = Precision(precision or Precision.FP32)
    except ValueError:
        known = ", ".join(p.value for p in Precision)
        raise TaskError(f"{where}: unknown precision {precision!r} (known: {known})") from None
    return Task(name=name, code=code, origin=origin, source=where, precision=declared,
                **fields)
