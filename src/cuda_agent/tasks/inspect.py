"""Run a task's code in a separate process and describe its inputs and outputs.

This is the runtime half of task validation: ``get_inputs`` raising, returning something
other than a list of tensors, or ``Model`` failing to construct are reported as
``TaskError`` naming the problem. Shapes are taken on the ``meta`` device where the code
allows, so even multi-gigabyte tasks inspect in a second.

    python -m cuda_agent.tasks.inspect TASK_FILE   # prints a JSON TaskSpec
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.tasks.task import Task, TaskError


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype.removeprefix('torch.')}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class TaskSpec:
    """What a task consumes and produces, as seen on one call."""

    inputs: tuple[TensorSpec, ...]
    init_inputs: str
    outputs: tuple[TensorSpec, ...] | None


_SPECS: dict[str, TaskSpec] = {}
"""Specs of the tasks this process has inspected, by the hash of their code."""


def inspect_task(task: Task, timeout_s: float = 120.0) -> TaskSpec:
    """Execute the task in a fresh interpreter; raise ``TaskError`` if it is malformed.

    A spec is kept for the life of this process (keyed by the hash of the task's code), so
    rollouts and PPO steps that make a workspace per episode start one interpreter (seconds
    of CPU) per task, not per episode; a failed inspection is not kept."""
    spec = _SPECS.get(task.sha256)
    if spec is None:
        spec = _SPECS[task.sha256] = _inspect(task, timeout_s)
    return spec


def _inspect(task: Task, timeout_s: float) -> TaskSpec:
    report = run_probe(task, "cuda_agent.tasks.inspect", (), "inspecting the task",
                       "inspection", timeout_s)
    outputs = report.get("outputs")
    return TaskSpec(
        inputs=tuple(TensorSpec(tuple(s["shape"]), s["dtype"]) for s in report["inputs"]),
        init_inputs=report["init_inputs"],
        outputs=None if outputs is None else tuple(
            TensorSpec(tuple(s["shape"]), s["dtype"]) for s in outputs),
    )


def run_probe(task: Task, module: str, args: tuple[str, ...], doing: str, name: str,
              timeout_s: float) -> dict:
    """The JSON report ``python -m module TASK_FILE *args`` prints last of ``task``'s code,
    run in a fresh interpreter; ``TaskError`` naming ``doing`` (its timeout) or ``name``
    (its crash) when there is none, or the report's own ``error``."""
    where = task.source or task.name
    with tempfile.TemporaryDirectory(prefix="cuda-agent-inspect-") as tmp:
        path = Path(tmp) / "model.py"
        path.write_text(task.code)
        try:
            proc = subprocess.run([sys.executable, "-m", module, str(path), *args],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise TaskError(f"{where}: {doing} took over {timeout_s:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TaskError(f"{where}: {name} crashed: {tail}")
    report = json.loads(lines[-1])
    if "error" in report:
        raise TaskError(f"{where}: {report['error']}")
    return report


def _describe(path: str) -> dict:
    import torch

    namespace: dict = {"__name__": "task_under_inspection"}
    try:
        exec(compile(Path(path).read_text(), path, "exec"), namespace)
    except Exception as exc:  # the task's own code failed at import
        return {"error": f"importing the task raised {type(exc).__name__}: {exc}"}
    inputs = _call(namespace, "get_inputs")
    if isinstance(inputs, str):
        return {"error": inputs}
    init_inputs = _call(namespace, "get_init_inputs", meta=False)
    if isinstance(init_inputs, str):
        return {"error": init_inputs}
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            return {"error": f"get_inputs() returned a {type(value).__name__} at position {i}; "
                             "every input must be a torch.Tensor"}
    specs = [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in inputs]
    outputs = None
    try:
        with torch.device("meta"):
            model = namespace["Model"](*init_inputs)
            out = model(*[t.to("meta") for t in inputs])
        outs = out if isinstance(out, (tuple, list)) else [out]
        if all(isinstance(o, torch.Tensor) for o in outs):
            outputs = [{"shape": list(o.shape), "dtype": str(o.dtype)} for o in outs]
    except Exception:  # some operators have no meta kernel; shapes stay unknown
        try:
            namespace["Model"](*init_inputs)
        except Exception as exc:
            return {"error": f"Model(*get_init_inputs()) raised {type(exc).__name__}: {exc}"}
    return {"inputs": specs, "init_inputs": repr(list(init_inputs)), "outputs": outputs}


def _call(namespace: dict, name: str, meta: bool = True) -> list | str:
    import torch

    fn = namespace.get(name)
    if not callable(fn):
        return f"`{name}` is not callable"
    try:
        if meta:
            try:
                with torch.device("meta"):
                    result = fn()
            except Exception:
                result = fn()
        else:
            result = fn()
    except Exception as exc:
        return f"{name}() raised {type(exc).__name__}: {exc}"
    if not isinstance(result, (list, tuple)):
        return f"{name}() must return a list, got {type(result).__name__}"
    return list(result)


if __name__ == "__main__":
    print(json.dumps(_describe(sys.argv[1])))
