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
from collections.abc import Callable, Iterable

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

_CLONE, _UNSHARE, _CLONE3 = 56, 272, 435
_NEW_NAMESPACES = 0x7E020080
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET and NEWTIME."""
_MOUNTS = {"setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
           "fsmount": 432, "fspick": 433, "mount_setattr": 442}
_RET_ENOSYS = 0x00050000 | 38
_USERFAULTFD, _IOCTL, _UFFD_IOCTL_TYPE = 323, 16, 0xAA
_AND = 0x54

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter installed after the warm-up: deny every call made through another
    architecture's entry (i386's ``int 0x80`` reaches ``mprotect`` and ``mmap2`` under
    other numbers) and x32 calls; for x86-64 calls, deny executable mappings and
    protections, running programs and reaching other processes' memory; allow everything
    else."""
    return _program({n: (2, _PROT_EXEC) for n in _EXEC_PROT.values()}, _DENIED.values())


def namespace_program() -> bytes:
    """The filter installed before any candidate code: no new namespace (a user namespace
    would give back every capability the confinement took) and no mount of any kind (a
    file mounted elsewhere is named as the candidate likes in its memory map, a trusted
    folder's name included); no userfaultfd, by its call or by ``ioctl`` on
    /dev/userfaultfd (it fills a page of a mapping, code included, with no ``mmap`` or
    ``mprotect``); ``clone3``, whose flags a filter cannot read, answers ENOSYS, so the C
    library falls back to ``clone``."""
    return _program({_CLONE: (0, _NEW_NAMESPACES), _UNSHARE: (0, _NEW_NAMESPACES)},
                    [*_MOUNTS.values(), _USERFAULTFD], enosys=(_CLONE3,),
                    typed_ioctl=_UFFD_IOCTL_TYPE)


def _program(flagged: dict[int, tuple[int, int]], denied: Iterable[int],
             enosys: Iterable[int] = (), typed_ioctl: int | None = None) -> bytes:
    """A filter: calls of another architecture and x32 calls denied; x86-64 call ``n`` in
    ``flagged`` denied when its argument ``flagged[n][0]`` has a bit of ``flagged[n][1]``
    (the low 32 bits); those in ``denied`` denied, in ``enosys`` answered ENOSYS; an
    ``ioctl`` whose request is of type ``typed_ioctl`` (its bits 8-15) denied; the rest
    allowed. Jumps are relative: a target T from instruction i is T - i - 1."""
    denied, enosys = list(denied), list(enosys)
    entries = [*flagged, *denied, *enosys]
    if typed_ioctl is not None:
        flagged = {**flagged, _IOCTL: (1, -1)}  # a block of its own, below
        entries.insert(0, _IOCTL)
    first = 4
    allow = first + len(entries)
    sizes = {n: 4 if n == _IOCTL and typed_ioctl is not None else 3 for n in flagged}
    blocks, at = {}, allow + 1
    for n in flagged:
        blocks[n], at = at, at + sizes[n]
    nosys = at
    deny = nosys + 1
    code = [_insn(_LD_W_ABS, 0, 0, 4),  # 0: the architecture
            _insn(_JEQ, 0, deny - 2, _AUDIT_ARCH_X86_64),  # 1: another one (int 0x80): deny
            _insn(_LD_W_ABS, 0, 0, 0),  # 2: the call's number
            _insn(_JGE, deny - 4, 0, _X32_BIT)]  # 3: an x32 call: deny
    for i, number in enumerate(entries, start=first):
        target = blocks.get(number, deny if number in denied else nosys)
        code.append(_insn(_JEQ, target - i - 1, 0, number))
    code.append(_insn(_RET, 0, 0, _RET_ALLOW))
    for number, (arg, mask) in flagged.items():
        at = blocks[number]
        if sizes[number] == 4:  # the request's type: (request & 0xFF00) == type << 8
            code += [_insn(_LD_W_ABS, 0, 0, 16 + 8 * arg), _insn(_AND, 0, 0, 0xFF00),
                     _insn(_JEQ, deny - (at + 2) - 1, 0, (typed_ioctl or 0) << 8),
                     _insn(_RET, 0, 0, _RET_ALLOW)]
            continue
        code += [_insn(_LD_W_ABS, 0, 0, 16 + 8 * arg),  # the argument's low half
                 _insn(_JSET, deny - (at + 1) - 1, 0, mask),
                 _insn(_RET, 0, 0, _RET_ALLOW)]
    code += [_insn(_RET, 0, 0, _RET_ENOSYS), _insn(_RET, 0, 0, _RET_EPERM)]
    return b"".join(code)


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def supported() -> bool:
    """Whether the filter is built for this machine (Linux on x86-64)."""
    return platform.machine() == "x86_64" and platform.system() == "Linux"


def prepare(code: bytes | None = None) -> Callable[[], str | None]:
    """The installer of filter ``code`` (``program()`` by default), bound now: call it to
    install the filter on every thread; it returns None once installed, else why not
    (another architecture, a kernel without seccomp)."""
    if not supported():
        return lambda: f"no seccomp filter on {platform.system()} {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl, syscall = libc.prctl, libc.syscall
    except (OSError, AttributeError) as exc:
        reason = f"no seccomp filter: {exc}"
        return lambda: reason
    code = program() if code is None else code
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
