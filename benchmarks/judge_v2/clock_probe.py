"""Does the SM clock, or where memory lands, explain why device time differs from one process
to the next? (GPU probe.)

For each target of ``timing_probe`` and each warm-up length, start fresh processes; each
warms up like the judge (untimed calls for ``--warmup-s`` seconds), then times ``--blocks``
blocks of calls with the judge-v6 protocol (the GPU kept busy while the host prepares each
call; ``main`` = elapsed(ev0, ev1)), reading the SM clock before each block
(``torch.cuda._sleep`` cycles over event time, and NVML's SM clock where ``pynvml`` or
``libnvidia-ml`` is there). It prints per target and warm-up: each process's median time and
clock, the spread of the medians ((max - min) / median), the spread after scaling each
median by its process's clock (what the spread would be if the clock were the only cause),
and the correlation of block medians with block clocks inside processes.

``--variants`` changes where memory lands: ``base`` (the judge's two input buffers, outputs
freed after each call), ``spread`` (8 input buffers, the last 6 outputs kept alive, so
outputs and intermediates cycle through other blocks), ``jitter`` (a tensor of random size,
0-64 MiB in 2 MiB steps, allocated before each call and freed after it, so the caching
allocator places the call's memory elsewhere each time), ``replace`` (before each block,
every buffer freed, the allocator's cache emptied, a spacer of 0-2 GiB allocated and kept
for the block, inputs and flush buffer allocated anew: each block's memory on other
physical pages); and the protocol: ``clean`` (the L2
flushed by reading the flush buffer, so that the cache holds clean lines instead of the
dirty ones ``zero_`` leaves, whose write-back the call would pay), ``nogate`` (judge-v7's
blockers on the calling stream instead of the gate), ``streams`` (the gate's holder and
calling streams rotated among 4 pairs, call by call; per-pair medians printed), ``late``
(``ev0`` recorded after the gate's release), ``empty`` (after each timed call, an empty call
and a fixed 20 us spin timed through the gate: the gate's own time, per process); ``+``
joins them (``clean+late``). ``--burst K`` runs K processes of each way back to back in
every round, as a judgement runs its baseline processes, so that ``estimator_probe.py`` can
tell a part shared by neighbouring processes from each process's own. Every block keeps its
calls' times for ``estimator_probe.py``. Run on the
GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/clock_probe.py --kernelbench KB.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _nvml_clock() -> Any:
    """A function returning NVML's current SM clock (MHz) of GPU 0, or None."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        handle = ctypes.c_void_p()
        if lib.nvmlInit_v2() or lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)):
            return None
    except OSError:
        return None

    def read() -> tuple[float | None, int | None]:
        """The SM clock (MHz) and the clock-event reasons bitmask (power, thermal, ...)."""
        mhz, reasons = ctypes.c_uint(), ctypes.c_ulonglong()
        clock = None if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(mhz)) else mhz.value
        why = None if lib.nvmlDeviceGetCurrentClocksThrottleReasons(
            handle, ctypes.byref(reasons)) else reasons.value
        return clock, why

    return read


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from blocker_probe import _clock_mhz, loaded

    from cuda_agent.judge import device_timer, timing
    from cuda_agent.judge.worker import make_inputs

    ns, model, ext = loaded(spec)
    ways = set(spec.get("variant", "base").split("+"))
    device_timer.GATE = "nogate" not in ways
    device_timer.EV0_AFTER_OPEN = "late" in ways
    timer = timing.DeviceTimer(timing.load_blocker(ext))
    variant = spec.get("variant", "base")
    rotation = timing.Rotation(lambda k: make_inputs(ns, 1000 + k, "cuda"), 2)
    if variant == "spread":
        rotation.buffers += [[x.clone() for x in rotation.buffers[0]] for _ in range(6)]
    flush = torch.zeros(timing.L2_FLUSH_BYTES // 4, device="cuda")
    nvml = _nvml_clock()
    blocks: list[dict[str, Any]] = []
    kept: list[Any] = []
    pairs: list[tuple[float, float]] = []
    rng = __import__("random").Random()
    pairs_of_streams = [(torch.cuda.Stream(), torch.cuda.Stream()) for _ in range(4)]
    by_pair: list[list[float]] = [[] for _ in pairs_of_streams]

    def call(inputs: list[Any]) -> float:
        spacer = torch.empty(rng.randrange(33) * (1 << 19), device="cuda") \
            if variant == "jitter" else None
        if "streams" in ways:  # the holder's and the calling stream rotated per call
            k = len(pairs) % len(pairs_of_streams)
            timer._own, calling = pairs_of_streams[k]
            with torch.cuda.stream(calling):
                out, main = timer.call(model, inputs)[:2]
            by_pair[k].append(main)
        else:
            out, main = timer.call(model, inputs)[:2]
        if variant == "spread":
            kept.append(out)
            del kept[:-6]
        del spacer
        return main

    with torch.no_grad():
        host = timing._warm_up(model, rotation, True, 3, spec["warmup_s"])
        timer.calibrate(statistics.median(host))
        placed = None
        for _ in range(spec["blocks"]):
            if "replace" in ways:  # new device memory for this block, elsewhere
                del rotation, flush, placed
                kept.clear()
                torch.cuda.empty_cache()
                placed = torch.empty(rng.randrange(1024) << 19, device="cuda")  # 0-2 GiB
                rotation = timing.Rotation(lambda k: make_inputs(ns, 1000 + k, "cuda"), 2)
                flush = torch.zeros(timing.L2_FLUSH_BYTES // 4, device="cuda")
                timing._warm_up(model, rotation, True, 3, 0.0)
            clock = _clock_mhz(torch, 400_000)
            nv, why = nvml() if nvml else (None, None)
            main, flushes, empties, spins = [], [], [], []
            for _ in range(spec["calls"]):
                inputs, flush_ms = _prepare(torch, timer, rotation, flush, variant)
                main.append(call(inputs))
                flushes.append(flush_ms)
                pairs.append((flush_ms, main[-1]))
                if "empty" in ways:  # the gate alone, then a fixed 20 us spin through it
                    torch.cuda.synchronize()
                    empties.append(timer.call(lambda: None, [])[1])
                    torch.cuda.synchronize()
                    spins.append(timer.call(lambda: timer.blocker.block(20_000), [])[1])
            blocks.append({"clock": clock, "nvml": nv, "reasons": why,
                           "main": statistics.median(main),
                           "flush": statistics.median(flushes),
                           "calls": [round(m, 6) for m in main],
                           "flushes": [round(f, 6) for f in flushes],
                           "empties": [round(e, 6) for e in empties],
                           "spins": [round(e, 6) for e in spins]})
    return {"blocks": blocks, "main": statistics.median(b["main"] for b in blocks),
            "by_stream": [statistics.median(m) for m in by_pair if m],
            "corr_flush_main": _corr([a for a, _ in pairs], [b for _, b in pairs]),
            "clock": statistics.median(b["clock"] for b in blocks)}


def _prepare(torch: Any, timer: Any, rotation: Any, flush: Any, variant: str
             ) -> tuple[list[Any], float]:
    """``DeviceTimer.prepare`` with the L2 flush timed by events (ms); ``clean`` flushes by
    reading the buffer."""
    from cuda_agent.judge.device_timer import BUSY_NS

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    timer.blocker.block(BUSY_NS)
    inputs, _ = rotation.prepare(None)
    a.record()
    if "clean" in variant.split("+"):
        flush.sum()
    else:
        flush.zero_()
    b.record()
    torch.cuda.synchronize()
    return inputs, a.elapsed_time(b)


def _corr(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return float("nan")
    return statistics.correlation(xs, ys)


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) * 100


def main() -> int:
    from blocker_probe import probe_args, run_child, selected

    parser = argparse.ArgumentParser()
    probe_args(parser)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--warmup-s", default="0.2", help="comma-separated seconds")
    parser.add_argument("--burst", type=int, default=1,
                        help="processes per way run back to back in each round (as a "
                        "judgement's baseline processes are)")
    parser.add_argument("--variants", default="base",
                        help="base spread jitter clean nogate streams late; + joins; comma list")
    args = parser.parse_args()
    if args.child:
        return run_child(args, child)
    found, blocker_ext = selected(args)
    report: dict[str, Any] = {}
    for name, spec in found:
        ways = [(float(w), v) for w in args.warmup_s.split(",") for v in args.variants.split(",")]
        found_runs: dict[tuple[float, str], list[dict[str, Any]]] = {way: [] for way in ways}
        for round_ in range(args.processes):  # the ways interleaved: drift hits all alike
            for (warmup, variant), _ in itertools.product(ways, range(args.burst)):
                spec.update(calls=args.calls, blocks=args.blocks, warmup_s=warmup,
                            blocker_ext=blocker_ext, variant=variant)
                path = Path(f"/tmp/clkprobe_{abs(hash(name))}.json")
                path.write_text(json.dumps(spec))
                done = subprocess.run([sys.executable, __file__, "--child", str(path)],
                                      capture_output=True, text=True, timeout=300)
                if done.returncode:
                    print(name, variant, "failed:", done.stderr[-600:], flush=True)
                    continue
                found_runs[(warmup, variant)].append(
                    {**json.loads(done.stdout.strip().splitlines()[-1]), "round": round_})
        for (warmup, variant), runs in found_runs.items():
            report[f"{name} warm-up {warmup} {variant}"] = runs
            if args.json:  # after every target: a run cut short keeps what it measured
                args.json.write_text(json.dumps(report, indent=1))
            if len(runs) < 2:
                continue
            mains, clocks = [r["main"] for r in runs], [r["clock"] for r in runs]
            scaled = [m * c / statistics.median(clocks) for m, c in zip(mains, clocks, strict=True)]
            inside = [_corr([b["clock"] for b in r["blocks"]], [b["main"] for b in r["blocks"]])
                      for r in runs]
            nv = [[b["nvml"] for b in r["blocks"]] for r in runs]
            print(f"== {name}, warm-up {warmup} s, {variant}", flush=True)
            print(f"  medians ms   {' '.join(f'{m:.5f}' for m in mains)}  spread "
                  f"{_spread(mains):.2f}%")
            print(f"  clocks MHz   {' '.join(f'{c:.0f}' for c in clocks)}  spread "
                  f"{_spread(clocks):.2f}%; corr(time, clock) across processes "
                  f"{_corr(clocks, mains):+.2f}")
            print(f"  time x clock spread {_spread(scaled):.2f}%  (clock-scaled medians)")
            print(f"  within-process corr(block time, block clock): "
                  f"{' '.join(f'{c:+.2f}' for c in inside)}")
            if runs[0].get("by_stream"):
                print("  per stream pair: " + "; ".join(
                    " ".join(f"{m:.5f}" for m in r["by_stream"])
                    + f" ({_spread(r['by_stream']):.2f}%)" for r in runs))
            print("  block medians' spread within each process: " + " ".join(
                f"{_spread([b['main'] for b in r['blocks']]):.2f}%" for r in runs))
            print("  per-call corr(flush time, call time): "
                  + " ".join(f"{r['corr_flush_main']:+.2f}" for r in runs))
            for r in runs:
                ms = [b["main"] for b in r["blocks"]]
                if max(ms) / min(ms) > 1.02:
                    print(f"  slow blocks: main {[round(m, 5) for m in ms]} flush "
                          f"{[round(b['flush'], 4) for b in r['blocks']]} NVML reasons "
                          f"{[b['reasons'] for b in r['blocks']]}")
            seen = [c for row in nv for c in row if c is not None]
            print(f"  NVML SM clock over all blocks: {min(seen, default=None)}-"
                  f"{max(seen, default=None)} MHz", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
