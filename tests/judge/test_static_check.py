from cuda_agent.judge.static_check import check_source

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
