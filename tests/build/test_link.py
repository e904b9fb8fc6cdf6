"""The two-stage link (CPU; CUDA on the GPU machine): the fixed layer once into a library
with libtorch, each module against it; a module cannot bring the fixed layer's symbols, its
symbols never stand in for the ones the fixed layer calls, and modules keep their own
bindings.

    pytest -q tests/build/test_link.py
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder
from cuda_agent.build.link import FIXED_PREFIX
from tests.conftest import write_solution


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def builder(request) -> Builder:
    """The CPU toolchain, and (GPU machine) the CUDA one: its fixed library has libtorch_cuda
    and the device timer; the kernels here are C++ on CPU tensors either way."""
    return Builder(BuildConfig(device=request.param))


def needed(library: str | Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                         check=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_module_needs_the_fixed_library_not_libtorch(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    result = builder.build(tmp_path, publish=True)
    assert result.ok, result.log
    module = Path(result.extension_path or "")
    libs = needed(module)
    fixed = [name for name in libs if name.startswith(FIXED_PREFIX)]
    assert len(fixed) == 1 and not any("torch" in name or "c10" in name for name in libs)
    assert (module.parent / fixed[0]).is_file()  # found by $ORIGIN
    assert any("torch" in name for name in needed(module.parent / fixed[0]))
    published = tmp_path / "build"
    assert sorted(p.name for p in published.iterdir()) == sorted([module.name, fixed[0]])
    done = run_python(f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("cuda_extension", "{published / module.name}")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        x = torch.ones(4)
        print(m.scale_add(x, x, 2.0).tolist(), m._bindings())
    """)
    assert done.stdout.strip() == "[3.0, 3.0, 3.0, 3.0] ['scale_add']", done.stderr[-2000:]


def test_a_kernel_defining_the_entry_point_is_refused(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    (tmp_path / "kernels" / "entry.cpp").write_text(
        'extern "C" void* PyInit_cuda_extension() { return nullptr; }\n')
    result = builder.build(tmp_path)
    assert not result.ok and result.extension_path is None
    assert "defines `PyInit_cuda_extension`" in result.log


# A kernel standing in for the tensor fill the fixed layer poisons outputs with: it counts
# its calls and does not fill.
HIJACK = """
#include <cstdint>
#include "binding_registry.h"
static int64_t hijacked = 0;
extern "C" void* hijack_fill(void* self, const void* value) __asm__("{symbol}");
extern "C" void* hijack_fill(void* self, const void*) {{ ++hijacked; return self; }}
static cuda_ext::Outputs hijacks(const cuda_ext::Args& args) {{
  cuda_ext::Tensor out = cuda_ext::empty({{1}}, cuda_ext::DType::Int64, -1);
  *out.data_ptr<int64_t>() = hijacked;
  return {{out}};
}}
REGISTER_BINDING(hijacks, "hijacks() -> Tensor", hijacks);
"""


def test_kernel_symbols_never_stand_in_for_the_fixed_layers(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    assert builder.build(tmp_path).ok
    fixed = next(Path(builder.build(tmp_path).extension_path or "").parent.glob(
        f"{FIXED_PREFIX}*.so"))
    symbols = subprocess.run(["nm", "-D", "--undefined-only", str(fixed)], capture_output=True,
                             text=True, check=True).stdout.split()
    fill = next(s for s in symbols if "fill__Scalar4call" in s)
    (tmp_path / "kernels" / "hijack_binding.cpp").write_text(HIJACK.format(symbol=fill))
    result = builder.build(tmp_path)
    assert result.ok, result.log
    probe = """
        import torch
        {load}
        m._set_output_poison(True)
        x = torch.ones(4)
        out = m.scale_add(x, x, 2.0)
        print(int(m.hijacks()[0]))
    """
    judged = run_python(probe.format(load=f"""
        from cuda_agent.build import load_extension
        m = load_extension("{result.extension_path}")"""))
    assert judged.stdout.strip() == "0", judged.stderr[-2000:]  # the fixed layer's own fill
    plain = run_python(probe.format(load=f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("cuda_extension", "{result.extension_path}")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)"""))
    assert int(plain.stdout.strip()) > 0, plain.stderr[-2000:]  # what the preload prevents


def test_two_modules_with_the_same_binding_in_one_process(tmp_path: Path, builder: Builder):
    """Built modules share the fixed library, not its registry: each has its own bindings
    (integration loads one module per result)."""
    write_solution(tmp_path / "a")
    write_solution(tmp_path / "b")
    kernel = tmp_path / "b" / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text().replace("alpha * x[i] + y[i]", "alpha * x[i] - y[i]"))
    paths = [builder.build(tmp_path / name).extension_path for name in "ab"]
    assert all(paths) and paths[0] != paths[1]
    done = run_python(f"""
        import importlib.util, torch
        from cuda_agent.build import load_extension
        x = torch.ones(2)
        for i, path in enumerate({paths!r}):
            spec = importlib.util.spec_from_file_location(f"r{{i}}.cuda_extension", path)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            print(m._bindings(), m.scale_add(x, x, 2.0).tolist())
    """)
    assert done.stdout.split("\n")[:2] == ["['scale_add'] [3.0, 3.0]",
                                           "['scale_add'] [1.0, 1.0]"], done.stderr[-2000:]


def test_a_kernel_defining_a_fixed_layer_function_is_refused(tmp_path: Path, builder: Builder):
    """A kernel's own ``cuda_ext::empty`` (hidden, so no other module sees it) would hand its
    bindings outputs that are never poisoned."""
    write_solution(tmp_path)
    (tmp_path / "kernels" / "alloc_binding.cpp").write_text(
        '#include "binding_registry.h"\nnamespace cuda_ext {\n'
        '__attribute__((visibility("hidden"))) Tensor empty(const std::vector<int64_t>& s, '
        'DType d, int device) { Tensor t; t.sizes = s; t.dtype = d; t.device = device; '
        'return t; }\n}\n')
    result = builder.build(tmp_path)
    assert not result.ok and "defines `_ZN8cuda_ext5empty" in result.log, result.log
