"""Where does the judge's ``device`` time vary between processes? (GPU probe.)

For each target of ``timing_probe`` (eager PyTorch or a built candidate), start fresh
processes; each warms up, then times the same rotated, refilled, L2-flushed calls several
ways, measuring the SM clock (``torch.cuda._sleep`` cycles over event time) between them:

- ``device``: the judge-v5 protocol (device sync, ``blocker_pre``, ev0, call, ev1,
  ``blocker_post``, ev2, timed sync) and its terms: ``main`` (elapsed(ev0, ev1)), the tail's
  excess over calibration (``tail_x``) and the sync residual's over calibration's no-op
  calls (``resid_x``) or over idle probes interleaved with the calls (``resid_x2``,
  ``device2``: a blocker as long as the call in place of the call);
- ``busy_main``: ``main`` with the GPU kept busy by a blocker while the host prepares each
  call (judge-v6); ``longpre_main``: ``main`` with a 300 us ``blocker_pre``;
- ``piped``: events around calls issued while the host runs ahead (no blocker);
- ``pf_*``: the judge's sequence without host syncs, with the gap between calls measured on
  the device.

It prints per target and meaning the per-process medians and their spread
((max - min) / median), plus the clocks. Run on the GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/blocker_probe.py --kernelbench KB.jsonl
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
sys.path.insert(0, str(HERE))

MEANINGS = ("device", "device2", "main", "tail_x", "resid_x", "resid_x2", "shift", "idle_ms",
            "idle2_ms", "busy_main", "longpre_main", "piped", "pf_main", "pf_tail_x", "pf_gap_x",
            "pf_gap_shift")


def _clock_mhz(torch: Any, cycles: int = 2_000_000) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / a.elapsed_time(b) / 1e3


def _model(spec: dict[str, Any], ns: dict[str, Any]) -> tuple[Any, Any]:
    """The model to time and the built module whose blocker times it."""
    import importlib.util

    from cuda_agent.build.builder import load_extension

    if not spec.get("extension"):
        return ns["Model"](*ns["get_init_inputs"]()), load_extension(spec["blocker_ext"])
    ext = load_extension(spec["extension"])
    path = Path(spec["candidate_dir"]) / "model_new.py"
    module_spec = importlib.util.spec_from_file_location("model_new", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["model_new"] = module
    module_spec.loader.exec_module(module)
    return module.ModelNew(*ns["get_init_inputs"]()), ext


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _piped_full(torch: Any, timing: Any, blocker: Any, model: Any, rotation: Any, flush: Any,
                pre_ns: int, n: int) -> dict[str, list[float]]:
    """The judge's per-call sequence without host syncs: main, tail and the gap from one
    call's ev2 to the next one's ev0 (refill, flush, ``blocker_pre``), all device-side."""
    rows = []
    for i in range(n):
        inputs, _ = rotation.prepare()
        flush.zero_()
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        blocker.block(pre_ns)
        evs[0].record()
        model(*inputs)
        evs[1].record()
        blocker.block(timing.POST_NS)
        evs[2].record()
        rows.append(evs)
        if i % 20 == 19:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {"main": [], "tail": [], "gap": []}
    for i, (a, b, c) in enumerate(rows):
        out["main"].append(a.elapsed_time(b))
        out["tail"].append(b.elapsed_time(c))
        if i + 1 < len(rows) and i % 20 != 19:
            out["gap"].append(c.elapsed_time(rows[i + 1][0]))
    return out


def loaded(spec: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """The target's task namespace, its model on the GPU (eval) and the module whose
    blocker times it, in a child process."""
    import torch

    from cuda_agent.judge.worker import load_task_namespace, seed_all

    torch.cuda.init()
    ns = load_task_namespace(spec["task_code"])
    seed_all(0)
    model, ext = _model(spec, ns)
    return ns, model.cuda().eval(), ext


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from timing_probe import piped_ms

    from cuda_agent.judge import timing
    from cuda_agent.judge.worker import make_inputs

    ns, model, ext = loaded(spec)
    blocker = timing.load_blocker(ext)
    rotation = timing.Rotation(lambda k: make_inputs(ns, 1000 + k, "cuda"), 2)
    flush = torch.empty(timing.L2_FLUSH_BYTES // 4, device="cuda")
    sync, med, n = torch.cuda.synchronize, statistics.median, spec["calls"]
    out: dict[str, Any] = {"clock": []}

    def protocol(timer: Any, fn: Any, busy_ns: int = 0) -> tuple[float, float, float]:
        if busy_ns:
            sync()
            blocker.block(busy_ns)  # the GPU stays busy while the host prepares
        inputs, _ = rotation.prepare()
        flush.zero_()
        sync()
        _, main, tail, resid = timer.call(fn, inputs)
        return main, tail, resid

    with torch.no_grad():
        host = timing._warm_up(model, rotation, True, 3, spec["warmup_s"])
        timer = timing.DeviceTimer(blocker)
        timer.calibrate(med(host))
        out["pre_ns"], out["host_ms"] = timer.pre_ns, med(host)
        out["clock"].append(_clock_mhz(torch))
        first = [protocol(timer, model)[0] for _ in range(30)]
        spin_ns = int(med(first) * 1e6)
        stand_in = lambda *_: blocker.block(spin_ns)  # noqa: E731  (same length, no work)
        rows, idle = [], []
        for i in range(n):
            rows.append(protocol(timer, model))
            if i % 3 == 2:
                idle.append(protocol(timer, stand_in)[2])
        main = [r[0] for r in rows]
        resid = [r[2] for r in rows]
        tail_x = [max(0.0, r[1] - timer.post_ref_ms) for r in rows]
        out["main"], out["tail_x"] = med(main), med(tail_x)
        out["resid_x"] = med([max(0.0, r - timer.idle_ms) for r in resid])
        out["resid_x2"] = med([max(0.0, r - _p90(idle)) for r in resid])
        out["shift"] = med(resid) - med(idle)
        out["device"] = med([timing.device_sample(m, t, r, timer.post_ref_ms, timer.idle_ms)
                             for m, t, r in rows])
        out["device2"] = med([m + t + max(0.0, r - _p90(idle)) for m, t, r in
                              zip(main, tail_x, resid, strict=True)])
        out["idle_ms"], out["idle2_ms"] = timer.idle_ms, _p90(idle)
        out["device_halves"] = [med(main[: n // 2]), med(main[n // 2:])]
        out["clock"].append(_clock_mhz(torch))
        out["busy_main"] = med([protocol(timer, model, spec["busy_ns"])[0] for _ in range(n)])
        pre = timer.pre_ns
        timer.pre_ns = 300_000
        out["longpre_main"] = med([protocol(timer, model)[0] for _ in range(n)])
        timer.pre_ns = pre
        out["clock"].append(_clock_mhz(torch))
        out["piped"] = med(piped_ms(model, rotation, flush, n))
        noop = _piped_full(torch, timing, blocker, lambda *_: None, rotation, flush, pre, 60)
        full = _piped_full(torch, timing, blocker, model, rotation, flush, pre, n)
        out["pf_main"] = med(full["main"])
        out["pf_tail_x"] = med([max(0.0, t - _p90(noop["tail"])) for t in full["tail"]])
        out["pf_gap_x"] = med([max(0.0, g - _p90(noop["gap"])) for g in full["gap"]])
        out["pf_gap_shift"] = med(full["gap"]) - med(noop["gap"])
        out["clock"].append(_clock_mhz(torch))
    return out


def probe_args(parser: argparse.ArgumentParser) -> None:
    """The options every per-process probe takes (targets, processes, output, child)."""
    parser.add_argument("--kernelbench", type=Path,
                        default=HERE.parents[1] / ".bench/kernelbench.jsonl")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated target name parts")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default=None, help="(internal) run one child process")


def run_child(args: argparse.Namespace, child: Any) -> int:
    """Run ``child`` on the spec file ``--child`` names; print its record as JSON."""
    print(json.dumps(child(json.loads(Path(args.child).read_text()))))
    return 0


def selected(args: argparse.Namespace) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The targets ``--only`` names (all by default) and a built module with a blocker."""
    from timing_probe import targets

    found = targets(args.kernelbench, HERE.parents[1])
    blocker_ext = next(s["extension"] for _, s in found if s.get("extension"))
    wanted = [w for w in args.only.split(",") if w]
    return [(n, s) for n, s in found if not wanted or any(w in n for w in wanted)], blocker_ext


def main() -> int:
    parser = argparse.ArgumentParser()
    probe_args(parser)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup-s", type=float, default=0.3)
    parser.add_argument("--busy-ns", type=int, default=300_000)
    args = parser.parse_args()
    if args.child:
        return run_child(args, child)
    found, blocker_ext = selected(args)
    report: dict[str, Any] = {}
    for name, spec in found:
        spec.update(calls=args.calls, warmup_s=args.warmup_s, busy_ns=args.busy_ns,
                    blocker_ext=blocker_ext)
        path = Path(f"/tmp/blkprobe_{abs(hash(name))}.json")
        path.write_text(json.dumps(spec))
        runs = []
        for _ in range(args.processes):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--child", str(path)],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode:
                print(name, "failed:", done.stderr[-600:], flush=True)
                break
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            runs[-1]["seconds"] = round(time.perf_counter() - start, 1)
        report[name] = runs
        if len(runs) < 2:
            continue
        print(f"== {name}  (pre_ns {[r['pre_ns'] for r in runs]}, host_ms "
              f"{[round(r['host_ms'], 4) for r in runs]})", flush=True)
        for meaning in MEANINGS:
            vals = [r[meaning] for r in runs]
            spread = (max(vals) - min(vals)) / max(statistics.median(vals), 1e-9) * 100
            print(f"  {meaning:12} {' '.join(f'{v:.5f}' for v in vals)}   spread {spread:5.2f}%",
                  flush=True)
        print(f"  halves       {[[round(h, 5) for h in r['device_halves']] for r in runs]}")
        print(f"  clocks MHz   {[[round(c) for c in r['clock']] for r in runs]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
