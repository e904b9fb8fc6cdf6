"""nvcc's stages run as a graph: the object, the errors and the fallback match plain nvcc.

Compile only (sm_90, no GPU needed); skipped where nvcc is not on PATH.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest

from cuda_agent.build import nvcc_split, toolchain
from cuda_agent.build.builder import BuildConfig, Builder
from cuda_agent.build.diagnostics import parse

pytestmark = pytest.mark.nvcc
NVCC = toolchain.find_nvcc() or "nvcc"
GENCODE = "-gencode=arch=compute_90,code=sm_90"


def _kernels(name: str) -> str:
    """Two kernels and a host launcher ``NAME_launch``; a fresh comment defeats any cache."""
    return f"""// {uuid.uuid4()}
#include <cuda_runtime.h>
__global__ void {name}_scale(float* x, float a, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}}
__global__ void {name}_shift(float* x, float b, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b;
}}
extern "C" void {name}_launch(float* x, float a, float b, int n, cudaStream_t s) {{
  {name}_scale<<<(n + 255) / 256, 256, 0, s>>>(x, a, n);
  {name}_shift<<<(n + 255) / 256, 256, 0, s>>>(x, b, n);
}}
"""


def _source(root: Path, name: str, text: str) -> str:
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    (root / "kernels" / name).write_text(text)
    return f"kernels/{name}"


def _command(source: str, obj: Path, *extra: str) -> list[str]:
    return [NVCC, "-O3", "-std=c++17", "-lineinfo", GENCODE, *extra, "-Xcompiler", "-fPIC",
            "-c", source, "-o", str(obj)]


def _split(root: Path, cmd: list[str], timeout_s: float = 300) -> nvcc_split.Compiled:
    """compile_cu with its stage files under ``root/scratch``, which must be empty after."""
    scratch = root / "scratch"
    scratch.mkdir(exist_ok=True)
    done = nvcc_split.compile_cu(cmd, root, timeout_s, scratch=scratch)
    assert list(scratch.iterdir()) == []
    return done


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _fatbin_bytes(obj: Path) -> bytes:
    out = obj.with_suffix(".nv_fatbin")
    _run("objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(out))
    return out.read_bytes()


def _globals(obj: Path) -> set[str]:
    return {line.split()[-1] for line in _run("nm", "-g", "--defined-only", str(obj)).splitlines()}


def _link(objects: list[Path], out: Path) -> Path:
    """A shared library; --no-undefined fails on any symbol neither the objects nor cudart
    define (a fatbin symbol left undefined by the merge included)."""
    cudart = Path(toolchain._cuda_home(NVCC)) / "lib64"
    _run("g++", "-shared", "-o", str(out), *map(str, objects), f"-L{cudart}", "-lcudart",
         "-Wl,--no-undefined")
    return out


def _fatbin_pointers(lib: Path) -> tuple[int, list[int]]:
    """The ``.nv_fatbin`` address and where each fatbin wrapper's data pointer points."""
    sections = {m[1]: (int(m[2], 16), int(m[3], 16)) for m in re.finditer(
        r"\]\s+(\.\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", _run("readelf", "-SW",
                                                                           str(lib)))}
    start, size = sections[".nvFatBinSegment"]
    relocs = {int(m[1], 16): int(m[2], 16) for m in re.finditer(
        r"^([0-9a-f]+)\s+\S+\s+R_X86_64_RELATIVE\s+([0-9a-f]+)",
        _run("readelf", "-rW", str(lib)), re.M)}
    wrappers = range(start, start + size, 24)  # {magic, version, data, filename}
    return sections[".nv_fatbin"][0], [relocs[w + 8] for w in wrappers]


def test_split_object_matches_plain_nvcc(tmp_path: Path):
    source = _source(tmp_path, "k.cu", _kernels("k"))
    split = _split(tmp_path, _command(source, tmp_path / "split.o"))
    assert split.ok and split.fallback is None, split
    plain = nvcc_split.run_command(_command(source, tmp_path / "plain.o"), tmp_path, 300)
    assert plain.ok, plain.log
    fatbin = _fatbin_bytes(tmp_path / "split.o")
    assert len(fatbin) > 1000 and fatbin == _fatbin_bytes(tmp_path / "plain.o")
    assert "k_launch" in _globals(tmp_path / "split.o")
    assert _globals(tmp_path / "split.o") == _globals(tmp_path / "plain.o")
    split_lib = _link([tmp_path / "split.o"], tmp_path / "libsplit.so")
    plain_lib = _link([tmp_path / "plain.o"], tmp_path / "libplain.so")
    for lib in (split_lib, plain_lib):  # the wrapper nvcc registers points at the fatbin
        start, pointers = _fatbin_pointers(lib)
        assert pointers == [start]


def test_anonymous_namespace_kernels_differ_from_plain_nvcc_by_the_module_id_alone(
        tmp_path: Path):
    """The module id names the anonymous namespace; ours is written before the stages run
    (so cicc need not wait for cudafe++) and hashes the source's absolute path."""
    text = _kernels("k").replace("__global__", "namespace {\n__global__", 1).replace(
        "extern \"C\"", "}  // namespace\nextern \"C\"", 1)
    source = _source(tmp_path, "k.cu", text)
    done = _split(tmp_path, _command(source, tmp_path / "split.o"))
    assert done.ok and done.fallback is None, done
    plain = nvcc_split.run_command(_command(source, tmp_path / "plain.o"), tmp_path, 300)
    assert plain.ok, plain.log
    ours = nvcc_split.module_identifier(str(tmp_path / source))
    fatbin, plain_fatbin = _fatbin_bytes(tmp_path / "split.o"), _fatbin_bytes(tmp_path / "plain.o")
    # the namespace's mangled name: length, "_GLOBAL__N_", module id
    found = re.search(rb"_ZN(\d+)_GLOBAL__N_", plain_fatbin)
    assert found
    start = found.end()
    theirs = plain_fatbin[start:start + int(found[1]) - len("_GLOBAL__N_")]
    assert theirs.startswith(b"_") and b"_4_k_cu_" in theirs  # "_HASH_4_k_cu_..."
    assert theirs.decode() != ours and ours.encode() in fatbin and theirs not in fatbin
    assert len(theirs) == len(ours)  # for this source: then the bytes can be compared
    assert fatbin == plain_fatbin.replace(theirs, ours.encode())
    host_globals = {g.replace(theirs.decode(), ours) for g in _globals(tmp_path / "plain.o")}
    assert _globals(tmp_path / "split.o") == host_globals
    _link([tmp_path / "split.o"], tmp_path / "libsplit.so")


def test_two_split_objects_link_into_one_library(tmp_path: Path):
    objects = []
    for name in ("a", "b"):
        source = _source(tmp_path, f"{name}.cu", _kernels(name))
        objects.append(tmp_path / f"{name}.o")
        done = _split(tmp_path, _command(source, objects[-1]))
        assert done.ok and done.fallback is None, done
    lib = _link(objects, tmp_path / "libab.so")
    start, pointers = _fatbin_pointers(lib)
    sizes = [len(_fatbin_bytes(obj)) for obj in objects]
    assert sorted(pointers) == [start, start + sizes[0]]  # two fatbins, one after the other
    assert {"a_launch", "b_launch"} <= {line.split()[-1] for line in _run(
        "nm", "-D", "--defined-only", str(lib)).splitlines()}


BAD_SOURCES = {
    "front end": ("#include <cuda_runtime.h>\n"
                  "__global__ void k(float* x) { x[threadIdx.x] = undefined_y; }\n", 2),
    "device preprocessor": ("#ifdef __CUDA_ARCH__\n#error device only\n#endif\n"
                            "__global__ void k(float* x) { x[threadIdx.x] = 1; }\n", 2),
    "host compile": ('#include <cuda_runtime.h>\n'
                     '__attribute__((error("no host call"))) void boom();\n'
                     "__global__ void k(float* x) { x[threadIdx.x] = 1; }\n"
                     'extern "C" void launch(float* x, int n) {\n  if (n > 0) boom();\n'
                     "  k<<<1, 32>>>(x);\n}\n", 5),
    "ptxas": ("__global__ void k(float* x) {\n  __shared__ float big[100000];\n"
              "  big[threadIdx.x] = x[threadIdx.x];\n  __syncthreads();\n"
              "  x[threadIdx.x] = big[(threadIdx.x + 1) % 100000];\n}\n", None),
}


@pytest.mark.parametrize("stage", BAD_SOURCES)
def test_errors_come_back_as_plain_nvcc_gives_them(tmp_path: Path, stage: str):
    text, line = BAD_SOURCES[stage]
    source = _source(tmp_path, "bad.cu", f"// {uuid.uuid4()}\n{text}")
    split = _split(tmp_path, _command(source, tmp_path / "split.o"))
    plain = nvcc_split.run_command(_command(source, tmp_path / "plain.o"), tmp_path, 300)
    assert not split.ok and not plain.ok and split.fallback is None
    assert split.log == plain.log
    located = [(d.file, d.line) for d in parse(split.log) if d.severity == "error" and d.file]
    assert located == ([("kernels/bad.cu", line + 1)] if line else [])  # +1: the comment
    assert line or "ptxas" in split.log
    assert not (tmp_path / "split.o").exists()


def _dry_run(root: Path, cmd: list[str]) -> tuple[str, Path]:
    keep = root / "keep"
    keep.mkdir()
    return nvcc_split._dry_run(cmd, root, keep.resolve(), 60), keep.resolve()


def test_planner_takes_nvcc_stages_and_refuses_an_unknown_one(tmp_path: Path):
    source = _source(tmp_path, "k.cu", _kernels("k"))
    cmd = _command(source, tmp_path / "k.o")
    text, keep = _dry_run(tmp_path, cmd)
    plan = nvcc_split.plan_stages(text, keep, cmd[-1])
    assert [s.kind for s in plan.stages] == [*nvcc_split.NVCC_ORDER, "fatbin-obj", "merge",
                                             "localize"]
    lines = text.splitlines()
    odd = "\n".join([*lines[:-1], "#$ mystery-tool --frobnicate x.ii", lines[-1]])
    with pytest.raises(nvcc_split.PlanError, match="unexpected stage"):
        nvcc_split.plan_stages(odd, keep, cmd[-1])
    with pytest.raises(nvcc_split.PlanError, match="unexpected dry-run output"):
        nvcc_split.plan_stages(text + "\nnvcc warning : something new\n", keep, cmd[-1])
    with pytest.raises(nvcc_split.PlanError, match="cannot expand"):
        nvcc_split.plan_stages(text.replace("$CICC_PATH", "$NO_SUCH_VAR"), keep, cmd[-1])


def test_unexpected_dry_run_falls_back_to_plain_nvcc(tmp_path: Path, monkeypatch):
    source = _source(tmp_path, "k.cu", _kernels("k"))
    real = nvcc_split._dry_run

    def odd(*args, **kwargs) -> str:
        lines = real(*args, **kwargs).splitlines()
        return "\n".join([*lines[:-1], "#$ mystery-tool --frobnicate x.ii", lines[-1]])

    monkeypatch.setattr(nvcc_split, "_dry_run", odd)
    done = _split(tmp_path, _command(source, tmp_path / "k.o"))
    assert done.ok and done.fallback and "unexpected stage" in done.fallback
    assert "k_launch" in _globals(tmp_path / "k.o")


@pytest.mark.parametrize("extra", [("-gencode=arch=compute_80,code=sm_80",), ("-rdc=true",)])
def test_several_architectures_or_rdc_fall_back(tmp_path: Path, extra: tuple[str, ...]):
    source = _source(tmp_path, "k.cu", _kernels("k"))
    done = _split(tmp_path, _command(source, tmp_path / "k.o", *extra))
    assert done.ok and done.fallback, done
    assert "k_launch" in _globals(tmp_path / "k.o")


def test_changed_fatbin_layout_falls_back_late(tmp_path: Path, monkeypatch):
    """The stand-in is written before fatbinary runs; a layout it does not expect is only
    seen afterwards, and then plain nvcc builds the object."""
    monkeypatch.setattr(nvcc_split, "_ASM_END", '".text\\n" /* changed */);\n')
    source = _source(tmp_path, "k.cu", _kernels("k"))
    done = _split(tmp_path, _command(source, tmp_path / "k.o"))
    assert done.ok and done.fallback == "fatbin.c is not laid out as expected"
    assert "k_launch" in _globals(tmp_path / "k.o")


SLOW = """
template <int N> __global__ void slow(float* x) {
  float v = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 2000; ++i) v = v * 1.0001f + static_cast<float>(N * i % 7);
  x[threadIdx.x] = v;
}
""" + "".join(f"template __global__ void slow<{k}>(float*);\n" for k in range(40))
"""Kernels that take cicc and ptxas about 3.4 s on two cores (the plain ones take 0.4 s)."""


def test_timeout_stops_the_stages(tmp_path: Path):
    source = _source(tmp_path, "k.cu", _kernels("k") + SLOW)
    done = _split(tmp_path, _command(source, tmp_path / "k.o"), timeout_s=1.0)
    assert not done.ok and "timed out" in done.log
    assert not (tmp_path / "k.o").exists()


def test_builder_keeps_split_and_plain_objects_apart(tmp_path: Path):
    assert BuildConfig().split_nvcc
    _source(tmp_path, "k.cu", _kernels("k"))
    keys = set()
    for split in (True, False):
        builder = Builder(BuildConfig(device="cuda", arch="90", split_nvcc=split))
        chain = toolchain.detect("cuda", builder.cache, arch="90")
        _, status, obj, log = _unit(builder, chain, tmp_path)
        assert status == "compiled", log
        keys.add(obj)
    assert len(keys) == 2


def _unit(builder, chain, root: Path) -> tuple:
    """Compile ``root/kernels/k.cu`` alone: the builder's (source, status, object, log)."""
    return builder._object(Path("kernels/k.cu"), chain, builder.kernel_files(root))
