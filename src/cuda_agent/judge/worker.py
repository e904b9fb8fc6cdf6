"""One judge process: the reference, the torch.compile baseline or the candidate.

Started by ``cuda_agent.judge.runner`` as ``python -m cuda_agent.judge.worker JOB.json``.
It writes ``result.json`` (and output tensors) to the job's folder; whatever it does, the
judge process is not affected. The candidate's process never receives the reference
``Model`` class, its outputs or the comparison: the judge strips ``Model`` from the task
code it writes into the candidate's job.
"""

from __future__ import annotations

import ast
import json
import os
import random
import sys
import traceback
from pathlib import Path
from typing import Any


class StageError(RuntimeError):
    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


def without_model(code: str) -> str:
    """The task's code with the reference ``class Model`` removed: what a candidate gets."""
    tree = ast.parse(code)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name == "Model")]
    return ast.unparse(tree)


def load_task_namespace(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "task"}
    exec(compile(code, "task.py", "exec"), namespace)
    return namespace


def seed_all(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_inputs(namespace: dict[str, Any], seed: int, device: str) -> list[Any]:
    import torch

    seed_all(seed)
    with torch.device(device):
        inputs = list(namespace["get_inputs"]())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def set_precision(precision: str) -> None:
    import torch

    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def as_outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def load_candidate(job: dict[str, Any]) -> type:
    import importlib.util

    snapshot = Path(job["candidate_dir"])
    if job.get("extension"):
        from cuda_agent.build.builder import load_extension

        load_extension(job["extension"])
    spec = importlib.util.spec_from_file_location("model_new", snapshot / "model_new.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_new"] = module
    spec.loader.exec_module(module)
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        raise StageError("load", "model_new.py defines no class `ModelNew`")
    return model_new


class Progress(dict):
    """The result record; setting ``stage`` also writes it to a file, so the judge knows
    where a process that crashed or hung had got to."""

    def __init__(self, out: Path):
        super().__init__(ok=False, stage="start", pid=os.getpid())
        self.out = out

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == "stage":
            (self.out / "stage").write_text(str(value))


def run(job: dict[str, Any], result: dict[str, Any]) -> None:
    import torch

    from cuda_agent.judge.timing import measure

    role, device, out = job["role"], job["device"], Path(job["out_dir"])
    set_precision(job["precision"])
    result["stage"] = "load"
    namespace = load_task_namespace(job["task_code"])
    model_cls = load_candidate(job) if role == "candidate" else namespace["Model"]
    result["stage"] = "init"
    seed_all(job["seed"])
    model = model_cls(*namespace["get_init_inputs"]())
    if role == "reference":
        model = model.to(device).eval()
        torch.save(model.state_dict(), job["state_path"])
    else:
        result["stage"] = "weights"
        try:
            model.load_state_dict(torch.load(job["state_path"], weights_only=True))
        except RuntimeError as exc:
            raise StageError("weights", f"load_state_dict failed: {str(exc)[:600]}") from None
        model = model.to(device).eval()
    if role == "compile":
        model = torch.compile(model)
    if job["check"] and role != "compile":
        result["stage"] = "forward"
        for trial in range(job["trials"]):
            inputs = make_inputs(namespace, job["seed"] + trial, device)
            before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                outputs = as_outputs(model(*inputs))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            for k, (a, b) in enumerate(zip(inputs, before, strict=True)):
                if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                    raise StageError("forward", f"input {k} was modified by forward()")
            for k, value in enumerate(outputs):
                if type(value) is not torch.Tensor:
                    raise StageError("forward", f"output {k} is a {type(value).__name__}, "
                                     "not a plain torch.Tensor")
            torch.save([o.detach().cpu() for o in outputs], out / f"outputs_{trial}.pt")
    if job["time"]:
        result["stage"] = "timing"
        input_sets = [make_inputs(namespace, job["seed"] + 1000 + j, device) for j in range(2)]
        stats = measure(model, input_sets, device, **job["timing"])
        result["timing"] = stats.__dict__
    if job.get("profile"):
        result["profile"] = profile_table(model, make_inputs(namespace, job["seed"], device),
                                          device)
    result["stage"] = "done"


def profile_table(model: Any, inputs: list[Any], device: str, rows: int = 15) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), profile(activities=activities) as prof:
        for _ in range(3):
            model(*inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out_dir"])
    result = Progress(out)
    try:
        run(job, result)
        result["ok"] = True
    except StageError as exc:
        result["stage"], result["error"] = exc.stage, str(exc)
    except BaseException as exc:  # the candidate's own errors, reported not raised
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        result["error"] = f"{type(exc).__name__}: {str(exc)[:800]}"
        result["traceback"] = "".join(tb)[-3000:]
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / "result.json")
    sys.stdout.flush()
    # skip interpreter teardown: a candidate's static destructors or threads cannot hang us
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
