"""The ctypes binding of the CUDA driver matches ``cuda.h``: structure sizes and offsets,
the constants, and the arity of every bound call (checked against the header with gcc and
by reading it, so no GPU or libcuda is needed)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_agent.judge import cuda_driver
from cuda_agent.judge.cuda_driver import AccessDesc, AllocationProp, AllocFlags, MemLocation

STRUCTS = [(MemLocation, "CUmemLocation"), (AllocationProp, "CUmemAllocationProp"),
           (AllocFlags, "__typeof__(((CUmemAllocationProp *)0)->allocFlags)"),
           (AccessDesc, "CUmemAccessDesc")]
CONSTANTS = {
    "HANDLE_TYPE_POSIX_FD": "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
    "ALLOCATION_PINNED": "CU_MEM_ALLOCATION_TYPE_PINNED",
    "LOCATION_DEVICE": "CU_MEM_LOCATION_TYPE_DEVICE",
    "ACCESS_READWRITE": "CU_MEM_ACCESS_FLAGS_PROT_READWRITE",
    "GRANULARITY_MINIMUM": "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
    "ATTRIBUTE_VMM": "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
    "ATTRIBUTE_POSIX_FD": "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
}
# C types the binding passes as ctypes scalars: (C type, ctypes type)
SCALARS = [("CUmemAllocationHandleType", ctypes.c_int), ("CUmemLocationType", ctypes.c_int),
           ("CUmemGenericAllocationHandle", ctypes.c_ulonglong),
           ("CUdeviceptr", ctypes.c_ulonglong), ("CUdevice", ctypes.c_int),
           ("CUresult", ctypes.c_int), ("CUcontext", ctypes.c_void_p)]


def _header() -> Path | None:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    for root in filter(None, roots):
        path = Path(root) / "include" / "cuda.h"
        if path.is_file():
            return path
    return None


HEADER = _header()
needs_header = pytest.mark.skipif(HEADER is None, reason="no CUDA toolkit header (cuda.h)")


def _layout_program() -> tuple[str, dict[str, int]]:
    """C source printing each size/offset/constant, and what ctypes says of each."""
    lines, expected = [], {}
    for cls, c_type in STRUCTS:
        name = cls.__name__
        lines.append(f'SHOW("{name}", sizeof({c_type}));')
        expected[name] = ctypes.sizeof(cls)
        for field, _ in cls._fields_:
            lines.append(f'SHOW("{name}.{field}", offsetof({c_type}, {field}));')
            expected[f"{name}.{field}"] = getattr(cls, field).offset
    for py_name, c_name in CONSTANTS.items():
        lines.append(f'SHOW("{py_name}", {c_name});')
        expected[py_name] = getattr(cuda_driver, py_name)
    for c_type, ctype in SCALARS:
        lines.append(f'SHOW("{c_type}", sizeof({c_type}));')
        expected[c_type] = ctypes.sizeof(ctype)
    source = ("#include <stddef.h>\n#include <stdio.h>\n#include <cuda.h>\n"
              '#define SHOW(n, v) printf("%s %zu\\n", n, (size_t)(v))\n'
              "int main(void) {\n  " + "\n  ".join(lines) + "\n  return 0;\n}\n")
    return source, expected


@needs_header
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_structures_and_constants_match_the_header(tmp_path: Path):
    source, expected = _layout_program()
    (tmp_path / "layout.c").write_text(source)
    built = subprocess.run(["gcc", "-std=gnu11", "-I", str(HEADER.parent), "-o",
                            str(tmp_path / "layout"), str(tmp_path / "layout.c")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    done = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                          timeout=60, check=True)
    actual = {name: int(value) for name, value in (line.split() for line in
                                                   done.stdout.splitlines())}
    assert actual == expected


def _prototypes(text: str) -> dict[str, int]:
    """Each function the header declares (under its ABI name): its argument count."""
    renamed = dict(re.findall(r"^#define\s+(cu\w+)\s+(cu\w+)\s*$", text, re.M))
    found: dict[str, int] = {}
    for name, args in re.findall(r"CUresult CUDAAPI (cu\w+)\(([^)]*)\);", text):
        abi = renamed.get(name, name)
        if abi not in found:  # the first declaration; legacy ones follow at the end
            args = args.strip()
            found[abi] = 0 if args in ("", "void") else args.count(",") + 1
    return found


@needs_header
def test_every_bound_call_exists_under_its_abi_name_with_its_arity():
    text = HEADER.read_text(errors="replace")
    declared = _prototypes(text)
    renamed = set(re.findall(r"^#define\s+(cu\w+)\s+cu\w+\s*$", text, re.M))
    for name, argtypes in cuda_driver._SIGNATURES.items():
        assert name not in renamed, f"{name} is an old ABI: cuda.h maps it to a newer one"
        assert declared.get(name) == len(argtypes), (name, declared.get(name))
