"""Shared fixtures: one cuda-agent state folder per test session (so the fixed binding layer
compiles once), small KernelBench-format tasks, the shared KernelBench copy, and results
made once per run for the tests that read them."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

KERNELBENCH = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "kernelbench.jsonl"

SCALE_ADD_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return self.alpha * x + y


N = 100_003


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return [1.5]
'''

SCALE_ADD_KERNEL = '''
#include <cstdint>
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config) {
  (void)config;
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = alpha * x[i] + y[i];
}
'''

SCALE_ADD_BINDING = '''
#include "binding_registry.h"
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config);

static cuda_ext::Outputs scale_add(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& y = args.tensor(1);
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32 && x.is_contiguous(), "x: float32");
  CUDA_EXT_CHECK(y.numel() == x.numel() && y.is_contiguous(), "y must match x");
  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                   static_cast<float>(args.real(2)), 0);
  return {out};
}
REGISTER_BINDING(scale_add, "scale_add(x, y, alpha) -> alpha * x + y", scale_add);
'''

SCALE_ADD_MODEL_NEW = '''
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return cuda_extension.scale_add(x.contiguous(), y.contiguous(), self.alpha)
'''


# the ModelNew of a single-file candidate whose extension module is ``ext``
EXT_SCALE_ADD_MODEL_NEW = '''

class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return ext.scale_add(x, y, self.alpha)
'''

# a single-file candidate: its C++ compiled by load_inline when it is imported
INLINE_SCALE_ADD = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
#include <torch/extension.h>
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = alpha * px[i] + py[i];
  return out;
}
"""
ext = load_inline("inline_scale_add", cpp_sources=SOURCE, functions=["scale_add"])
''' + EXT_SCALE_ADD_MODEL_NEW


def pytest_configure(config: pytest.Config) -> None:
    # a folder shared by the whole session, so the torch binding layer compiles only once
    home = os.environ.get("CUDA_AGENT_TEST_HOME") or str(
        Path(config.rootpath) / ".pytest_cache" / "cuda-agent-home")
    os.environ["CUDA_AGENT_HOME"] = home
    config.pluginmanager.register(SlowFirst(), "cuda-agent-slow-first")


class SlowFirst:
    """Under pytest-xdist, start each worker's share of the tests with its slow ones.

    The scheduler hands worker k the k-th contiguous slice of the collection and lets idle
    workers steal from the end of the others' queues; with the tests marked ``slow`` dealt
    round-robin to the front of each slice, no worker gets them all and none is left with a
    long test at the end while the others idle. The first worker starts with a test that
    compiles the fixed binding layer most tests link (tens of seconds, once per session);
    the others start with slow tests that build nothing (``BUILD_FREE``), so none waits.
    Slow tests that read one result made once per run (``ONCE_PER_RUN``) are dealt together,
    to one worker, so no other worker waits for it while the first one makes it; being the
    longest units, they are dealt first."""

    BUILD_FREE = ("tests/synth/",)
    ONCE_PER_RUN = ("builtin_replay_run", "fresh_inline")

    @pytest.hookimpl(trylast=True)  # after deselection (-m, -k) and fixture-scope ordering
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
        if workers < 2:
            return
        slow = self._units([i for i in items
                            if "slow" in i.keywords and not i.get_closest_marker("skip")])
        free = [u for u in slow if all(i.nodeid.startswith(self.BUILD_FREE) for i in u)]
        built = [u for u in slow if u not in free]
        built[1:] = sorted(built[1:], key=len, reverse=True)  # the shared results' first
        slow = built[:1] + free + built[1:]  # dealt: worker 0 gets built[0], the next free[0]
        chosen = {id(i) for unit in slow for i in unit}
        rest = iter([i for i in items if id(i) not in chosen])
        ordered, left = [], len(items)
        for k in range(workers):
            size = left // (workers - k)  # the slice this worker gets (scheduler/worksteal.py)
            left -= size
            mine = [i for unit in slow[k::workers] for i in unit]
            ordered += mine + [next(rest) for _ in range(max(0, size - len(mine)))]
        items[:] = ordered + list(rest)

    def _units(self, slow: list[pytest.Item]) -> list[list[pytest.Item]]:
        """The slow tests in units dealt whole: one test each, or all those that use one
        fixture of ``ONCE_PER_RUN``."""
        units: list[list[pytest.Item]] = []
        shared: dict[str, list[pytest.Item]] = {}
        for item in slow:
            names = getattr(item, "fixturenames", ())
            key = next((name for name in self.ONCE_PER_RUN if name in names), None)
            if key is None:
                units.append([item])
            elif key in shared:
                shared[key].append(item)
            else:
                units.append(shared.setdefault(key, [item]))
        return units


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    for item in items:
        if item.name.startswith("test_naive_harness_is_fooled"):
            item.add_marker(pytest.mark.naive)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(no_nvcc)


@contextlib.contextmanager
def once_per_run(factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder ``name`` made once per test run, whichever process needs it first: yields
    (folder, made) under a lock that the other xdist workers wait on; ``made`` is false for
    a folder an earlier holder already filled (the body fills it when it is true)."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder: every worker's own lies within
    folder = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / ".done"
        made = not done.exists()
        if made:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        yield folder, made
        done.touch()


@dataclasses.dataclass(frozen=True)
class OptimizeRun:
    """The README's quick start, ``.venv/bin/cuda-agent optimize``, run from a shell in a
    fresh folder: its exit code, output (stdout and stderr) and the run folder it wrote."""

    exit_code: int
    output: str
    out: Path


README_OPTIMIZE = ".venv/bin/cuda-agent optimize"
"""The README's main job, as typed (the docs test's shell adds only quick judge settings)."""


@pytest.fixture(scope="session")
def builtin_replay_run(tmp_path_factory: pytest.TempPathFactory) -> OptimizeRun:
    """The shipped replay of the built-in example solved on the CPU by the README's quick
    start (a real episode: builds, judgements, a final verdict), once for the whole run: the
    README's own test and the tests that read its folder share it, as the xdist workers do."""
    import json

    from tests.test_docs import run_command

    with once_per_run(tmp_path_factory, "builtin-replay") as (folder, made):
        record = folder / "run.json"
        if made:
            user = folder / "user"
            user.mkdir()
            done = run_command(README_OPTIMIZE, user)
            runs = sorted((user / "cuda-agent-runs").glob("gelu_bias_scale-*"))
            record.write_text(json.dumps({
                "exit_code": done.returncode, "output": done.stdout + done.stderr,
                "out": str(runs[0] if len(runs) == 1 else user / "cuda-agent-runs")}))
        fields = json.loads(record.read_text())
    return OptimizeRun(fields["exit_code"], fields["output"], Path(fields["out"]))


@pytest.fixture
def scale_add_task(tmp_path: Path) -> Path:
    path = tmp_path / "scale_add.py"
    path.write_text(SCALE_ADD_TASK)
    return path


def write_solution(root: Path) -> None:
    """Write the honest CPU solution of the scale_add task into a workspace."""
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    (root / "kernels" / "scale_add.cpp").write_text(SCALE_ADD_KERNEL)
    (root / "kernels" / "scale_add_binding.cpp").write_text(SCALE_ADD_BINDING)
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW)


@pytest.fixture
def kernelbench() -> Path:
    if not KERNELBENCH.exists():
        pytest.skip("../shared/kernelbench/kernelbench.jsonl not present")
    return KERNELBENCH


def compile_cuda_units(root: Path) -> list[tuple]:
    """Compile a workspace's own CUDA sources for sm_90a without a GPU and without linking
    (the fixed layer needs torch's CUDA headers, absent from a CPU build of torch): the
    builder's ``(source, status, object, log)`` for each unit."""
    from concurrent.futures import ThreadPoolExecutor

    from cuda_agent.build import BuildConfig, Builder, toolchain

    builder = Builder(BuildConfig(device="cuda", arch="90a"))
    chain = toolchain.detect("cuda", builder.cache, arch="90a")
    files = builder.kernel_files(root)
    with ThreadPoolExecutor() as threads:
        return list(threads.map(lambda source: builder._object(source, chain, files),
                                [rel for rel, _ in files.sources]))

