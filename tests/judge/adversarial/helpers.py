"""Shared pieces of the adversarial suite: small tasks, candidate writers, and two ways of
judging a candidate (the project's judge, and the naive harness in a throw-away process)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.procs import alive
from cuda_agent.results import JudgeResult
from cuda_agent.tasks import load_task
from cuda_agent.tasks.task import Task
from tests.conftest import SCALE_ADD_BINDING, SCALE_ADD_KERNEL, SCALE_ADD_MODEL_NEW, SCALE_ADD_TASK
from tests.judge.adversarial import kernels

NAIVE = Path(__file__).resolve().with_name("naive.py")
ROOT = Path(__file__).resolve().parents[3]

# A real judgement, timing kept short. Hacks of the timing group override what they test.
QUICK = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.5,
                    process_timeout_s=120)


def make_task(args: str, body: str, inputs: str) -> str:
    """A KernelBench-format task without init inputs: forward(self, ARGS) returns BODY."""
    return textwrap.dedent(f'''
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, {args}):
                return {body}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
    ''').lstrip()


TASKS = {
    "scale_add": SCALE_ADD_TASK,
    # the same, with enough work per call for timing comparisons to be stable
    "scale_add_big": SCALE_ADD_TASK.replace("N = 100_003", "N = 2_000_000"),
    # every output is below 1e-4: all-zero output is within a 1e-4 absolute tolerance
    "softmax_wide": make_task("x", "torch.softmax(x, dim=1)", "[torch.randn(1, 1_000_000)]"),
    "rowsum": make_task("x", "torch.sum(x, dim=1)", "[torch.randn(64, 8192)]"),
    "scale3": make_task("x", "x * 3.0", "[torch.randn(4096)]"),
    # rows of large terms that nearly cancel: each sum is small, its rounding that of the
    # terms, so any other summation order lands outside atol=1e-4 of eager's fp32 result
    "rowsum_cancelling": make_task(
        "x", "torch.sum(x, dim=1)", "[(lambda a: torch.cat([a, -a[:, torch.randperm(4096)]], "
        "1) + torch.randn(64, 8192))(30 * torch.randn(64, 4096))]"),
    # mean squared error of two uniform inputs concentrates at 1/6
    "mse_rand": make_task("a, b", "torch.mean((a - b) ** 2)",
                      "[torch.rand(256, 2048), torch.rand(256, 2048)]"),
    # non-negative inputs keep a bf16 result within 1e-2 of the fp32 one
    "matmul_rand": make_task("a, b", "torch.matmul(a, b)",
                         "[torch.rand(128, 512), torch.rand(512, 128)]"),
    "tril_matmul": make_task("a, b", "torch.tril(torch.matmul(a, b))",
                         "[torch.randn(256, 256), torch.randn(256, 256)]"),
}


def write_task(folder: Path, name: str) -> Path:
    path = folder / f"{name}.py"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(TASKS[name])
    return path


def write_file_candidate(folder: Path, source: str, name: str = "cand.py") -> Path:
    """A single-file candidate defining ModelNew."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def write_workspace(folder: Path, model_new: str, sources: dict[str, str]) -> Path:
    """A workspace candidate: model_new.py and kernels/NAME for each of ``sources``."""
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (folder / "kernels" / name).write_text(text)
    (folder / "model_new.py").write_text(textwrap.dedent(model_new).lstrip())
    return folder


def scale_add_sources(*extra: str) -> dict[str, str]:
    """The conftest's scale_add kernel and binding, plus the named extra binding files."""
    files = {"scale_add.cpp": SCALE_ADD_KERNEL, "scale_add_binding.cpp": SCALE_ADD_BINDING}
    for name in extra:
        files[f"{name}_binding.cpp"] = getattr(kernels, name.upper())
    return files


def write_scale_add(folder: Path, model_new: str = SCALE_ADD_MODEL_NEW, *extra: str) -> Path:
    """A scale_add workspace: the honest kernel (plus ``extra`` binding files)."""
    return write_workspace(folder, model_new, scale_add_sources(*extra))


MODEL_NEW_HEADER = '''
import torch
import torch.nn as nn

import cuda_extension
'''


def scale_add_model(forward: str, header: str = "") -> str:
    """model_new.py for the scale_add task with the given body of ``forward(self, x, y)``."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    return (MODEL_NEW_HEADER + textwrap.dedent(header) + "\n\nclass ModelNew(nn.Module):\n"
            "    def __init__(self, alpha):\n        super().__init__()\n"
            "        self.alpha = alpha\n\n    def forward(self, x, y):\n" + body + "\n")


def simple_model(call: str, header: str = "") -> str:
    """model_new.py for a task without init inputs: forward returns ``call`` (uses ``inputs``)."""
    return (MODEL_NEW_HEADER + textwrap.dedent(header) + "\n\nclass ModelNew(nn.Module):\n"
            "    def forward(self, *inputs):\n" f"        return {call}\n")


# --- judging ---------------------------------------------------------------------------------

def judge(task: Path | Task, candidate: Path, config: JudgeConfig = QUICK, **update
          ) -> JudgeResult:
    """The project's judge, on the task (a trusted file, or a Task) and the candidate."""
    if update:
        config = config.model_copy(update=update)
    task = task if isinstance(task, Task) else load_task(task)
    return Judge(config).judge(task, Candidate.from_ref(candidate))


def said(result: JudgeResult) -> str:
    """Every reason and flag of a verdict, lower case, for keyword checks."""
    return " | ".join([*result.reasons, *getattr(result, "flags", ())]).lower()


def rejected(result: JudgeResult, *keywords: str) -> bool:
    """Reward -1, and (if keywords are given) one of them among the reasons/flags."""
    text = said(result)
    return result.reward == -1 and (not keywords or any(k.lower() in text for k in keywords))


def run_naive(task: Path, candidate: Path, env: dict[str, str] | None = None,
              device: str = "cpu", timeout_s: float = 300) -> tuple[bool, float]:
    """(passed, speedup) from the naive harness, run in its own process group, which is
    killed afterwards (hostile candidates leave children behind). Output goes to files, not
    pipes, which a child that inherits them would hold open."""
    env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, str(NAIVE), str(task), str(candidate),
                                 "--device", device], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"naive harness crashed (rc {proc.returncode}):\n{stderr[-3000:]}")
    record = json.loads(lines[-1])
    return bool(record["passed"]), float(record["speedup"])


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as gone."""
    if not alive(pid):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclasses.dataclass(frozen=True)
class Hack:
    """One hostile candidate: its task, how to write it, and what the judge must say."""

    task: str
    write: Callable[[Path], Path]
    keywords: tuple[str, ...] = ()  # the judge's reasons must name one of these
    marks: tuple = ()

    def param(self, name: str):
        """This hack as a pytest parameter with its id and marks."""
        return pytest.param(self, id=name, marks=self.marks)
