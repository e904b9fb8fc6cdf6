"""Ship: ``cuda-agent export`` writes a package that needs no cuda-agent; its setup.py
describes the right extension, and with the extension in place its own test passes.

The full ``pip install`` compiles the torch binding layer from scratch (minutes on a small
machine), so it runs only with CUDA_AGENT_TEST_PIP=1; the fast test puts the module that
the project's builder made (cached) where setuptools would, and runs the package's test.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.build import BuildConfig, Builder
from cuda_agent.cli.main import app
from cuda_agent.integrate import IntegrateError
from cuda_agent.integrate.export import export, relative_import
from tests.integrate.putback_fixtures import make_result

runner = CliRunner()
ALONE = """
import sys
sys.modules["cuda_agent"] = None  # any import of cuda_agent now fails
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests"]))
"""


def _exported(tmp_path: Path, device: str = "cpu") -> Path:
    out = tmp_path / "pkg"
    done = runner.invoke(app, ["export", str(make_result(tmp_path / "run", device)),
                               "--name", "gelu_fast", "--out", str(out)])
    assert done.exit_code == 0, done.output
    return out


def _run(args: list[str], cwd: Path, path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_export_layout_setup_and_package_test(tmp_path: Path):
    out = _exported(tmp_path)
    package = out / "gelu_fast"
    for name in ("pyproject.toml", "setup.py", "README.md", "tests/test_reference.py",
                 "gelu_fast/csrc/binding.cpp", "gelu_fast/csrc/binding_registry.h",
                 "gelu_fast/csrc/kernels/gelu_bias_scale.cpp", "gelu_fast/reference.py"):
        assert (out / name).is_file(), name
    assert "from . import cuda_extension" in (package / "model_new.py").read_text()
    assert not any("cuda_agent" in p.read_text() for p in out.rglob("*.py"))
    [ext] = runpy.run_path(str(out / "setup.py"), run_name="probe")["extensions"]()
    assert type(ext).__name__ == "Extension" and ext.name == "gelu_fast.cuda_extension"
    assert "-fopenmp" in ext.extra_compile_args["cxx"]
    assert all((out / s).is_file() for s in ext.sources) and len(ext.sources) == 3
    # build in place: the project's builder (cached objects) stands in for build_ext
    built = Builder(BuildConfig(device="cpu")).build(out / "gelu_fast" / "csrc")
    assert built.ok, built.log
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.copy2(built.extension_path, package / f"cuda_extension{suffix}")
    for library in Path(built.extension_path).parent.glob("lib*.so"):  # the fixed layer's
        shutil.copy2(library, package / library.name)
    tested = _run(["-c", ALONE], out, out)
    assert tested.returncode == 0 and "2 passed" in tested.stdout, tested.stdout + tested.stderr


def test_export_refuses_bad_names_and_used_folders(tmp_path: Path):
    result = make_result(tmp_path / "run")
    with pytest.raises(IntegrateError, match="Python identifier"):
        export(result, "gelu-fast", tmp_path / "a")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep").write_text("x")
    done = runner.invoke(app, ["export", str(result), "--name", "g", "--out",
                               str(tmp_path / "used")])
    assert done.exit_code == 2 and "not empty" in done.output


def test_relative_import_forms():
    aliased = relative_import("import cuda_extension as ce\n")
    assert aliased == "from . import cuda_extension as ce\n"
    assert relative_import("from cuda_extension import f\n") == "from .cuda_extension import f\n"
    with pytest.raises(IntegrateError, match="line of its own"):
        relative_import("import torch, cuda_extension\n")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CUDA_AGENT_TEST_PIP"),
                    reason="compiles the binding layer from scratch; set CUDA_AGENT_TEST_PIP=1")
def test_pip_install_and_run_the_package_test(tmp_path: Path):
    _pip_install_and_test(tmp_path, "cpu")


@pytest.mark.gpu
def test_cuda_package_installs_with_pip_and_passes_its_test(tmp_path: Path):
    """The CUDA solution shipped: nvcc builds it in ``pip install``, and the package's own
    test (ModelNew against the reference on the GPU) passes without cuda-agent."""
    _pip_install_and_test(tmp_path, "cuda")


def _pip_install_and_test(tmp_path: Path, device: str) -> None:
    out = _exported(tmp_path, device)
    target = tmp_path / "site"
    pip = _run(["-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                "--target", str(target), str(out)], tmp_path, target)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert list((target / "gelu_fast").glob("cuda_extension*.so"))
    shutil.rmtree(out / "gelu_fast")  # the test must import the installed copy
    tested = _run(["-c", ALONE], out, target)
    assert tested.returncode == 0 and "2 passed" in tested.stdout, tested.stdout + tested.stderr


def test_export_leaves_out_the_unused_template_example(tmp_path: Path):
    from cuda_agent.paths import TEMPLATES

    result = make_result(tmp_path / "run")
    for path in (TEMPLATES / "cpu" / "kernels").iterdir():
        shutil.copy2(path, result / "result" / "kernels" / path.name)
    done = export(result, "gelu_fast", tmp_path / "pkg")
    assert not [f for f in done.files if "example_axpby" in f], done.files
    assert "gelu_fast/csrc/kernels/gelu_bias_scale.cpp" in done.files
