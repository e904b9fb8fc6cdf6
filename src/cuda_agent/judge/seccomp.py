"""No new native code in the candidate's process once its calls have begun (Linux, x86-64).

The judge checks, by their symbols, the files a candidate's process has mapped as code once
its calls are counted and when its run ends (``code_hold``, ``retime.loaded_code``). A
library loaded inside a call and unloaded before the call returns would be at neither look,
nor would code written into memory made executable at run time. After the warm-up (whose
calls may load what the candidate's kernels load lazily, such as cuDNN's engines) the
worker therefore installs a seccomp filter on all its threads: mapping or protecting memory
as executable, running a program and writing another process's memory fail with EPERM from
then on. A filter cannot be removed, and the kernel applies it to every thread and every
process started later; the judge reads from ``/proc`` that it is on (``code_hold``).

The filter is built and its system calls bound before any candidate code runs
(``prepare``); the harness calls what ``prepare`` returned.
"""

from __future__ import annotations

import ctypes
import platform
import struct
from collections.abc import Callable

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_SYS_SECCOMP = 317
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_PROT_EXEC = 0x4
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1
# x86-64 system calls
_EXEC_PROT = {"mmap": 9, "mprotect": 10, "pkey_mprotect": 329}
_DENIED = {"execve": 59, "execveat": 322, "ptrace": 101, "process_vm_writev": 311,
           "personality": 135, "shmat": 30}
"""Also ``personality`` (READ_IMPLIES_EXEC would make readable mappings executable) and
``shmat`` (``SHM_EXEC`` maps shared memory executable, without ``PROT_EXEC``)."""

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter: deny every call made through another architecture's entry (i386's
    ``int 0x80`` reaches ``mprotect`` and ``mmap2`` under other numbers) and x32 calls; for
    x86-64 calls, deny executable mappings and protections, running programs and reaching
    other processes' memory; allow everything else.
    Jumps are relative: a target T from instruction i is T - i - 1."""
    entries = [("prot", n) for n in _EXEC_PROT.values()] + [("deny", n) for n in
                                                             _DENIED.values()]
    first = 4  # the first per-call comparison
    allow = first + len(entries)
    prot, deny = allow + 1, allow + 4
    code = [_insn(_LD_W_ABS, 0, 0, 4),  # 0: the architecture
            _insn(_JEQ, 0, deny - 2, _AUDIT_ARCH_X86_64),  # 1: another one (int 0x80): deny
            _insn(_LD_W_ABS, 0, 0, 0),  # 2: the call's number
            _insn(_JGE, deny - 4, 0, _X32_BIT)]  # 3: an x32 call: deny
    for k, (kind, number) in enumerate(entries):
        i = first + k
        code.append(_insn(_JEQ, (prot if kind == "prot" else deny) - i - 1, 0, number))
    code += [_insn(_RET, 0, 0, _RET_ALLOW),  # allow
             _insn(_LD_W_ABS, 0, 0, 16 + 8 * 2),  # prot: the low half of args[2]
             _insn(_JSET, deny - (prot + 1) - 1, 0, _PROT_EXEC),
             _insn(_RET, 0, 0, _RET_ALLOW),
             _insn(_RET, 0, 0, _RET_EPERM)]  # deny
    return b"".join(code)


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def supported() -> bool:
    """Whether the filter is built for this machine (Linux on x86-64)."""
    return platform.machine() == "x86_64" and platform.system() == "Linux"


def prepare() -> Callable[[], str | None]:
    """The installer, bound now: call it to install the filter on every thread; it returns
    None once installed, else why not (another architecture, a kernel without seccomp)."""
    if not supported():
        return lambda: f"no seccomp filter on {platform.system()} {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl, syscall = libc.prctl, libc.syscall
    except (OSError, AttributeError) as exc:
        reason = f"no seccomp filter: {exc}"
        return lambda: reason
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Filter(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))

    def install() -> str | None:
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"no seccomp filter: prctl failed (errno {ctypes.get_errno()})"
        done = syscall(_SYS_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                       ctypes.byref(prog))
        if done != 0:
            return f"no seccomp filter: seccomp failed (errno {ctypes.get_errno()})"
        install.keep = (buffer, prog)  # type: ignore[attr-defined]
        return None

    return install
