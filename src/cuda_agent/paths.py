"""Locations shared by the workspace, build and judge: templates and the state folder."""

from __future__ import annotations

import os
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "workspace" / "templates"


def home_dir() -> Path:
    """cuda-agent's state folder: ``$CUDA_AGENT_HOME`` or ``~/.cache/cuda-agent``."""
    env = os.environ.get("CUDA_AGENT_HOME")
    return Path(env) if env else Path.home() / ".cache" / "cuda-agent"
