"""Which time meaning is steady across processes? (GPU probe for the judge's timing rules.)

For each target (eager PyTorch or a built candidate), start 5 fresh processes; each warms
up for a fixed time, then times the same rotated, refilled, L2-flushed calls three ways:

- ``wall``: per-call wall time between device-wide synchronisations (judge-v2's meaning);
- ``event``: CUDA events around the same calls (device time on the calling stream);
- ``piped``: CUDA events around calls issued without a host synchronisation in between.

It prints, per target and meaning, the per-process medians and their spread
((max - min) / median). Run on the GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/timing_probe.py --kernelbench KB.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from cuda_agent.judge.timing import L2_FLUSH_BYTES, Rotation
    from cuda_agent.judge.worker import load_task_namespace, make_inputs, seed_all

    torch.cuda.init()
    ns = load_task_namespace(spec["task_code"])
    seed_all(0)
    if spec.get("extension"):
        import importlib.util

        from cuda_agent.build.builder import load_extension

        load_extension(spec["extension"])
        path = Path(spec["candidate_dir"]) / "model_new.py"
        module_spec = importlib.util.spec_from_file_location("model_new", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["model_new"] = module
        module_spec.loader.exec_module(module)
        model = module.ModelNew(*ns["get_init_inputs"]())
    else:
        model = ns["Model"](*ns["get_init_inputs"]())
    model = model.cuda().eval()
    rotation = Rotation(lambda k: make_inputs(ns, 1000 + k, "cuda"), 2)
    flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    sync = torch.cuda.synchronize
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    wall: list[float] = []
    event: list[float] = []
    piped: list[float] = []
    with torch.no_grad():
        end = time.perf_counter() + spec["warmup_s"]
        while time.perf_counter() < end:
            model(*rotation.prepare()[0])
        sync()
        for _ in range(spec["calls"]):
            inputs, _ = rotation.prepare()
            flush.zero_()
            sync()
            t0 = time.perf_counter()
            ev[0].record()
            model(*inputs)
            ev[1].record()
            sync()
            wall.append((time.perf_counter() - t0) * 1e3)
            event.append(ev[0].elapsed_time(ev[1]))
        piped = piped_ms(model, rotation, flush, spec["calls"])
    med = statistics.median
    return {"wall": med(wall), "event": med(event), "piped": med(piped),
            "gap_us": med([(w - e) * 1e3 for w, e in zip(wall, event, strict=True)]),
            "clock_mhz": _clock()}


def piped_ms(model: Any, rotation: Any, flush: Any, calls: int) -> list[float]:
    """Events around each call, calls issued while the host runs ahead (a sync every 20)."""
    import torch

    pairs = []
    for _ in range(calls):
        inputs, _ = rotation.prepare()
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(*inputs)
        b.record()
        pairs.append((a, b))
        if len(pairs) % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in pairs]


def _clock() -> int | None:
    try:
        query = ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except Exception:
        return None


def targets(kb: Path, build_home: Path) -> list[tuple[str, dict[str, Any]]]:
    from cuda_agent.build.builder import BuildConfig, Builder

    rows = {r["problem_id"]: r for r in map(json.loads, kb.read_text().splitlines())
            if r.get("level") == 1}
    builder = Builder(BuildConfig(device="cuda"))
    out: list[tuple[str, dict[str, Any]]] = []
    relu = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
            "    def forward(self, x):\n        return torch.relu(x)\n"
            "def get_inputs():\n    return [torch.randn(4096, 4096)]\n"
            "def get_init_inputs():\n    return []\n")
    out.append(("eager relu 16M (~25us)", {"task_code": relu}))
    for pid, folder in ((12, "12_Matmul_with_diagonal_matrices_"), (40, "40_LayerNorm")):
        code = rows[pid]["code"]
        out.append((f"eager 1/{pid}", {"task_code": code}))
        where = ROOT / "benchmarks/kernelbench_l1" / folder
        built = builder.build(where)
        if built.ok:
            out.append((f"cand 1/{pid}", {"task_code": code, "extension": built.extension_path,
                                          "candidate_dir": str(where)}))
    cal = (HERE / "calibrated/task.py").read_text()
    out.append(("eager calibrated", {"task_code": cal}))
    built = builder.build(HERE / "calibrated/candidate")
    if built.ok:
        out.append(("cand calibrated", {"task_code": cal, "extension": built.extension_path,
                                        "candidate_dir": str(HERE / "calibrated/candidate")}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench", type=Path, default=ROOT / ".bench/kernelbench.jsonl")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup-s", type=float, default=0.3)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0
    print(f"{'target':26} {'meaning':6} {'per-process medians (ms)':58} spread  gap_us")
    for name, spec in targets(args.kernelbench, ROOT):
        spec.update(calls=args.calls, warmup_s=args.warmup_s)
        path = Path(f"/tmp/probe_{abs(hash(name))}.json")
        path.write_text(json.dumps(spec))
        runs = []
        for _ in range(args.processes):
            done = subprocess.run([sys.executable, __file__, "--child", str(path)],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode:
                print(name, "failed:", done.stderr[-400:])
                break
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if len(runs) < 2:
            continue
        for meaning in ("wall", "event", "piped"):
            vals = [r[meaning] for r in runs]
            spread = (max(vals) - min(vals)) / statistics.median(vals) * 100
            gaps = " ".join(f"{r['gap_us']:.1f}" for r in runs) if meaning == "event" else ""
            print(f"{name:26} {meaning:6} {' '.join(f'{v:.5f}' for v in vals):58} "
                  f"{spread:5.2f}%  {gaps}", flush=True)
        print(f"{'':26} clocks MHz: {[r['clock_mhz'] for r in runs]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
