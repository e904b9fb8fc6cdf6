"""A Llama model end to end on a CUDA GPU, before and after its RMSNorms become one kernel.

Run from the repository root on the GPU machine:

    python benchmarks/integrate/llama_rmsnorm_e2e.py --out $OUT

Issue 9's second worked example, on a realistic model. A ``LlamaForCausalLM`` is built from a
config with random weights on the GPU (default: hidden 2048, 8 layers, intermediate 5632,
16 heads, 4 key/value heads, vocabulary 32000; the RMSNorm weights are drawn around 1 so
they matter) for each of --dtypes (default bf16 and fp32). Then:

1. Per op: one of the model's ``LlamaRMSNorm`` and the CUDA ``ModelNew`` of the shipped
   solution (``src/cuda_agent/examples/llama_rmsnorm/solution/cuda``, or --result: any
   optimize OUT or result folder of that task), loaded with the same weights, on hidden states
   of the model's shape (batch x seq tokens) and of a decode step (batch tokens): outputs
   compared, each timed (CUDA events around a loop of calls, median over repeats).
2. End to end: the whole model's eager forward (``use_cache=False``) timed, every RMSNorm
   (``model.layers.*.input_layernorm``, ``model.layers.*.post_attention_layernorm``,
   ``model.norm``) replaced by ``ModelNew`` with its original weights, the logits compared
   with the originals (relative norm error, max abs error, argmax agreement) and the forward
   timed again.

The kernels are built from the result's sources by the project's builder. The replacement
uses ``cuda_agent.integrate.replace`` where it can be imported and works; otherwise (or for
whatever it left) a local swap with the same rules: a ``ModelNew(hidden_size, eps)`` per
norm, ``load_state_dict(strict=True)``, the original's device and dtype.

Prints the environment first and a table last; writes ``llama_rmsnorm_e2e.json`` (rewritten
after every stage, so a failure keeps what was measured) and ``llama_rmsnorm_e2e.md`` to
--out. Every stage is guarded; the exit status is 1 when anything failed or did not match.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import gc
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
try:
    import cuda_agent  # noqa: F401
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

NORM_PATTERNS = ("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm",
                 "model.norm")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# relative-norm error of the logits allowed after the swap, by dtype: the kernel rounds as
# LlamaRMSNorm does, only the order of the sum of squares differs
LOGITS_TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 1e-4}
# element-wise (atol = rtol) tolerance of one norm's output, by dtype
OP_TOLERANCE = {"bf16": 1.6e-2, "fp16": 2e-3, "fp32": 1e-5}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="Folder for the JSON and Markdown.")
    p.add_argument("--result", type=Path, default=None,
                   help="Result to put in: an optimize OUT folder or a result folder "
                        "(default: the shipped CUDA solution of llama_rmsnorm).")
    p.add_argument("--task", type=Path, default=None,
                   help="The task's model.py (default: the shipped llama_rmsnorm task, or "
                        "OUT/workspace/model.py of an optimize folder).")
    p.add_argument("--dtypes", default="bf16,fp32", help="Comma-separated: bf16, fp16, fp32.")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--warmup", type=int, default=5, help="Untimed forwards before timing.")
    p.add_argument("--iters", type=int, default=30, help="Timed whole-model forwards.")
    p.add_argument("--op-calls", type=int, default=100, help="Norm calls per timed loop.")
    p.add_argument("--op-repeats", type=int, default=15, help="Timed loops per norm.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke test of this script with the CPU solution (fp32 only, "
                        "use small sizes); the figures that count are CUDA's.")
    return p.parse_args(argv)


# -- the result: ModelNew with its extension built from the sources -----------------------

def locate_result(args: argparse.Namespace) -> tuple[Path, Path]:
    """(folder holding model_new.py and kernels/, the task's model.py)."""
    from cuda_agent.tasks.loaders import builtin_dir

    example = builtin_dir() / "llama_rmsnorm"
    if args.result is None:
        return example / "solution" / args.device, args.task or example / "model.py"
    result = args.result.resolve()
    folder = result / "result" if (result / "result").is_dir() else result
    task = args.task or (result / "workspace" / "model.py")
    if not task.is_file():
        task = example / "model.py"
    return folder, task


def build_model_new(folder: Path, device: str) -> tuple[type, dict[str, Any]]:
    """Build ``folder/kernels`` with the project's builder, import ``model_new.py`` with the
    module as ``cuda_extension``; return ModelNew and what the build did."""
    from cuda_agent.build import BuildConfig, Builder, load_extension

    result = Builder(BuildConfig(device=device)).build(folder)
    info = {"ok": result.ok, "seconds": round(result.seconds, 2),
            "compiled": list(result.compiled), "cached": list(result.cached),
            "extension": result.extension_path}
    if not result.ok or result.extension_path is None:
        raise RuntimeError(f"the kernels of {folder} failed to build:\n{result.log[-4000:]}")
    load_extension(result.extension_path)  # sys.modules["cuda_extension"]
    spec = importlib.util.spec_from_file_location("llama_rmsnorm_model_new",
                                                  folder / "model_new.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {folder / 'model_new.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew, info


def _matches(name: str, pattern: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(map(fnmatch.fnmatchcase, names, parts))


def local_swap(model: torch.nn.Module, model_new: type, eps: float) -> list[str]:
    """Replace every LlamaRMSNorm the patterns name by ``model_new`` with its weights."""
    done = []
    for name, module in list(model.named_modules()):
        if type(module).__name__ != "LlamaRMSNorm" or \
                not any(_matches(name, p) for p in NORM_PATTERNS):
            continue
        weight = module.weight
        new = model_new(weight.shape[0], getattr(module, "variance_epsilon", eps))
        new.load_state_dict(module.state_dict(), strict=True)
        new = new.to(device=weight.device, dtype=weight.dtype).eval()
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, new)
        done.append(name)
    return done


def swap_norms(model: torch.nn.Module, folder: Path, task: Path, model_new: type,
               hidden: int, eps: float) -> dict[str, Any]:
    """Every RMSNorm replaced: through ``cuda_agent.integrate.replace`` if it works, the
    local swap for anything left."""
    info: dict[str, Any] = {"replace_api": None, "replace_error": None, "replaced": []}
    try:
        from cuda_agent.integrate import replace
    except ImportError as exc:
        info["replace_error"] = f"not importable: {exc}"
    else:
        try:
            for pattern in NORM_PATTERNS:
                report = replace(model, pattern, folder, task=task, init_inputs=[hidden, eps])
                info["replaced"] += [item.path for item in report.replaced]
            info["replace_api"] = "cuda_agent.integrate.replace"
        except Exception as exc:  # fall back to the local swap for what is left
            info["replace_error"] = f"{type(exc).__name__}: {exc}"
    left = local_swap(model, model_new, eps)
    if left:
        info["replaced"] += left
        info["local_swap"] = left
    remaining = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"]
    info["remaining_llama_rmsnorm"] = remaining
    return info


# -- timing ----------------------------------------------------------------------------------

def elapsed_ms(fn, calls: int, device: str) -> float:
    """Milliseconds of ``calls`` calls of ``fn()``: CUDA events around them on the GPU (the
    device's time, launches queued back to back), the wall clock on the CPU."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - begin) * 1000.0


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_forward(fn, warmup: int, iters: int, device: str) -> dict[str, float]:
    """Milliseconds of one ``fn()``, timed call by call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = [elapsed_ms(fn, 1, device) for _ in range(iters)]
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "mean_ms": statistics.fmean(times), "iters": iters}


def time_op(fn, calls: int, repeats: int, device: str) -> dict[str, float]:
    """Microseconds per call of ``fn()``: loops of ``calls`` calls, median over repeats."""
    for _ in range(max(3, calls // 10)):
        fn()
    sync(device)
    per_call = [elapsed_ms(fn, calls, device) * 1000.0 / calls for _ in range(repeats)]
    return {"median_us": statistics.median(per_call), "min_us": min(per_call),
            "calls": calls, "repeats": repeats}


# -- the model -------------------------------------------------------------------------------

def make_model(args: argparse.Namespace, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(2048, args.seq), rms_norm_eps=args.eps,
                         tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    generator = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":  # ones at init: make them count
                w = torch.empty(module.weight.shape, device=args.device, dtype=torch.float32)
                module.weight.copy_(w.normal_(1.0, 0.1, generator=generator))
    return model, config


def compare(got: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
    g, e = got.double(), expected.double()
    rel = ((g - e).norm() / e.norm().clamp_min(1e-30)).item()
    return {"rel_norm_error": rel, "max_abs_error": (g - e).abs().max().item(),
            "exact_fraction": (got == expected).double().mean().item()}


def per_op(args: argparse.Namespace, model, model_new: type, name: str, dtype: torch.dtype
           ) -> list[dict[str, Any]]:
    original = model.model.layers[0].input_layernorm
    new = model_new(args.hidden, original.variance_epsilon)
    new.load_state_dict(original.state_dict(), strict=True)
    new = new.to(device=args.device, dtype=dtype).eval()
    rows_list = [("prefill", (args.batch, args.seq)), ("decode", (args.batch, 1))]
    out = []
    with torch.no_grad():
        for label, lead in rows_list:
            x = torch.randn(*lead, args.hidden, device=args.device, dtype=dtype)
            expected, got = original(x), new(x)
            check = compare(got, expected)
            tol = OP_TOLERANCE[name]
            check["allclose"] = bool(torch.allclose(got.float(), expected.float(), atol=tol,
                                                    rtol=tol))
            check["dtype_ok"] = got.dtype == expected.dtype and got.shape == expected.shape
            eager = time_op(lambda x=x: original(x), args.op_calls, args.op_repeats,
                            args.device)
            kernel = time_op(lambda x=x: new(x), args.op_calls, args.op_repeats, args.device)
            out.append({"shape": [*lead, args.hidden], "label": label, "check": check,
                        "eager_us": eager["median_us"], "kernel_us": kernel["median_us"],
                        "speedup": eager["median_us"] / kernel["median_us"],
                        "eager": eager, "kernel": kernel})
    return out


def run_dtype(args: argparse.Namespace, name: str, folder: Path, task: Path, model_new: type,
              record: dict[str, Any], save) -> None:
    dtype = DTYPES[name]
    run: dict[str, Any] = {"dtype": name}
    record["runs"][name] = run
    model, config = make_model(args, dtype)
    norms = sum(type(m).__name__ == "LlamaRMSNorm" for m in model.modules())
    run["norms"] = norms
    run["parameters_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device,
                           generator=torch.Generator(device=args.device).manual_seed(
                               args.seed + 2))
    try:
        run["per_op"] = per_op(args, model, model_new, name, dtype)
    except Exception:
        run["per_op_error"] = traceback.format_exc()[-3000:]
    save()

    def forward():
        return model(tokens, use_cache=False).logits

    with torch.no_grad():
        expected = forward().float()
        run["eager_before"] = time_forward(forward, args.warmup, args.iters, args.device)
        save()
        run["swap"] = swap_norms(model, folder, task, model_new, config.hidden_size,
                                 config.rms_norm_eps)
        save()
        got = forward().float()
        check = compare(got, expected)
        check["argmax_agreement"] = (got.argmax(-1) == expected.argmax(-1)).double().mean().item()
        check["tolerance"] = LOGITS_TOLERANCE[name]
        check["ok"] = bool(torch.isfinite(got).all().item()
                           and check["rel_norm_error"] <= LOGITS_TOLERANCE[name]
                           and not run["swap"]["remaining_llama_rmsnorm"]
                           and len(run["swap"]["replaced"]) == norms)
        run["logits_check"] = check
        save()
        run["eager_after"] = time_forward(forward, args.warmup, args.iters, args.device)
    before, after = run["eager_before"]["median_ms"], run["eager_after"]["median_ms"]
    run["e2e_speedup"] = before / after
    prefill = next((p for p in run.get("per_op", []) if p["label"] == "prefill"), None)
    if prefill:
        run["norm_share_eager_est"] = norms * prefill["eager_us"] / 1000.0 / before
        run["saved_ms_est"] = norms * (prefill["eager_us"] - prefill["kernel_us"]) / 1000.0
    save()


# -- output ----------------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    import transformers

    env = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       capture_output=True, text=True, timeout=10
                                       ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


def summary(record: dict[str, Any]) -> str:
    cfg = record["config"]
    where = record["env"].get("gpu") or cfg["device"]
    lines = [f"# Llama RMSNorm -> rms_norm kernel, end to end ({where})", "",
             f"LlamaForCausalLM hidden {cfg['hidden']}, {cfg['layers']} layers, intermediate "
             f"{cfg['intermediate']}, {cfg['heads']}/{cfg['kv_heads']} heads, vocab "
             f"{cfg['vocab']}; batch {cfg['batch']} x seq {cfg['seq']}; eager, no KV cache.", "",
             "| dtype | op shape | RMSNorm eager us | kernel us | op speed-up | max abs err |",
             "|---|---|---|---|---|---|"]
    for name, run in record["runs"].items():
        for op in run.get("per_op", []):
            lines.append(f"| {name} | {'x'.join(map(str, op['shape']))} ({op['label']}) | "
                         f"{op['eager_us']:.1f} | {op['kernel_us']:.1f} | "
                         f"{op['speedup']:.2f}x | {op['check']['max_abs_error']:.3g} |")
    lines += ["", "| dtype | norms | forward before ms | after ms | speed-up | RMSNorm share "
              "(est.) | logits rel err | argmax agree | ok |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, run in record["runs"].items():
        before, after = run.get("eager_before", {}), run.get("eager_after", {})
        check = run.get("logits_check", {})
        share = run.get("norm_share_eager_est")
        lines.append(
            f"| {name} | {run.get('norms', '-')} | {_f(before.get('median_ms'), '.3f')} | "
            f"{_f(after.get('median_ms'), '.3f')} | {_f(run.get('e2e_speedup'), '.3f')}x | "
            f"{_f(100 * share if share is not None else None, '.1f')}% | "
            f"{_f(check.get('rel_norm_error'), '.2e')} | "
            f"{_f(check.get('argmax_agreement'), '.4f')} | {check.get('ok', '-')} |")
    build = record.get("build", {})
    how = sorted({str(r.get("swap", {}).get("replace_api") or "local swap")
                  for r in record["runs"].values()})
    lines += ["", f"Kernels: {record.get('result')} (built in {build.get('seconds', '-')} s, "
              f"compiled {len(build.get('compiled', []))}); replacement: "
              f"{', '.join(how) or '-'}."]
    if record["errors"]:
        lines += ["", "Errors:"] + [f"- {e.splitlines()[-1] if e else e}" for e in record["errors"]]
    return "\n".join(lines) + "\n"


def _f(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()
                                         if isinstance(v, (int, float, str))},
                              "env": {}, "runs": {}, "errors": []}
    path = args.out / "llama_rmsnorm_e2e.json"

    def save() -> None:
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")

    try:
        record["env"] = environment()
    except Exception:
        record["errors"].append(traceback.format_exc()[-2000:])
    print(json.dumps(record["env"]), flush=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        record["errors"].append("no CUDA device")
        save()
        print("error: no CUDA device", file=sys.stderr)
        return 1
    try:
        folder, task = locate_result(args)
        record["result"], record["task"] = str(folder), str(task)
        start = time.perf_counter()
        model_new, record["build"] = build_model_new(folder, args.device)
        print(f"built {folder} in {time.perf_counter() - start:.1f} s", flush=True)
    except Exception:
        record["errors"].append(traceback.format_exc()[-4000:])
        save()
        print(record["errors"][-1], file=sys.stderr)
        return 1
    save()
    for name in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        if name not in DTYPES:
            record["errors"].append(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})")
            continue
        start = time.perf_counter()
        try:
            run_dtype(args, name, folder, task, model_new, record, save)
        except Exception:
            record["errors"].append(f"{name}: " + traceback.format_exc()[-4000:])
            print(record["errors"][-1], file=sys.stderr, flush=True)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        record["runs"].setdefault(name, {})["seconds"] = round(time.perf_counter() - start, 1)
        save()
        print(f"{name} done in {time.perf_counter() - start:.1f} s", flush=True)
    text = summary(record)
    (args.out / "llama_rmsnorm_e2e.md").write_text(text)
    print(text)
    ok = not record["errors"] and all(
        r.get("logits_check", {}).get("ok") and "per_op_error" not in r
        and all(op["check"]["allclose"] and op["check"]["dtype_ok"] for op in r["per_op"])
        for r in record["runs"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
