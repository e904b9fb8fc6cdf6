"""Who in a linked shared object calls an imported function.

A shared object may carry part of the C++ runtime's own code: a toolchain that links the
newer parts of libstdc++ statically (the H100 machine's GCC does) puts
``__cxa_guard_acquire`` in every extension, and it waits on a futex through ``syscall``.
Such a reference is the runtime's, not the candidate's. It is told apart by the code
itself: every use of the import is a direct call through its PLT entry, and every function
making one is a runtime function known to; an address taken (a GOT entry) or a call from
anywhere else keeps the refusal.

    if runtime_only(Path("ext.so"), "syscall"): ...
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cuda_agent.build import bounded

RUNTIME_CALLERS = {
    "syscall": ("__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
                "_ZNSt28__atomic_futex_unsigned_base"),
}
"""Imported name -> the runtime functions (by name prefix) whose calls to it pass."""
LIMITS: dict[str, Any] = {"max_line": 1 << 20, "timeout": 300}
"""``objdump``'s output is read line by line, none longer than this (a name), for at most
this long; past either the refusal stands."""
_FUNCTION = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")


def runtime_only(path: Path, name: str) -> bool:
    """Whether every use of the imported function ``name`` in the shared object ``path`` is
    a call from one of ``RUNTIME_CALLERS[name]`` (False when objdump is missing)."""
    prefixes = RUNTIME_CALLERS.get(name)
    objdump = shutil.which("objdump")
    if not prefixes or objdump is None:
        return False
    kinds: set[str] = set()
    try:
        with bounded.Lines([objdump, "-R", str(path)], **LIMITS) as out:
            for line in out:
                fields = line.split()
                if len(fields) >= 3 and fields[2].split("@")[0] == name:
                    kinds.add(fields[1])
        if out.returncode != 0 or not kinds or any(not kind.endswith("_JUMP_SLOT")
                                                   for kind in kinds):
            return False  # nothing to call through, or an address taken (a GOT entry)
        called, current = False, ""
        with bounded.Lines([objdump, "-d", "--no-show-raw-insn", str(path)], **LIMITS) as out:
            for line in out:  # a disassembly is many times the file's size: none of it kept
                function = _FUNCTION.match(line)
                if function:
                    current = function[1]
                elif f"<{name}@plt>" in line and not current.startswith(f"{name}@"):
                    if not current.startswith(prefixes):
                        return False
                    called = True
        return called and out.returncode == 0
    except (bounded.OutputLimit, subprocess.TimeoutExpired):
        return False
