import json
from pathlib import Path

from cuda_agent.judge.static_check import check_source
from cuda_agent.workspace.stub import render_stub

HEAD = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        "import cuda_extension\n")


def _forward(body: str) -> list[str]:
    return check_source(f"{HEAD}class ModelNew(nn.Module):\n    def forward(self, x):\n"
                        f"        {body}\n")


def test_honest_forward_is_clean():
    assert _forward("out = torch.empty_like(x)\n        cuda_extension.op(x.contiguous(), out)"
                    "\n        return out.view(-1)") == []


def test_compute_calls_are_named():
    assert "calls F.relu" in _forward("return F.relu(x)")[0]
    assert "calls torch.matmul" in _forward("return torch.matmul(x, x)")[0]
    assert "calls .sum()" in _forward("return x.sum()")[0]


def test_fallback_and_reference_imports():
    assert "try/except" in _forward("try:\n            return cuda_extension.op(x)\n"
                                    "        except Exception:\n            return x")[0]
    problems = check_source(f"{HEAD}from model import Model\nclass ModelNew(Model):\n    pass\n")
    assert any("imports the reference module" in p for p in problems)
    assert any("inherits from the reference Model" in p for p in problems)


def test_introspection_is_refused():
    problems = check_source("import gc\nimport sys\nobjs = gc.get_objects()\n"
                            "frame = sys._getframe(1)\nclass ModelNew:\n    pass\n")
    assert len([p for p in problems if "introspect" in p]) == 2


def test_missing_class_and_syntax():
    assert check_source("x = 1\n") == ["model_new.py defines no class `ModelNew`"]
    assert "syntax error" in check_source("def (:\n")[0]


def test_a_candidate_may_not_look_at_the_profiler():
    sources = ["import torch.profiler\n",
               "from torch.autograd import profiler\n",
               "on = torch._C._autograd._profiler_enabled()\n",
               "on = getattr(torch.autograd, 'PROFILER'.lower())\n",
               "import ctypes\nlib = ctypes.CDLL('libcupti.so')\n",
               "import ctypes\nlib = ctypes.CDLL(b'libcupti.so.13')\n",
               "SRC = '#include <cupti.h>\\nint on() { return 1; }'\n"]
    for source in sources:
        problems = check_source(f"{HEAD}{source}class ModelNew(nn.Module):\n    pass\n")
        assert any("how the judge records the device" in p for p in problems), source
    # prose and one's own names pass: a docstring, a comment in a kernel's source, a flag
    honest = ('"""Fused GEMM + bias: the profiler showed the GEMM dominates."""\n'
              "SRC = '// tuned with the profiler: 4 warps per row\\n'\n"
              "use_profiler = False\n")
    assert check_source(f"{HEAD}{honest}class ModelNew(nn.Module):\n    def forward(self, x):\n"
                        "        return cuda_extension.profile_free(x)\n") == []


# --- no refusal by a function's name: only what resolves to PyTorch (invariant 8) -----------

INLINE_HEAD = ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import "
               "load_inline\n\next = load_inline('k', cpp_sources='', functions=['mm'])\n")


def _model(head: str, init: str, forward: str, args: str = "x") -> list[str]:
    return check_source(f"{head}\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
                        f"        super().__init__()\n        {init}\n\n"
                        f"    def forward(self, {args}):\n        {forward}\n")


def test_extension_functions_named_like_pytorch_pass():
    for forward in ("return ext.mm(x, x)", "return cuda_extension.sum(x)",
                    "return self.ext.matmul(x, x.t().contiguous())",
                    "return F.relu(x)", "out = ext.mm(x, x)\n        return ext.add(out, x)"):
        init = "self.ext = ext"
        head = INLINE_HEAD + "import cuda_extension\nF = ext\n"  # F: an extension, not torch
        assert _model(head, init, forward) == [], forward


def test_what_resolves_to_pytorch_is_refused():
    cases = [
        ("from torch import matmul\n", "pass", "return matmul(x, x)",
         "calls matmul = torch.matmul"),
        ("import torch.nn.functional as fn\n", "pass", "return fn.relu(x)",
         "calls fn.relu = torch.nn.functional.relu"),
        ("from torch.nn import functional\n", "pass", "return functional.gelu(x)",
         "calls functional.gelu = torch.nn.functional.gelu"),
        ("import torch as T\n", "pass", "return T.mm(x, x)", "calls T.mm = torch.mm"),
        ("", "pass", "return nn.functional.silu(x)", "calls nn.functional.silu"),
        ("", "pass", "return torch.ops.aten.mm(x, x)", "calls torch.ops.aten.mm"),
        ("", "pass", "return torch.Tensor.sum(x)", "calls torch.Tensor.sum"),
        ("", "pass", "return x.view(-1).sum()", "calls .sum() on a tensor"),
        ("", "pass", "y = x.t()\n        return y.mm(x)", "calls .mm() on a tensor"),
        ("", "pass", "return inputs[0].mm(inputs[1])", "calls .mm() on a tensor"),
        ("", "self.w = nn.Parameter(torch.ones(3))", "return self.w.matmul(x)",
         "calls .matmul() on a tensor"),
        ("", "self.register_buffer('b', torch.ones(3))", "return self.b.add_(x)",
         "calls .add_() on a tensor"),
        ("", "self.ln = nn.LayerNorm(3)", "return self.ln.weight.exp()",
         "calls .exp() on a tensor"),
        ("", "self.lin = nn.Linear(3, 3)", "return self.lin(x)",
         "calls self.lin, a torch.nn.Linear"),
        ("", "pass", "out = torch.empty_like(x)\n        return out.add_(x)",
         "calls .add_() on a tensor"),
    ]
    for head, init, forward, needle in cases:
        args = "*inputs" if "inputs" in forward else "x"
        problems = _model(HEAD + head, init, forward, args)
        assert len(problems) == 1 and needle in problems[0] and "not allowed" in problems[0], \
            (forward, problems)


def test_views_metadata_and_sub_modules_of_ones_own_pass():
    forward = ("n = x.size(0) * x.shape[1]\n        y = x.reshape(n).contiguous()\n"
               "        out = torch.empty_like(y)\n        out.zero_()\n"
               "        w = self.lin.weight.t().contiguous()\n"
               "        return cuda_extension.gemm(y, w, self.block(out), self.ident(out))")
    init = ("self.lin = nn.Linear(3, 3)\n        self.block = Block()\n"
            "        self.ident = nn.Identity()")
    head = HEAD + "class Block(nn.Module):\n    def forward(self, x):\n        return x\n"
    assert _model(head, init, forward) == []


# --- routes to native code, other programs and the judge (invariants 4 and 6) ----------------

ROUTES = [
    ("import ctypes\n", "imports ctypes (not allowed: loads or calls native code"),
    ("from cffi import FFI\n", "imports cffi (not allowed: loads or calls native code"),
    ("import importlib\n", "imports importlib (not allowed: imports modules by computed"),
    ("gc = __import__('gc')\n", "uses __import__ (not allowed: imports modules by computed"),
    ("exec('y = 1')\n", "uses exec (not allowed: runs code built from strings"),
    ("y = eval('1')\n", "uses eval (not allowed: runs code built from strings"),
    ("code = compile('1', 'f', 'eval')\n", "uses compile (not allowed: runs code built"),
    ("import builtins\n", "imports builtins (not allowed: reaches exec, eval"),
    ("import os\nos.system('true')\n", "uses os.system (not allowed: starts other programs"),
    ("from os import popen\n", "uses os.popen (not allowed: starts other programs"),
    ("import os\nos.execv('/bin/true', ['true'])\n", "uses os.execv (not allowed: starts"),
    ("import subprocess\n", "imports subprocess (not allowed: starts other programs"),
    ("import mmap\n", "imports mmap (not allowed: maps files or executable memory"),
    ("import cuda_agent.judge.timing\n", "imports cuda_agent.judge.timing (not allowed: "
                                         "the judge's own package"),
    ("from cuda_agent.judge import guard\n", "imports cuda_agent.judge (not allowed: the "
                                             "judge's own package"),
    ("import sys\nloaded = sys.modules\n", "uses sys.modules (not allowed: a candidate may "
                                           "not introspect"),
    ("torch.ops.load_library('k.so')\n", "uses torch.ops.load_library (not allowed: loads"),
]


def test_routes_to_native_code_and_the_judge_are_refused():
    for source, needle in ROUTES:
        problems = check_source(f"{HEAD}{source}class ModelNew(nn.Module):\n    pass\n")
        assert any(needle in p for p in problems), (source, problems)


def test_names_that_only_look_like_routes_pass():
    source = (f"{HEAD}import os\n\ndef compile(model):\n    return model\n\n"
              "FAST = os.environ.get('FAST', '') + os.path.join('a', 'b')\n"
              "class ModelNew(nn.Module):\n    def forward(self, x):\n"
              "        return cuda_extension.op(compile(x))\n")
    assert check_source(source) == []


# --- no false refusal of the repository's honest candidates ----------------------------------

def _honest_sources(tmp_path: Path) -> dict[str, str]:
    from tests import conftest
    from tests.judge.adversarial import helpers, test_correctness_hacks, test_cuda_hacks
    from tests.judge.adversarial.test_tampering import HONEST_FORWARD

    repo = Path(__file__).resolve().parents[2]
    sources = {str(p.relative_to(repo)): p.read_text() for pattern in (
        "src/cuda_agent/examples/*/solution/*/model_new.py", "benchmarks/**/model_new.py")
        for p in repo.glob(pattern)}
    sources |= {"conftest SCALE_ADD_MODEL_NEW": conftest.SCALE_ADD_MODEL_NEW,
                "conftest INLINE_SCALE_ADD": conftest.INLINE_SCALE_ADD,
                "test_tampering HONEST_FORWARD": helpers.scale_add_model(HONEST_FORWARD)}
    written = {f"test_correctness_hacks {name}": write for name, (_, write) in
               test_correctness_hacks.HONEST.items()}
    written["test_cuda_hacks honest gemm"] = test_cuda_hacks.gemm_ws(
        "cuda_extension.gemm_fp32(inputs[0], inputs[1])")
    for name, write in written.items():
        sources[name] = (write(tmp_path / name.replace(" ", "_")) / "model_new.py").read_text()
    tasks = {"scale_add": conftest.SCALE_ADD_TASK, **helpers.TASKS}
    tasks |= {p.parent.name: p.read_text() for p in
              repo.glob("src/cuda_agent/examples/*/model.py")}
    sources |= {f"stub of {name}": render_stub(code, name) for name, code in tasks.items()}
    return sources


def test_the_repositorys_honest_candidates_pass(tmp_path: Path):
    sources = _honest_sources(tmp_path)
    assert len(sources) >= 20
    refused = {name: check_source(text) for name, text in sources.items()}
    assert {name: p for name, p in refused.items() if p} == {}


def test_every_kernelbench_stub_passes(kernelbench: Path):
    """The starting model_new.py of each KernelBench task (the workspace stub)."""
    records = [json.loads(line) for line in kernelbench.read_text().splitlines() if line]
    refused = {r["name"]: check_source(render_stub(r["code"], r["name"])) for r in records}
    assert len(refused) > 200 and {n: p for n, p in refused.items() if p} == {}
