"""The seccomp filter the harness installs once the warm-up is over (``judge.seccomp``), run
in a real child process: no new executable memory through any system call entry."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from cuda_agent.judge import seccomp

pytestmark = pytest.mark.skipif(not seccomp.supported(), reason="the filter is x86-64 Linux's")

# A page of machine code made before the filter: i386 system calls through int 0x80
# (getpid is 20, mprotect 125), and an x86-64 mprotect (10) through syscall.
PROBE = textwrap.dedent('''
    import ctypes, mmap, sys
    from cuda_agent.judge import seccomp

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    MAP_32BIT = 0x40  # i386 calls take 32-bit addresses
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_32BIT
    code = libc.mmap(None, 4096, 7, flags, -1, 0)
    data = libc.mmap(None, 4096, 3, flags, -1, 0)

    def i386(number, a=0, b=0, c=0):  # mov eax/ebx/ecx/edx, imm32; int 0x80; ret
        body = (b"\\x53\\xb8" + number.to_bytes(4, "little") + b"\\xbb" + a.to_bytes(4, "little")
                + b"\\xb9" + b.to_bytes(4, "little") + b"\\xba" + c.to_bytes(4, "little")
                + b"\\xcd\\x80\\x5b\\xc3")
        ctypes.memmove(code, body, len(body))
        return ctypes.CFUNCTYPE(ctypes.c_int)(code)()

    before = i386(20)
    error = seccomp.prepare()()
    assert error is None, error
    after_getpid = i386(20)
    after_mprotect = i386(125, data, 4096, 7)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    x86_64 = libc.mprotect(ctypes.c_void_p(data), 4096, 7)
    implied = libc.personality(0x0400000)  # READ_IMPLIES_EXEC
    shm = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    attached = libc.shmat(shm, None, 0o100000)  # SHM_EXEC
    libc.shmctl(shm, 0, None)  # IPC_RMID
    print(before, after_getpid, after_mprotect, x86_64, implied, attached)
''')


def test_no_system_call_through_another_architectures_entry_and_no_executable_memory():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    before, getpid, mprotect, x86_64, implied, attached = (int(v) for v in done.stdout.split())
    assert before > 0  # the i386 entry works on this kernel: the probe means something
    assert getpid == -1 and mprotect == -1  # -EPERM, whatever the call
    assert x86_64 == -1 and implied == -1 and attached == -1


def test_a_thread_whose_readable_memory_is_executable_is_named():
    """READ_IMPLIES_EXEC set before the filter would make a later PROT_READ mapping
    executable, unseen by the filter: the judge's hold names such a thread."""
    from cuda_agent.judge.code_hold import implied_exec_threads

    script = ("import ctypes, sys; ctypes.CDLL(None).personality(int(sys.argv[1])); "
              "print(flush=True); sys.stdin.read()")
    found = {}
    for flag in (0x0400000, 0):
        child = subprocess.Popen([sys.executable, "-c", script, str(flag)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            child.stdout.readline()
            found[flag] = implied_exec_threads(child.pid)
        finally:
            child.kill()
            child.wait()
    assert found[0x0400000] and not found[0]


NAMESPACES = textwrap.dedent('''
    import ctypes, os, subprocess, threading
    from cuda_agent.judge import seccomp

    libc = ctypes.CDLL(None, use_errno=True)
    assert seccomp.prepare(seccomp.namespace_program())() is None
    errors = {}
    for name, call in {"unshare": lambda: libc.unshare(0x10000000 | 0x00020000),
                       "clone3": lambda: libc.syscall(435, None, 0),
                       "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
                       "open_tree": lambda: libc.syscall(428, -100, b"/", 1),
                       "setns": lambda: libc.setns(0, 0),
                       "userfaultfd": lambda: libc.syscall(323, 1),
                       "uffd_ioctl": lambda: libc.ioctl(0, 0xAA00, 0),  # USERFAULTFD_IOC_NEW
                       "other_ioctl": lambda: libc.ioctl(0, 0x5413, 0)}.items():  # TIOCGWINSZ
        result = call()
        errors[name] = ctypes.get_errno() if result == -1 else 0
    seen = []
    thread = threading.Thread(target=lambda: seen.append(1))
    thread.start()
    thread.join()
    child = subprocess.run(["true"]).returncode
    print(errors["unshare"], errors["clone3"], errors["mount"], errors["open_tree"],
          errors["setns"], len(seen), child, errors["userfaultfd"], errors["uffd_ioctl"],
          errors["other_ioctl"])
''')


def test_no_namespace_and_no_mount_from_candidate_code_but_threads_and_children_work():
    """The filter installed before any candidate code: a new user namespace would give
    back every capability, and a mount would let a file wear a trusted folder's name in
    the memory map; threads and child processes still start."""
    done = subprocess.run([sys.executable, "-c", NAMESPACES], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    unshare, clone3, mount, open_tree, setns, threads, child, uffd, uffd_ioctl, other = map(
        int, done.stdout.split())
    assert (unshare, mount, open_tree, setns, uffd, uffd_ioctl) == (1,) * 6  # EPERM
    assert other != 1  # other ioctls go through (ENOTTY on a pipe)
    assert clone3 == 38  # ENOSYS: the C library falls back to clone
    assert threads == 1 and child == 0
