"""The reproducibility record of an evaluation: machine, versions, commit, command, answers."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def file_hashes(paths: dict[str, Path | None]) -> dict[str, dict[str, str]]:
    """sha256 of every file of each task's answer (a single file or a folder, recursively)."""
    found: dict[str, dict[str, str]] = {}
    for key, path in sorted(paths.items()):
        if path is None:
            continue
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        root = path.parent if path.is_file() else path
        found[key] = {str(f.relative_to(root)): _sha256(f) for f in files}
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def machine() -> dict[str, Any]:
    """GPU name, driver and CUDA/torch versions, or the CPU when no GPU is visible."""
    import torch

    from cuda_agent.build.toolchain import _cpu_model

    info: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["driver"] = _nvidia_driver()
    return info


def _nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def commit() -> str:
    """The git commit of the checkout the package runs from (marked '-dirty' when it has
    uncommitted changes), else the installed package version."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10).stdout
        return head + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"cuda-agent {version('cuda-agent')}"
        except PackageNotFoundError:
            return "unknown"
