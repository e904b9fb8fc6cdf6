"""A deliberately naive, one-process harness, as many public kernel benchmarks are written.

It is the foil of the adversarial suite: every hostile candidate must pass it (else the
test proves nothing), and the project's judge must not. What makes it naive:

- the reference ``Model`` and ``ModelNew`` live in the same process (the reference class,
  its output and the comparison function are all reachable by the candidate);
- one seeded input set, used for the check and again for every timed call;
- ``torch.allclose(atol=1e-2, rtol=1e-2)`` and nothing else;
- wall time of 10 calls with ``time.perf_counter``, no synchronisation.

    python tests/judge/adversarial/naive.py TASK.py CANDIDATE [--device cpu]

prints one JSON line ``{"passed": ..., "speedup": ...}``. ``naive_harness`` is the same
thing as a function; use it only in a throw-away process (hostile candidates patch torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

SEED = 42
TIMED_CALLS = 10


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_candidate(candidate: Path, device: str):
    """Import a single-file candidate, or build and import a workspace candidate."""
    if candidate.is_dir():
        from cuda_agent.build import BuildConfig, Builder, load_extension

        build = Builder(BuildConfig(device=device)).build(candidate)
        if not build.ok:
            raise RuntimeError(f"build failed:\n{build.log[-2000:]}")
        load_extension(build.extension_path)
        return _import(candidate / "model_new.py", "model_new")
    return _import(candidate, "model_new")


def _outputs(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _close(out, expected) -> bool:
    try:
        return bool(torch.allclose(out, expected, atol=1e-2, rtol=1e-2))
    except Exception:
        return False


def naive_harness(task_path: str | Path, candidate: str | Path, device: str = "cpu"
                  ) -> tuple[bool, float]:
    """(passed, speedup) of ``candidate`` on the task, judged the naive way."""
    task = _import(Path(task_path), "reference_task")
    model_new_module = load_candidate(Path(candidate), device)
    init = task.get_init_inputs()
    torch.manual_seed(SEED)
    model = task.Model(*init).to(device)
    model_new = model_new_module.ModelNew(*init).to(device)
    model_new.load_state_dict(model.state_dict())
    torch.manual_seed(SEED)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    with torch.no_grad():
        expected = model(*inputs)
        got = model_new(*inputs)
        want, have = _outputs(expected), _outputs(got)
        passed = len(want) == len(have) and all(
            _close(o, e) for o, e in zip(have, want, strict=True))
        begin = time.perf_counter()
        for _ in range(TIMED_CALLS):
            model(*inputs)
        reference_s = time.perf_counter() - begin
        begin = time.perf_counter()
        for _ in range(TIMED_CALLS):
            model_new(*inputs)
        candidate_s = time.perf_counter() - begin
    speedup = reference_s / candidate_s if candidate_s > 0 else float("inf")
    return passed, speedup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("candidate")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    passed, speedup = naive_harness(args.task, args.candidate, args.device)
    print(json.dumps({"passed": passed, "speedup": speedup}), flush=True)
    # a hostile candidate may leave non-daemon threads behind: do not wait for them
    os._exit(0)


if __name__ == "__main__":
    main()
