"""Check the three KernelBench level-1 CUDA candidates beside this file on a GPU.

    PYTHONPATH=src python3 benchmarks/kernelbench_l1/check_gpu.py [--out DIR]

For each candidate: build it with cuda_agent's builder, then compare ModelNew with a plain
PyTorch reference (written here, the same operation as the KernelBench problem) over many
shapes, including odd sizes, misaligned inputs and every kernel path that the bindings'
``config`` argument can force; outputs are poisoned with NaN first, so an element left
unwritten fails (the fill is switched off for timing). Inputs are checked to be left
unchanged. Last, ModelNew and the reference are timed at the benchmark's shape (CUDA
events: median of 20 samples, each the mean of 10 back-to-back calls). Each candidate runs
in its own process, since all of them build a module named cuda_extension.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANDIDATES = (
    "12_Matmul_with_diagonal_matrices_",
    "40_LayerNorm",
    "10_3D_tensor_matrix_multiplication",
)


def _load(name: str):
    from cuda_agent.build import BuildConfig, Builder, load_extension

    result = Builder(BuildConfig(device="cuda")).build(HERE / name)
    if not result.ok:
        raise RuntimeError(f"build failed: {[str(d) for d in result.diagnostics]}\n{result.log}")
    ext = load_extension(result.extension_path)
    namespace: dict = {}
    exec(compile((HERE / name / "model_new.py").read_text(), f"{name}/model_new.py", "exec"),
         namespace)
    return ext, namespace["ModelNew"], result.seconds


def _misaligned(t):
    """A contiguous copy of t whose data pointer is 4 bytes past a 16-byte boundary."""
    import torch

    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view_as(t).copy_(t)


def _time(fn, *args, reps: int = 20, batch: int = 10) -> float:
    """Median over `reps` samples of the mean time of `batch` back-to-back calls, in ms."""
    import torch

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    times.sort()
    return times[len(times) // 2]


def check_one(name: str) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    ext, model_new_cls, build_s = _load(name)
    ext._set_output_poison(True)
    report: dict = {"name": name, "build_s": build_s, "cases": [], "ok": True}
    dev = "cuda"

    def record(label, got, want, atol, rtol, inputs_before=None, inputs_after=None):
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(got).all()) if got.numel() else True
        err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
        ok = (got.shape == want.shape and finite
              and torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol))
        if inputs_before is not None:
            pairs = zip(inputs_before, inputs_after, strict=True)
            ok = ok and all(torch.equal(a, b) for a, b in pairs)
        report["cases"].append({"case": label, "ok": ok, "max_abs_err": err})
        report["ok"] &= ok
        print(f"  {'ok  ' if ok else 'FAIL'} {label}: max abs err {err:.3e}", flush=True)

    if name.startswith("12_"):
        model = model_new_cls().to(dev)
        for n, m in [(4096, 4096), (1, 1), (3, 5), (1000, 1), (7, 4099), (70000, 8), (33, 1028)]:
            a = torch.rand(n, device=dev)
            b = torch.randn(n, m, device=dev)
            a0, b0 = a.clone(), b.clone()
            record(f"N={n} M={m}", model(a, b), a.unsqueeze(1) * b, 0, 0, (a0, b0), (a, b))
            record(f"N={n} M={m} forced scalar", ext.diag_matmul(a, b, 1), a.unsqueeze(1) * b, 0, 0)
        b = _misaligned(torch.randn(64, 36, device=dev))
        a = torch.rand(64, device=dev)
        record("misaligned B", model(a, b), a.unsqueeze(1) * b, 0, 0)
        a, b = torch.rand(4096), torch.rand(4096, 4096)
        a, b = a.to(dev), b.to(dev)
        record("N=4096 M=4096 grid_y<=5", ext.diag_matmul(a, b, 5), a.unsqueeze(1) * b, 0, 0)
        ext._set_output_poison(False)  # the NaN fill would be timed too
        report["ours_ms"] = _time(model, a, b)
        report["torch_ms"] = _time(lambda x, y: x.unsqueeze(1) * y, a, b)
        report["variants_ms"] = {f"grid_y<={cap}": _time(ext.diag_matmul, a, b, cap)
                                 for cap in (132, 264, 528, 1056, 2112)}
        report["copy_ms"] = _time(lambda y: y.clone(), b)
        print(f"  variants: {report['variants_ms']}, clone of B: {report['copy_ms']:.4f} ms")
        report["bytes"] = (a.numel() + 2 * b.numel()) * 4
    elif name.startswith("40_"):
        cases = [((16,), (64, 256, 256)), ((5, 3), (64,)), ((9,), (1024,)), ((3,), (1028,)),
                 ((4,), (8192,)), ((2,), (8193,)), ((3,), (10001,)), ((2,), (3, 7, 1000)),
                 ((1,), (1,)), ((37,), (12, 12)), ((2,), (4, 64, 64)), ((1000,), (3,))]
        for lead, shape in cases:
            model = model_new_cls(shape).to(dev)
            with torch.no_grad():
                model.ln.weight.normal_()
                model.ln.bias.normal_()
            w, bias, eps = model.ln.weight.detach(), model.ln.bias.detach(), model.ln.eps
            for kind in ("rand", "offset"):
                x = torch.rand(*lead, *shape, device=dev)
                if kind == "offset":
                    x = x * 3 + 100.0
                x0 = x.clone()
                # Exact result in fp64; allow what torch's own fp32 kernel misses by (rows of
                # few elements can have a tiny variance, which magnifies rounding), x4.
                want = F.layer_norm(x.double(), shape, w.double(), bias.double(), eps)
                torch_err = (F.layer_norm(x, shape, w, bias, eps).double() - want).abs().max()
                tol = max(1e-5, 4 * torch_err.item())
                with torch.no_grad():
                    got = model(x)
                record(f"{lead}x{shape} {kind}", got, want, tol, 0, (x0,), (x,))
                d = w.numel()
                configs = [1, 3] + ([2] if d <= 8192 else [])
                for config in configs:
                    got = ext.layer_norm(x, w, bias, eps, config)
                    record(f"{lead}x{shape} {kind} config={config}", got, want, tol, 0)
            xm = _misaligned(torch.rand(*lead, *shape, device=dev))
            with torch.no_grad():
                record(f"{lead}x{shape} misaligned", model(xm),
                       F.layer_norm(xm, shape, w, bias, eps), 1e-5, 1e-5)
        shape = (64, 256, 256)
        model = model_new_cls(shape).to(dev)
        x = torch.rand(16, *shape, device=dev)
        ref = torch.nn.LayerNorm(shape).to(dev)
        ext._set_output_poison(False)  # the NaN fill would be timed too
        with torch.no_grad():
            report["ours_ms"] = _time(model, x)
            report["torch_ms"] = _time(ref, x)
        report["bytes"] = (2 * x.numel() + 2 * ref.weight.numel()) * 4
    else:
        model = model_new_cls().to(dev)
        cases = [(16, 1024, 2048, 768), (2, 100, 300, 200), (1, 1, 1, 1), (1, 5, 0, 7),
                 (0, 3, 4, 5), (3, 17, 2047, 770), (1, 129, 64, 3), (4, 64, 9, 130),
                 (1, 1000, 13, 1), (2, 300, 128, 1024)]
        for n, m, k, lcols in cases:
            a = torch.rand(n, m, k, device=dev)
            b = torch.rand(k, lcols, device=dev)
            a0, b0 = a.clone(), b.clone()
            want = torch.matmul(a.double(), b.double())
            # As accurate as torch's own fp32 product, up to rounding-order noise.
            torch_err = (torch.matmul(a, b).double() - want).abs().max().item() if want.numel() \
                else 0.0
            atol = 4 * torch_err + 1e-6 * max(k, 1)
            record(f"({n},{m},{k})@({k},{lcols})", model(a, b), want, atol, 0, (a0, b0), (a, b))
            for config in (1, 2, 3, 4):
                record(f"({n},{m},{k})@({k},{lcols}) config={config}",
                       ext.tensor_matmul(a, b, config), want, atol, 0)
        a = _misaligned(torch.rand(2, 33, 64, device=dev))
        b = _misaligned(torch.rand(64, 48, device=dev))
        record("misaligned A and B", model(a, b), torch.matmul(a.double(), b.double()),
               1e-4, 1e-5)
        a, b = torch.rand(16, 1024, 2048, device=dev), torch.rand(2048, 768, device=dev)
        ext._set_output_poison(False)  # the NaN fill would be timed too
        report["ours_ms"] = _time(model, a, b)
        report["torch_ms"] = _time(torch.matmul, a, b)
        report["variants_ms"] = {f"config={c}": _time(ext.tensor_matmul, a, b, c)
                                 for c in (1, 2, 4)}
        print(f"  variants: {report['variants_ms']}")
        report["flops"] = 2 * 16 * 1024 * 2048 * 768
        report["vs_torch_fp32_max_abs"] = (model(a, b) - torch.matmul(a, b)).abs().max().item()
    if "bytes" in report:
        report["ours_GBps"] = report["bytes"] / report["ours_ms"] / 1e6
    if "flops" in report:
        report["ours_TFLOPs"] = report["flops"] / report["ours_ms"] / 1e9
        report["torch_TFLOPs"] = report["flops"] / report["torch_ms"] / 1e9
    print(f"  timing: ours {report['ours_ms']:.4f} ms, torch {report['torch_ms']:.4f} ms",
          flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for check_gpu.json")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        report = check_one(args.one)
        print("REPORT " + json.dumps(report), flush=True)
        return 0 if report["ok"] else 1
    os.environ.setdefault("CUDA_AGENT_HOME", tempfile.mkdtemp(prefix="cahome-"))
    reports = []
    for name in CANDIDATES:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True, check=False)
        print(proc.stdout.replace("REPORT ", "  report: ")[-6000:], proc.stderr[-3000:],
              flush=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
        report = json.loads(lines[-1][7:]) if lines else {"name": name, "ok": False,
                                                          "error": proc.stderr[-3000:]}
        report["wall_s"] = time.perf_counter() - start
        reports.append(report)
    print("\n| candidate | ok | ours ms | torch ms | speedup |")
    print("| --- | --- | --- | --- | --- |")
    for r in reports:
        ours, ref = r.get("ours_ms"), r.get("torch_ms")
        speed = f"{ref / ours:.2f}x" if ours and ref else "-"
        print(f"| {r['name']} | {r.get('ok')} | {ours} | {ref} | {speed} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "check_gpu.json").write_text(json.dumps(reports, indent=1))
    return 0 if all(r.get("ok") for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
