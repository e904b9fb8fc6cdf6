"""Real compiles with g++ (and nvcc where present): cache hits, incremental rebuilds, errors."""

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from cuda_agent.build import BuildConfig, Builder, load_extension
from cuda_agent.build.builder import BINDING_LABEL, TIMER_LABEL, TIMER_SOURCE
from tests.conftest import write_solution


@pytest.fixture
def builder() -> Builder:
    return Builder(BuildConfig(device="cpu"))


def test_build_load_and_cache(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    first = builder.build(tmp_path, publish=True)
    assert first.ok, first.log
    assert (tmp_path / "build").is_dir()
    second = builder.build(tmp_path)
    assert second.ok and second.compiled == ()
    assert set(second.cached) == {"kernels/scale_add.cpp", "kernels/scale_add_binding.cpp"}
    assert second.extension_path == first.extension_path
    module = load_extension(second.extension_path)
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(module.scale_add(x, y, 2.0), 2.0 * x + y)
    assert module._bindings() == ["scale_add"]
    assert not hasattr(module, "_block_device")  # the device timer is for CUDA builds only
    with pytest.raises(ValueError, match="y must match x"):
        module.scale_add(x, torch.randn(3), 2.0)
    with pytest.raises(ValueError, match="argument 2 has unsupported type"):
        module.scale_add(x, y, "two")
    with pytest.raises(ValueError, match="argument 2 must be a float"):
        module.scale_add(x, y, x)


def test_edit_one_kernel_recompiles_only_it(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    assert builder.build(tmp_path).ok
    kernel = tmp_path / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text() + f"\n// edit {uuid.uuid4()}\n")
    result = builder.build(tmp_path)
    assert result.ok
    assert result.compiled == ("kernels/scale_add.cpp",)
    assert result.cached == ("kernels/scale_add_binding.cpp",)


def test_same_sources_elsewhere_hit_the_cache(tmp_path: Path, builder: Builder):
    write_solution(tmp_path / "a")
    assert builder.build(tmp_path / "a").ok
    shutil.copytree(tmp_path / "a" / "kernels", tmp_path / "b" / "kernels")
    assert builder.build(tmp_path / "b").compiled == ()


def test_header_change_invalidates(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    (tmp_path / "kernels" / "common.h").write_text(f"// {uuid.uuid4()}\n#define K 1\n")
    assert builder.build(tmp_path).ok
    (tmp_path / "kernels" / "common.h").write_text(f"// {uuid.uuid4()}\n#define K 2\n")
    assert len(builder.build(tmp_path).compiled) == 2


def test_compile_error_has_file_and_line(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    kernel = tmp_path / "kernels" / "scale_add.cpp"
    lines = kernel.read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if "out[i] =" in line)
    lines[target] = lines[target].replace("alpha * x[i]", "alpha * missing_name[i]")
    kernel.write_text("\n".join(lines))
    result = builder.build(tmp_path)
    assert not result.ok and result.extension_path is None
    (error,) = result.errors
    assert error.file == "kernels/scale_add.cpp"
    assert error.line == target + 1
    assert "missing_name" in error.message


def test_link_error_reported(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    (tmp_path / "kernels" / "scale_add.cpp").write_text("// launcher removed\n")
    result = builder.build(tmp_path)
    assert not result.ok
    assert "undefined symbol `scale_add_launch`" in result.errors[0].message


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: (root / "kernels").mkdir(), "kernels/ holds no sources"),
        (lambda root: None, "no kernels/ folder"),
        (lambda root: ((root / "kernels").mkdir(), (root / "kernels" / "k.cu").write_text("")),
         "CUDA sources need --device cuda"),
    ],
)
def test_bad_workspaces(tmp_path: Path, builder: Builder, setup, message: str):
    setup(tmp_path)
    result = builder.build(tmp_path)
    assert not result.ok
    assert message in result.errors[0].message


def test_symlinked_source_refused(tmp_path: Path, builder: Builder):
    write_solution(tmp_path)
    (tmp_path / "kernels" / "evil.cpp").symlink_to("/etc/hostname")
    result = builder.build(tmp_path)
    assert not result.ok and "symbolic links" in result.errors[0].message


@pytest.mark.nvcc
def test_nvcc_compiles_cuda_sources_and_reports_errors(tmp_path: Path):
    """Compile-only check of the CUDA path (no GPU needed to compile)."""
    builder = Builder(BuildConfig(device="cuda", arch="90a"))
    from cuda_agent.build import toolchain

    chain = toolchain.detect("cuda", builder.cache, arch="90a")
    builder._chain = chain
    (tmp_path / "kernels").mkdir()
    src = tmp_path / "kernels" / "k.cu"
    src.write_text(
        f"// {uuid.uuid4()}\n"
        "#include <cuda_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] = 1; }\n"
        'extern "C" void k_launch(float* x, cudaStream_t s) { k<<<1, 32, 0, s>>>(x); }\n')
    source, status, obj, log = _unit(builder, chain, tmp_path)
    assert status == "compiled", log
    assert obj.exists()
    assert _unit(builder, chain, tmp_path)[1] == "cached"
    src.write_text(f"// {uuid.uuid4()}\n"
                   "__global__ void k(float* x) { x[threadIdx.x] = undefined_y; }\n")
    _, status, _, log = _unit(builder, chain, tmp_path)
    from cuda_agent.build.diagnostics import parse

    (error,) = [d for d in parse(log) if d.file]
    assert status == "failed" and (error.file, error.line) == ("kernels/k.cu", 2)


@pytest.mark.nvcc
@pytest.mark.slow
def test_fixed_binding_layer_compiles_for_cuda(tmp_path: Path):
    """The CUDA variant of binding.cpp compiles here too: torch's CPU wheel ships the c10/cuda
    headers except one generated at torch's build, which the test supplies."""
    from cuda_agent.build import toolchain

    shim = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    shim.parent.mkdir(parents=True)
    shim.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    builder = Builder(BuildConfig(device="cuda", arch="90a", extra_cflags=(f"-I{tmp_path}",)))
    chain = toolchain.detect("cuda", builder.cache, arch="90a")
    binding = next(src for label, src, _ in builder._fixed_sources(chain)
                   if label == BINDING_LABEL)
    ok, log, obj = builder._fixed_object(chain, binding, True)
    assert ok, log
    assert obj.exists()
    assert _symbols(obj, "U") >= TIMER_SYMBOLS  # the CUDA binding calls the device timer


TIMER_SYMBOLS = {"cuda_agent_judge_block_device", "cuda_agent_judge_blocker_info",
                 "cuda_agent_judge_error"}


def _symbols(obj: Path, kind: str) -> set[str]:
    """Names of ``obj``'s symbols of nm type ``kind`` ('T' defined, 'U' undefined)."""
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    return {parts[-1] for parts in map(str.split, out.splitlines())
            if len(parts) >= 2 and parts[-2] == kind}


def test_cpu_fixed_layer_has_no_device_timer(builder: Builder):
    labels = [label for label, _, _ in builder._fixed_sources(builder.chain)]
    assert labels == [BINDING_LABEL]
    assert builder.chain.nvcc is None


@pytest.mark.nvcc
def test_device_timer_compiles_once_for_cuda():
    """The trusted timer source is the package's, compiled with nvcc as part of the fixed
    layer, and defines what the CUDA binding layer calls."""
    from cuda_agent.build import toolchain

    builder = Builder(BuildConfig(device="cuda", arch="90a"))
    chain = toolchain.detect("cuda", builder.cache, arch="90a")
    builder._chain = chain
    assert (TIMER_LABEL, TIMER_SOURCE, False) in builder._fixed_sources(chain)
    assert "src/cuda_agent/build" in TIMER_SOURCE.as_posix()
    ok, log, obj = builder._fixed_object(chain, TIMER_SOURCE, False)
    assert ok, log
    assert builder._fixed_object(chain, TIMER_SOURCE, False) == (True, None, obj)  # cached
    assert _symbols(obj, "T") >= TIMER_SYMBOLS


def _unit(builder, chain, root: Path) -> tuple:
    """Compile ``root/kernels/k.cu`` alone: the builder's (source, status, object, log)."""
    return builder._object(Path("kernels/k.cu"), chain, builder.kernel_files(root))
