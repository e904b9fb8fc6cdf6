"""Find the compilers, torch headers and target architecture for a build.

Detection imports torch and may query the GPU, so its result is cached on disk under a key
that is cheap to compute (interpreter, torch version and location, compilers, overrides);
a warm build never imports torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

DETECT_VERSION = "2"
"""Bump when detection changes, so cached toolchain records are taken again."""


class ToolchainError(RuntimeError):
    """A compiler or library the build needs is missing."""


@dataclass(frozen=True)
class Toolchain:
    """Everything that decides how sources compile; ``fingerprint`` enters every cache key."""

    device: str
    cxx: str
    cxx_version: str
    nvcc: str | None
    nvcc_version: str | None
    cuda_home: str | None
    arch: str | None
    torch_version: str
    torch_dir: str
    cxx11_abi: int
    python_include: str
    ext_suffix: str
    host_cpu: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    @property
    def torch_includes(self) -> list[str]:
        inc = Path(self.torch_dir) / "include"
        return [str(inc), str(inc / "torch" / "csrc" / "api" / "include")]

    @property
    def torch_lib(self) -> str:
        return str(Path(self.torch_dir) / "lib")


def _version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return " | ".join(ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip())


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise ToolchainError("torch is not installed")
    return Path(spec.origin).parent


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


def _arch_flag(major: int, minor: int) -> str:
    suffix = "a" if major >= 9 else ""
    return f"{major}{minor}{suffix}"


def _detect_arch() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        first = out.stdout.strip().splitlines()[:1]
        if out.returncode == 0 and first and "." in first[0]:
            major, minor = first[0].strip().split(".")
            return _arch_flag(int(major), int(minor))
    import torch

    if torch.cuda.is_available():
        return _arch_flag(*torch.cuda.get_device_capability())
    raise ToolchainError("no CUDA device found to take the target architecture from; "
                         "set BuildConfig.arch (e.g. '90a') to build without one")


def _cuda_home(nvcc: str) -> str:
    """The CUDA toolkit folder: $CUDA_HOME, nvcc's parent, /usr/local/cuda, or nvcc's TOP."""
    candidates = [os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "",
                  str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda"]
    for home in candidates:
        if home and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return home
    out = subprocess.run([nvcc, "--dryrun", "-v", "-x", "cu", "-c", "/dev/null"],
                         capture_output=True, text=True, check=False)
    for line in (out.stdout + out.stderr).splitlines():
        if "TOP=" in line:
            return str(Path(line.split("TOP=", 1)[1].strip()).resolve())
    raise ToolchainError(f"cannot find the CUDA toolkit of {nvcc}: set CUDA_HOME")


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def detect(device: str, cache_dir: Path, cxx: str | None = None, arch: str | None = None
           ) -> Toolchain:
    """Return the toolchain for ``device`` ('cpu' or 'cuda'), from the on-disk cache if warm."""
    cxx = cxx or os.environ.get("CXX") or "g++"
    nvcc = find_nvcc() if device == "cuda" else None
    torch_dir = _torch_dir()
    key_parts = [DETECT_VERSION, device, sys.executable, str(torch_dir),
                 importlib.metadata.version("torch"), cxx, str(nvcc), str(arch),
                 os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:24]
    path = cache_dir / f"toolchain-{key}.json"
    if path.exists():
        try:
            return Toolchain(**json.loads(path.read_text()))
        except (TypeError, ValueError):
            pass
    chain = _probe(device, cxx, nvcc, arch, torch_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(chain), indent=1))
    os.replace(tmp, path)
    return chain


def _probe(device: str, cxx: str, nvcc: str | None, arch: str | None, torch_dir: Path
           ) -> Toolchain:
    if shutil.which(cxx) is None:
        raise ToolchainError(f"C++ compiler '{cxx}' not found on PATH")
    import torch

    cuda_home = None
    if device == "cuda":
        if nvcc is None:
            raise ToolchainError("nvcc not found: set CUDA_HOME or put nvcc on PATH")
        cuda_home = _cuda_home(nvcc)
        arch = arch or _detect_arch()
    return Toolchain(
        device=device,
        cxx=shutil.which(cxx) or cxx,
        cxx_version=_version([cxx, "--version"]),
        nvcc=nvcc,
        nvcc_version=_version([nvcc, "--version"]) if nvcc else None,
        cuda_home=cuda_home,
        arch=arch if device == "cuda" else None,
        torch_version=torch.__version__,
        torch_dir=str(torch_dir),
        cxx11_abi=int(torch._C._GLIBCXX_USE_CXX11_ABI),
        python_include=sysconfig.get_paths()["include"],
        ext_suffix=sysconfig.get_config_var("EXT_SUFFIX") or ".so",
        host_cpu=_cpu_model(),
    )
