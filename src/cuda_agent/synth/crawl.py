"""Seed crawler: enumerate operators of ``torch`` and ``transformers`` and confirm each by
execution, in worker processes (an operator that crashes or hangs fails alone).

    cuda-agent synth catalog [--out catalog.jsonl] [--workers 2]

Candidates: ``torch.nn`` module classes, ``torch.nn.functional`` functions and public
``torch.*`` functions (creation, RNG-state, I/O and global-setting functions are skipped by
name), plus transformers blocks (``crawl_hf``). For each, argument patterns are tried in
order (signature-driven constructor values, then unary, ``dim``, binary, scalar and
matmul-shaped calls) until one runs on meta tensors and on real ones.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cuda_agent.synth.catalog import InputSpec, SeedOp
from cuda_agent.synth.probe_op import MATMUL_NAME, Attempt, confirm

X = InputSpec(shape=())

SKIP_PREFIX = ("set_", "get_", "is_", "use_", "enable_", "disable_", "from_", "as_", "empty",
               "zeros", "ones", "full", "rand", "arange", "range", "linspace", "logspace",
               "eye", "tensor", "sparse", "quantize", "fbgemm", "q_", "sym_", "manual_seed",
               "seed", "initial_seed", "load", "save", "compile", "export", "autocast",
               "no_grad", "inference_mode", "promote_types", "result_type", "can_cast",
               "typename", "vmap", "cond", "while_loop", "broadcast_shapes", "frombuffer",
               "align", "unravel_index", "lobpcg", "pca_lowrank", "svd_lowrank", "stft", "istft",
               "hamming", "hann", "bartlett", "blackman", "kaiser", "tril_indices",
               "triu_indices", "cudnn", "miopen", "mkldnn", "native_", "xpu", "mps", "cuda",
               "chunk", "split", "unbind", "tensor_split", "hsplit", "vsplit", "dsplit",
               "meshgrid", "broadcast_tensors", "atleast", "block_diag", "cartesian_prod",
               "combinations", "normal", "poisson", "multinomial", "bernoulli", "resize",
               "fake_", "fused_", "batch_norm_", "choose_qparams", "saddmm", "sspaddmm",
               "hspmm", "smm", "wait", "print", "classes", "library", "func", "nonzero",
               "unique", "masked_select", "argwhere", "pdist", "histogram", "bincount",
               "hash_tensor")
SKIP_MODULES = {"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
                "ParameterDict", "Container", "Identity", "Parameter", "UninitializedParameter",
                "UninitializedBuffer", "Buffer", "TransformerDecoder", "TransformerEncoder",
                "CrossMapLRN2d", "SyncBatchNorm", "RNNBase", "RNNCellBase", "Flatten",
                "Unflatten"}
NAME_VALUES: dict[str, Any] = {
    "in_channels": "$1", "num_features": "$1", "num_channels": "$1", "channels": "$1",
    "in_features": "$-1", "in1_features": "$-1", "in2_features": "$-1",
    "normalized_shape": "$-1", "embed_dim": "$-1", "d_model": "$-1", "input_size": "$-1",
    "out_channels": 16, "out_features": 32, "kernel_size": 3, "num_groups": 2,
    "num_heads": 2, "nhead": 2, "hidden_size": 32, "num_layers": 1, "upscale_factor": 2,
    "downscale_factor": 2, "output_size": 4, "scale_factor": 2.0, "dim": 1, "padding": 1,
    "num_embeddings": 64, "embedding_dim": 16, "groups": 2, "size": 4, "dim_feedforward": 64,
    "dropout": 0.0, "batch_first": True, "pad": (1, 1), "dims": (1, 0), "n_classes": 8,
    "cutoffs": (4,), "lambd": 0.5, "min_val": -0.5, "max_val": 0.5, "threshold": 0.1,
    "value": 0.0, "p": 0.5, "shifts": 1,
}
OPTIONAL = ("dim", "scale_factor", "dropout", "batch_first")
RNN = {"input_size": "$-1", "hidden_size": 32, "batch_first": True}
MODULE_PARAMS = {"LSTM": RNN, "GRU": RNN, "RNN": RNN, "LSTMCell": RNN, "GRUCell": RNN,
                 "RNNCell": RNN}
W = InputSpec(shape=(16, "$1", 3))
HINTS: dict[str, list[tuple[str, tuple[InputSpec, ...], dict[str, Any], tuple[int, ...]]]] = {
    "F.layer_norm": [("F.layer_norm({x}, ({d},))", (X,), {"d": "$-1"}, (4, 3, 2))],
    "F.rms_norm": [("F.rms_norm({x}, ({d},))", (X,), {"d": "$-1"}, (4, 3, 2))],
    "torch.layer_norm": [("torch.layer_norm({x}, ({d},))", (X,), {"d": "$-1"}, (4, 3, 2))],
    "torch.rms_norm": [("torch.rms_norm({x}, ({d},))", (X,), {"d": "$-1"}, (4, 3, 2))],
    "F.group_norm": [("F.group_norm({x}, 2)", (X,), {}, (4, 3, 5))],
    "torch.group_norm": [("torch.group_norm({x}, 2)", (X,), {}, (4, 3, 5))],
    "F.batch_norm": [("F.batch_norm({x}, None, None, training=True)", (X,), {}, (4, 3, 2, 5))],
    "F.linear": [("F.linear({x}, {in1})", (X, InputSpec(shape=(32, "$-1"))), {}, (2, 3, 4))],
    "F.conv1d": [("F.conv1d({x}, {in1}, padding=1)", (X, W), {}, (3,))],
    "F.conv2d": [("F.conv2d({x}, {in1}, padding=1)",
                  (X, InputSpec(shape=(16, "$1", 3, 3))), {}, (4,))],
    "F.conv3d": [("F.conv3d({x}, {in1}, padding=1)",
                  (X, InputSpec(shape=(16, "$1", 3, 3, 3))), {}, (5,))],
    "F.conv_transpose1d": [("F.conv_transpose1d({x}, {in1})",
                            (X, InputSpec(shape=("$1", 16, 3))), {}, (3,))],
    "F.conv_transpose2d": [("F.conv_transpose2d({x}, {in1})",
                            (X, InputSpec(shape=("$1", 16, 3, 3))), {}, (4,))],
    "F.conv_transpose3d": [("F.conv_transpose3d({x}, {in1})",
                            (X, InputSpec(shape=("$1", 16, 3, 3, 3))), {}, (5,))],
    "F.prelu": [("F.prelu({x}, {in1})", (X, InputSpec(shape=("$1",))), {}, (4, 3, 2))],
    "F.embedding": [("F.embedding({x}, {in1})",
                     (InputSpec(shape=(), dtype="int64", domain="int:64"),
                      InputSpec(shape=(64, 16))), {}, (2, 1, 3))],
    "F.interpolate": [("F.interpolate({x}, scale_factor=2.0)", (X,), {}, (4, 3, 5))],
    "F.avg_pool2d": [("F.avg_pool2d({x}, 2)", (X,), {}, (4,))],
    "F.max_pool2d": [("F.max_pool2d({x}, 2)", (X,), {}, (4,))],
}


def torch_candidates() -> list[tuple[str, Callable[[], list[Attempt]]]]:
    """Every torch operator to try, as (name, attempts factory), sorted by name."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    found: dict[str, Callable[[], list[Attempt]]] = {}
    for name in dir(nn):
        obj = getattr(nn, name)
        if (inspect.isclass(obj) and issubclass(obj, nn.Module) and name not in SKIP_MODULES
                and not name.startswith(("Lazy", "_"))):
            found[f"nn.{name}"] = lambda n=name: module_attempts(n)
    for name in dir(F):
        obj = getattr(F, name)
        if (_public(name) and callable(obj) and not inspect.isclass(obj)
                and getattr(obj, "__module__", "") in ("torch.nn.functional", "torch._C._nn",
                                                       "torch.functional", None, "torch")):
            found[f"F.{name}"] = lambda n=name: function_attempts(f"F.{n}", getattr(F, n))
    for name in dir(torch):
        obj = getattr(torch, name)
        if (_public(name) and type(obj).__name__ in ("builtin_function_or_method", "function")
                and not name.endswith("_")):
            found[f"torch.{name}"] = lambda n=name: function_attempts(f"torch.{n}",
                                                                      getattr(torch, n))
    return sorted(found.items())


def _public(name: str) -> bool:
    return (name[:1].islower() and not name.startswith(SKIP_PREFIX) and name[0] != "_"
            and name not in ("handle_torch_function", "boolean_dispatch", "assert_int_or_pair"))


def module_attempts(name: str) -> list[Attempt]:
    import torch.nn as nn

    cls = getattr(nn, name)
    try:
        sig = inspect.signature(cls.__init__)
        fwd = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return []
    required = [p for p in list(sig.parameters.values())[1:] if _required(p)]
    n_inputs = sum(1 for p in list(fwd.parameters.values())[1:] if _required(p))
    attempts = []
    for extra in (False, True):
        for fallback in (2, 0.5):
            params = dict(MODULE_PARAMS.get(name) or
                          {p.name: NAME_VALUES.get(p.name, fallback) for p in required})
            if extra:
                params.update({k: NAME_VALUES[k] for k in OPTIONAL if k in sig.parameters})
            args = ", ".join(f"{k}={{{k}}}" for k in params)
            ins = ["{x}"] + [f"{{in{i}}}" for i in range(1, n_inputs)]
            if name == "MultiheadAttention":  # the averaged weights would be dead work
                ins.append("need_weights=False")
            for primary in (X, InputSpec(shape=(), dtype="int64", domain="int:8")):
                attempts.append(Attempt(
                    op=f"nn.{name}", kind="module", init_code=f"nn.{name}({args})",
                    call_code=f"{{mod}}({', '.join(ins)})", params=params,
                    inputs=(primary, *[_like()] * (max(n_inputs, 1) - 1))))
    return _dedupe(attempts)


def function_attempts(name: str, fn: Callable) -> list[Attempt]:
    attempts: list[Attempt] = [
        Attempt(op=name, kind="function", call_code=call, inputs=inputs, params=params,
                ranks=ranks) for call, inputs, params, ranks in HINTS.get(name, [])]
    try:
        sig = inspect.signature(fn)
        required = [p for p in list(sig.parameters.values())[1:] if _required(p)]
        params = {p.name: NAME_VALUES[p.name] for p in required if p.name in NAME_VALUES}
        if len(params) == len(required):
            for extra in (False, True):
                more = dict(params)
                if extra:
                    more.update({k: NAME_VALUES[k] for k in OPTIONAL if k in sig.parameters})
                args = "".join(f", {k}={{{k}}}" for k in more)
                attempts.append(Attempt(op=name, kind="function", call_code=f"{name}({{x}}{args})",
                                        params=more, inputs=(X,)))
    except (TypeError, ValueError):
        pass
    mat = InputSpec(shape=("$-1", 32))
    bmat = InputSpec(shape=("$0", "$-1", 32))
    patterns: list[tuple[str, tuple[InputSpec, ...], dict[str, Any], tuple[int, ...]]] = [
        ("{x}", (X,), {}, (4, 3, 2, 5, 1)),
        ("{x}, dim={dim}", (X,), {"dim": 1}, (4, 3, 2, 5)),
        ("{x}, {dim}", (X,), {"dim": 1}, (4, 3, 2, 5)),
        ("{x}, {in1}", (X, _like()), {}, (4, 3, 2, 5, 1)),
        ("{x}, {other}", (X,), {"other": 0.5}, (4, 3, 2, 5, 1)),
        ("{x}, {other}", (X,), {"other": 2}, (4, 3, 2, 5, 1)),
        ("{x}, {in1}", (X, mat), {}, (2, 1)),
        ("{x}, {in1}", (X, bmat), {}, (3,)),
        ("{x}, {in1}, {in2}", (X, _like(), _like()), {}, (4, 3, 2, 5, 1)),
    ]
    if MATMUL_NAME.search(name):
        patterns = patterns[6:8] + patterns[:6] + patterns[8:]
    for args, inputs, params, ranks in patterns:
        attempts.append(Attempt(op=name, kind="function", call_code=f"{name}({args})",
                                params=params, inputs=inputs, ranks=ranks))
    return _dedupe(attempts)


def _like() -> InputSpec:
    return InputSpec(shape=("like",))


def _required(p: inspect.Parameter) -> bool:
    return (p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def _dedupe(attempts: list[Attempt]) -> list[Attempt]:
    seen, out = set(), []
    for a in attempts:
        key = (a.init_code, a.call_code, json.dumps(a.params, sort_keys=True, default=str),
               a.inputs)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def crawl_names(names: list[str]) -> Iterator[SeedOp]:
    """Confirm each named candidate in this process (the worker side)."""
    from cuda_agent.synth import crawl_hf

    factories = dict(torch_candidates())
    factories.update(crawl_hf.candidates())
    for name in names:
        attempts = factories[name]() if name in factories else []
        best = None
        for attempt in attempts:
            entry = confirm(attempt)
            if entry.status != "failed":
                best = entry
                break
            best = best or entry
        yield best or SeedOp(op=name, call_code="", inputs=(), error="no argument pattern")


def crawl(workers: int = 2, chunk: int = 40, timeout_s: float = 300.0,
          transformers: bool = True, progress: Callable[[int, int], None] | None = None
          ) -> list[SeedOp]:
    """Crawl every candidate in worker processes; a crashed chunk is retried op by op."""
    from cuda_agent.synth import crawl_hf

    names = [name for name, _ in torch_candidates()]
    if transformers:
        names += sorted(crawl_hf.candidates())
    chunks = [names[i:i + chunk] for i in range(0, len(names), chunk)]
    results: dict[str, SeedOp] = {}
    done = 0

    def run(part: list[str]) -> None:
        nonlocal done
        got = _run_chunk(part, timeout_s)
        for name in part:
            if name not in got:
                got.update(_run_chunk([name], timeout_s / 4) or {
                    name: SeedOp(op=name, call_code="", inputs=(), error="crashed or hung")})
        results.update(got)
        done += len(part)
        if progress:
            progress(done, len(names))

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, chunks))
    return [results[name] for name in names]


def _run_chunk(names: list[str], timeout_s: float) -> dict[str, SeedOp]:
    try:
        proc = subprocess.run([sys.executable, "-m", "cuda_agent.synth.crawl", *names],
                              capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=_worker_env())
        out = proc.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    got = {}
    for line in out.splitlines():
        if line.startswith("{"):
            entry = SeedOp.model_validate_json(line)
            got[entry.op] = entry
    return got


def _worker_env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


if __name__ == "__main__":
    for entry in crawl_names(sys.argv[1:]):
        print(entry.to_json(), flush=True)
