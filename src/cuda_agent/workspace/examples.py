"""The worked example ``init_workspace`` puts in ``kernels/`` (``example_axpby``: a kernel
and its binding), and when a result leaves it out: when nothing the agent wrote names it.

    unused_example_files(root / "model_new.py", root / "kernels")
"""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLE = "example_axpby"
"""The example's name: its files are ``kernels/example_axpby.{cpp,cu}`` and
``kernels/example_axpby_binding.cpp``; its binding and launcher are ``example_axpby`` and
``example_axpby_launch``."""

_NAMED = re.compile(rf"\b{EXAMPLE}")


def example_files(kernels: Path) -> list[Path]:
    """The example's files in ``kernels`` (whether or not the agent edited them)."""
    return sorted(p for p in kernels.glob(f"{EXAMPLE}*")
                  if p.is_file() and p.stem in (EXAMPLE, f"{EXAMPLE}_binding"))


def unused_example_files(model_new: Path, kernels: Path) -> list[Path]:
    """The example's files, when neither ``model_new`` nor any other file in ``kernels``
    names the example (its binding or its launcher): kept from the template, never used,
    so a result or a package leaves them out. Otherwise none."""
    files = example_files(kernels)
    if not files:
        return []
    others = [model_new, *(p for p in kernels.rglob("*") if p.is_file() and p not in files)]
    for path in others:
        if path.is_file() and _NAMED.search(path.read_text(errors="replace")):
            return []
    return files
