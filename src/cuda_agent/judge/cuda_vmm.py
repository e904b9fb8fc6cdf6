"""Device memory another process can map: the CUDA driver's virtual memory management API.

The judge creates physical device memory (``cuMemCreate``) that may be exported as a POSIX
file descriptor, exports it, and maps it into its own address space (reserve, map, grant
read-write access); a worker imports the descriptor and maps the same memory. Unlike legacy
CUDA IPC handles, such a descriptor crosses pid namespaces: it is an ordinary file
descriptor, passed down like any other. Each mapping is wrapped as a flat ``uint8`` CUDA
tensor without a copy (``__cuda_array_interface__``); the mapping lives as long as any
tensor made from it, and is then unmapped, its address range freed and its handle released,
in that order, after the device has finished the work queued on it. Every driver call is
checked (``cuda_driver``); a failure raises ``TransportError`` naming the call and error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import weakref

import torch

from cuda_agent.judge.cuda_driver import (
    ACCESS_READWRITE,
    ATTRIBUTE_POSIX_FD,
    ATTRIBUTE_VMM,
    GRANULARITY_MINIMUM,
    HANDLE_TYPE_POSIX_FD,
    LOCATION_DEVICE,
    AccessDesc,
    AllocationProp,
    Driver,
    MemLocation,
    device_prop,
    driver,
)
from cuda_agent.judge.transport import TransportError

_U64, _SIZE, _PTR = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p


class DeviceMemory:
    """Device memory mapped into this process: created here (``create``, exported as the
    descriptor ``fd``) or imported from a descriptor (``attach``). ``tensor()`` views it;
    it is freed once this object and every tensor made from it are gone."""

    def __init__(self, ordinal: int, size: int, pointer: int, held: _Held):
        self.device, self.size, self.pointer = ordinal, size, pointer
        self._held = held
        self._finalizer = weakref.finalize(self, held.release)
        self._finalizer.atexit = False  # at exit the driver frees everything anyway

    @property
    def fd(self) -> int | None:
        """The exported descriptor, until ``close_fd`` (None for imported memory)."""
        return self._held.fd

    @classmethod
    def create(cls, nbytes: int, ordinal: int) -> DeviceMemory:
        """At least ``nbytes`` (rounded up to the allocation granularity) on device
        ``ordinal``, exported as a POSIX file descriptor and mapped read-write here."""
        drv = driver()
        held = _Held(drv, ordinal)
        try:
            for attribute, what in ((ATTRIBUTE_VMM, "virtual memory management"),
                                    (ATTRIBUTE_POSIX_FD, "export as a file descriptor")):
                if not drv.attribute(attribute, held.device):
                    raise TransportError(f"device {ordinal} does not support {what}")
            with drv.current(held.context):
                prop = device_prop(ordinal)
                size = _rounded(max(nbytes, 1), _granularity(drv, prop))
                handle = _U64()
                drv.call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
                held.take("cuMemRelease", handle.value)
                fd = ctypes.c_int(-1)
                drv.call("cuMemExportToShareableHandle", ctypes.byref(fd), handle.value,
                         HANDLE_TYPE_POSIX_FD, 0)
                held.fd = fd.value
                pointer = _map(held, handle.value, size)
        except BaseException:
            held.release()
            raise
        return cls(ordinal, size, pointer, held)

    @classmethod
    def attach(cls, fd: int, nbytes: int, ordinal: int) -> DeviceMemory:
        """Map the ``nbytes`` of exported memory that ``fd`` stands for (the caller keeps
        and closes ``fd``; the mapping does not need it)."""
        drv = driver()
        held = _Held(drv, ordinal)
        try:
            with drv.current(held.context):
                handle = _U64()
                # the descriptor travels by value, cast to a pointer (the driver's convention)
                drv.call("cuMemImportFromShareableHandle", ctypes.byref(handle),
                         _PTR(fd), HANDLE_TYPE_POSIX_FD)
                held.take("cuMemRelease", handle.value)
                prop = AllocationProp()
                drv.call("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(prop),
                         handle.value)
                if (prop.location.type, prop.location.id) != (LOCATION_DEVICE, ordinal):
                    raise TransportError(f"the device pack is not memory of device {ordinal}")
                if nbytes <= 0 or nbytes % _granularity(drv, prop):
                    raise TransportError(f"a device pack of {nbytes} bytes is not a whole "
                                         "number of allocation granules")
                pointer = _map(held, handle.value, nbytes)
        except BaseException:
            held.release()
            raise
        return cls(ordinal, nbytes, pointer, held)

    def tensor(self) -> torch.Tensor:
        """A flat ``uint8`` CUDA tensor over the whole mapping, without a copy; it keeps
        this object (so the mapping) alive."""
        if not self._finalizer.alive:
            raise TransportError("the device pack was already freed")
        torch.cuda.init()
        return torch.as_tensor(_CudaArray(self))

    def close_fd(self) -> None:
        """Close the exported descriptor (once passed on, the memory does not need it)."""
        self._held.close_fd()

    def free(self) -> None:
        """Unmap and release now (no tensor of this memory may be used afterwards)."""
        self._finalizer()


class _CudaArray:
    """What ``torch.as_tensor`` takes device memory from; the tensor holds a reference to
    it (so to the ``DeviceMemory``) until the tensor's storage is freed."""

    def __init__(self, memory: DeviceMemory):
        self.memory = memory
        self.__cuda_array_interface__ = {"shape": (memory.size,), "typestr": "|u1",
                                         "data": (memory.pointer, False), "strides": None,
                                         "version": 2}


class _Held:
    """What one mapping holds: the retained primary context, the driver objects (each with
    the call that undoes it) and the exported descriptor; released in reverse order."""

    def __init__(self, drv: Driver, ordinal: int):
        self.drv, self.ordinal = drv, ordinal
        self.device = drv.device(ordinal)
        self.context: int | None = drv.retain(self.device)
        self.steps: list[tuple[str, tuple[int, ...]]] = []
        self.fd: int | None = None

    def take(self, undo: str, *args: int) -> None:
        self.steps.append((undo, args))

    def close_fd(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None and fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def release(self) -> None:
        """Wait for the device's queued work (it may still read the memory), then unmap,
        free the address range, release the allocation, close the descriptor and release
        the context. Never raises; a second call does nothing."""
        steps, self.steps = self.steps, []
        context, self.context = self.context, None
        if context is None:
            return
        lib = self.drv.lib
        if steps and lib.cuCtxPushCurrent_v2(_PTR(context)) == 0:
            lib.cuCtxSynchronize()
            for name, args in reversed(steps):
                getattr(lib, name)(*args)
            lib.cuCtxPopCurrent_v2(ctypes.byref(_PTR()))
        self.close_fd()
        lib.cuDevicePrimaryCtxRelease_v2(self.device)


def _map(held: _Held, handle: int, size: int) -> int:
    """Reserve an address range, map ``handle`` there and let this device read and write
    it; returns the address. Each step is recorded in ``held`` for its release."""
    drv, pointer = held.drv, _U64()
    drv.call("cuMemAddressReserve", ctypes.byref(pointer), size, 0, 0, 0)
    held.take("cuMemAddressFree", pointer.value, size)
    drv.call("cuMemMap", pointer.value, size, 0, handle, 0)
    held.take("cuMemUnmap", pointer.value, size)
    access = AccessDesc(MemLocation(LOCATION_DEVICE, held.ordinal), ACCESS_READWRITE)
    drv.call("cuMemSetAccess", pointer.value, size, ctypes.byref(access), 1)
    return pointer.value


def _granularity(drv: Driver, prop: AllocationProp) -> int:
    granularity = _SIZE()
    drv.call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop),
             GRANULARITY_MINIMUM)
    return max(granularity.value, 1)


def _rounded(n: int, granule: int) -> int:
    return (n + granule - 1) // granule * granule
