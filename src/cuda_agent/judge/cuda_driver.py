"""The CUDA driver's virtual memory management entry points, bound with ctypes.

Only what ``cuda_vmm`` needs: the structures as CUDA 13's ``cuda.h`` lays them out
(``CUmemAllocationProp``, ``CUmemLocation``, ``CUmemAccessDesc``; a test compares their
sizes and offsets with the header's), the calls with their argument types, and a checked
call that raises ``TransportError`` with the driver's error name. libcuda is loaded and
initialised (``cuInit``) on first use, never at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any

from cuda_agent.judge.transport import TransportError

HANDLE_TYPE_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
ACCESS_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM
ATTRIBUTE_VMM = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
ATTRIBUTE_POSIX_FD = 103  # CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED


class MemLocation(ctypes.Structure):
    """``CUmemLocation``."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    """The anonymous ``allocFlags`` struct of ``CUmemAllocationProp``."""

    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    """``CUmemAllocationProp`` (CUDA 13: ``CUmemAllocationProp_v1``)."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", MemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    """``CUmemAccessDesc``."""

    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


_P = ctypes.POINTER
_U64, _SIZE, _PTR = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuInit": (ctypes.c_uint,),
    "cuGetErrorName": (ctypes.c_int, _P(ctypes.c_char_p)),
    "cuDeviceGet": (_P(ctypes.c_int), ctypes.c_int),
    "cuDeviceGetAttribute": (_P(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (_P(_PTR), ctypes.c_int),
    "cuDevicePrimaryCtxRelease_v2": (ctypes.c_int,),
    "cuCtxPushCurrent_v2": (_PTR,),
    "cuCtxPopCurrent_v2": (_P(_PTR),),
    "cuCtxSynchronize": (),
    "cuMemGetInfo_v2": (_P(_SIZE), _P(_SIZE)),
    "cuMemGetAllocationGranularity": (_P(_SIZE), _P(AllocationProp), ctypes.c_int),
    "cuMemCreate": (_P(_U64), _SIZE, _P(AllocationProp), _U64),
    "cuMemRelease": (_U64,),
    "cuMemExportToShareableHandle": (_PTR, _U64, ctypes.c_int, _U64),
    "cuMemImportFromShareableHandle": (_P(_U64), _PTR, ctypes.c_int),
    "cuMemGetAllocationPropertiesFromHandle": (_P(AllocationProp), _U64),
    "cuMemAddressReserve": (_P(_U64), _SIZE, _SIZE, _U64, _U64),
    "cuMemAddressFree": (_U64, _SIZE),
    "cuMemMap": (_U64, _SIZE, _SIZE, _U64, _U64),
    "cuMemUnmap": (_U64, _SIZE),
    "cuMemSetAccess": (_U64, _SIZE, _P(AccessDesc), _SIZE),
}


class Driver:
    """libcuda's entry points this module uses, each checked."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        for name, argtypes in _SIGNATURES.items():
            try:
                function = getattr(lib, name)
            except AttributeError:
                raise TransportError(f"the CUDA driver lacks {name} (too old for device "
                                     "packs)") from None
            function.argtypes, function.restype = argtypes, ctypes.c_int

    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise TransportError(f"{name} failed: {self.error_name(status)}")

    def error_name(self, status: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(status, ctypes.byref(text)) != 0 or not text.value:
            return f"CUresult {status}"
        return text.value.decode(errors="replace")

    def device(self, ordinal: int) -> int:
        handle = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(handle), ordinal)
        return handle.value

    def attribute(self, attribute: int, device: int) -> int:
        value = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
        return value.value

    def retain(self, device: int) -> int:
        """The device's primary context (the one torch's runtime uses), retained."""
        context = _PTR()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        return context.value

    @contextlib.contextmanager
    def current(self, context: int) -> Iterator[None]:
        """``context`` current on this thread for the block, the previous one after."""
        self.call("cuCtxPushCurrent_v2", _PTR(context))
        try:
            yield
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(_PTR()))


@functools.cache
def driver() -> Driver:
    """The bound driver, loaded and initialised on first use; raises ``TransportError``
    where there is none (a failed load is retried on the next call)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TransportError(f"no CUDA driver (libcuda.so.1): {exc}") from None
    driver = Driver(lib)
    driver.call("cuInit", 0)
    return driver


def device_prop(ordinal: int) -> AllocationProp:
    """Pinned device memory on ``ordinal`` that may be exported as a file descriptor."""
    prop = AllocationProp()
    prop.type, prop.requestedHandleTypes = ALLOCATION_PINNED, HANDLE_TYPE_POSIX_FD
    prop.location = MemLocation(LOCATION_DEVICE, ordinal)
    return prop


def free_bytes(ordinal: int) -> int:
    """Free device memory on ``ordinal`` (``cuMemGetInfo``)."""
    drv = driver()
    device = drv.device(ordinal)
    context = drv.retain(device)
    try:
        free, total = _SIZE(), _SIZE()
        with drv.current(context):
            drv.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value
    finally:
        drv.lib.cuDevicePrimaryCtxRelease_v2(device)

