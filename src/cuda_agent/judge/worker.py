"""One judge process: the reference, the torch.compile baseline or the candidate.

Started by ``cuda_agent.judge.runner`` as ``python -m cuda_agent.judge.worker OUT MARK_FD
[PRELOAD]``; it imports torch at once (and, unless PRELOAD is ``torch``, what the candidate's
dispatch-mode trace needs), then reads its job (one JSON line) from stdin, so it can start
while the kernels build. Results go to ``OUT/result.json`` and tensor files; timing marks go
to the file descriptor ``MARK_FD``, which the judge timestamps with its own clock. The
candidate's process never receives the reference ``Model`` (the judge strips it from the
task code), the reference outputs or the comparison.

A worker dies with the judge (``hold_lifeline``). Held after its report, a baseline's
worker serves the judge's further jobs; a candidate's only waits, whatever its code did
meanwhile, until the judge, having read what it loaded, closes its stdin.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import random
import select
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import timing  # noqa: F401  (binds the clocks before candidate code)

ERROR_CHARS = 16_000
"""The most of an exception's message a report keeps: enough for the compiler's log that
``load_inline``'s error carries (the judge picks the compiler's errors out of it)."""

LIFELINE_ENV = "CUDA_AGENT_LIFELINE_FD"
"""The environment variable naming the worker's end of its lifeline (``hold_lifeline``)."""


class StageError(RuntimeError):
    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


class Progress(dict):
    """The result record; setting ``stage`` also writes it to a file, so the judge knows
    where a process that crashed or hung had got to."""

    def __init__(self, out: Path):
        super().__init__(ok=False, stage="start", pid=os.getpid(), stage_at={"start": time.time()})
        self.out = out

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == "stage":
            self["stage_at"][str(value)] = time.time()  # wall clock, comparable across processes
            (self.out / "stage").write_text(str(value))


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

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_inputs(namespace: dict[str, Any], seed: int, device: str, scale: float = 1.0
                ) -> list[Any]:
    seed_all(seed)
    with torch.device(device):
        inputs = list(namespace["get_inputs"]())
    out = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if scale != 1.0:
        out = [x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
               for x in out]
    return out


def set_precision(precision: str) -> None:
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def autocast(precision: str, device: str):
    import contextlib

    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device.split(":")[0], dtype=dtype)
    return contextlib.nullcontext()


def as_outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def run(job: dict[str, Any], out: Path, result: Progress) -> None:
    from cuda_agent.judge import harness, roles

    role, device = job["role"], job["device"]
    set_precision(job["precision"])
    result["stage"] = "load"
    namespace = load_task_namespace(job["task_code"])
    if role == "candidate":
        harness.candidate(job, namespace, out, result)
    else:
        roles.baseline(job, namespace, out, result, device)
    result["stage"] = "done"


def _report(result: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(result)))
    tmp.replace(path)


def _follow_ups(out: Path, mark) -> None:
    """A held worker's further jobs, one JSON line each, until stdin closes (the
    reference's kept calls, ``roles.reference_kept``, or a fresh timing of its calls,
    ``roles.reference_check``); each result goes to ``result-N.json``, then ``ready`` is
    marked."""
    from cuda_agent.judge import roles

    for number, line in enumerate(sys.stdin, start=1):
        result: dict[str, Any] = {"ok": False, "stage": "followup"}
        try:
            job = json.loads(line)
            if job.get("check_time"):
                roles.reference_check(job, result)
            else:
                roles.reference_kept(job, out, result, number)
            result["ok"] = True
        except BaseException as exc:
            result["error"] = f"{type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"
            result["traceback"] = "".join(traceback.format_exception(
                type(exc), exc, exc.__traceback__))[-3000:]
        _report(result, out / f"result-{number}.json")
        mark("ready")


def _until_closed() -> None:
    """A held candidate's worker: wait until the judge closes stdin (having checked what the
    process loaded), never importing or running anything of the judge's again (its modules
    are hidden from the candidate by then). Where stdin cannot be read (the candidate's code
    closed it), wait until the judge kills it."""
    while True:
        try:
            if not os.read(0, 1 << 16):
                return
        except BaseException:
            with contextlib.suppress(BaseException):
                time.sleep(1.0)


def _held(out: Path, mark, candidate: bool) -> None:
    """After the report: ``ready``, then a baseline serves further jobs (``_follow_ups``), a
    candidate waits (``_until_closed``). Whatever fails here, the worker stays until the
    judge lets it go (closes stdin): it is what the judge inspects while held."""
    try:
        mark("ready")
        if not candidate:
            _follow_ups(out, mark)
            return
    except BaseException:
        pass
    _until_closed()


def hold_lifeline() -> None:
    """Die with the judge: the worker's end of a pipe only the judge can write to (named by
    ``LIFELINE_ENV``) raises SIGIO, whose default action ends the process, the moment the
    judge's end closes, which its death does (even by SIGKILL). SIGIO's default action and
    delivery are restored first (both are inherited); a judge gone already ends it now."""
    fd = os.environ.get(LIFELINE_ENV)
    if fd is None or not fd.isdigit():
        return
    end = int(fd)
    signal.signal(signal.SIGIO, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGIO})
    fcntl.fcntl(end, fcntl.F_SETSIG, 0)  # 0: SIGIO itself
    fcntl.fcntl(end, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(end, fcntl.F_SETFL, fcntl.fcntl(end, fcntl.F_GETFL) | os.O_ASYNC)
    if select.select([end], [], [], 0)[0]:  # no one writes to it: readable means closed
        os._exit(1)


def preload(trace: bool = True) -> None:
    """Import now what the first dispatch-mode call would import lazily (torch's dynamo and
    higher-order operators: seconds of CPU even with bytecode cached), while the worker still
    waits for its job. Only the candidate's process traces: ``trace=False`` (the reference's
    and the compile baseline's) imports NumPy alone."""
    import numpy  # noqa: F401  (seed_all)

    if not trace:
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Pass(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _Pass():
        torch.ones(2).add_(1)


def prepare(device: str, fields: dict[str, Any]) -> None:
    """Make ``device``'s context now (not at the first allocation), start and stop the
    activity recorder once where ``fields`` ask (``record``, or a candidate's job that
    records), and map a device pack that
    ``fields`` (a ``prepare`` line or the job) name, unless one was mapped already: before
    any candidate code runs."""
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.cuda.synchronize(device)
        wanted = fields.get("record") or (fields.get("activity")
                                          and fields.get("role") == "candidate")
        if wanted:
            from cuda_agent.judge.activity import warm_recorder

            warm_recorder()
    if fields.get("pack") == "cuda-fd":
        from cuda_agent.judge import device_pack

        if not device_pack.received():
            device_pack.receive(fields)


def main(out_dir: str, mark_fd: str, imports: str = "trace") -> int:
    hold_lifeline()
    out = Path(out_dir)
    fd = int(mark_fd)

    def mark(label: str) -> None:
        os.write(fd, f"{label}\n".encode())

    result = Progress(out)
    job: dict[str, Any] = {}
    try:
        preload(trace=imports != "torch")
        result["stage_at"]["preloaded"] = time.time()
        mark("idle")
        job = json.loads(sys.stdin.readline())
        while "prepare" in job:  # the device (and pack) first, while the judge builds
            prepare(str(job["prepare"]), job)
            result["stage_at"]["prepared"] = time.time()
            mark("prepared")  # done on the device: a judge sharing the GPU waits for it
            job = json.loads(sys.stdin.readline())
        result["stage_at"]["job"] = time.time()
        prepare(job["device"], job)  # what no prepare line did yet
        run(job, out, result)
        result["stage_at"]["done"] = time.time()
        result["ok"] = True
        if job["device"].startswith("cuda"):
            torch.cuda.empty_cache()  # only the output pack stays while the judge copies it
    except StageError as exc:
        result["stage"], result["error"] = exc.stage, str(exc)
    except BaseException as exc:  # the candidate's own errors, reported not raised
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        result["error"] = f"{type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"
        result["traceback"] = "".join(tb)[-3000:]
    try:  # the candidate's code may have replaced any of this: it cannot end the worker
        _report(result, out / "result.json")
        sys.stdout.flush()
    except BaseException:
        pass
    if job.get("hold"):  # mapped and inspectable until the judge lets go
        _held(out, mark, job.get("role") == "candidate")
    # skip interpreter teardown: a candidate's static destructors or threads cannot hang us
    os._exit(0)


if __name__ == "__main__":
    # run the package's copy of this module, so exception classes match those of roles.py
    from cuda_agent.judge.worker import main as package_main

    sys.exit(package_main(*sys.argv[1:4]))
