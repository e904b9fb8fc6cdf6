"""The candidate's side of a single-file candidate's build: ``load_inline`` and ``load``
asked of the judge.

Before any candidate code runs, the candidate's process replaces
``torch.utils.cpp_extension.load_inline`` and ``load`` (``install``). A call then writes
the extension's source files as torch would (``main.cpp``: ``#include <torch/extension.h>``,
the C++ sources and the generated bindings; ``cuda.cu``: the CUDA sources after torch's three
includes; for ``load``, each file as read here), sends them with the call's flags to the
judge over the build socket the worker inherited (``ENV_FD``), and waits: the judge builds
them with its own toolchain through its cache (``build.inline``), checks what the module
calls, and answers with the module's path in that cache, which this process can read but
not write. The module is imported from there; a refused or failed build raises here, as a
failed ``load_inline`` does, with the judge's reasons.

Messages both ways are JSON objects, each after its length (8 bytes, little-endian).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

ENV_FD = "CUDA_AGENT_INLINE_FD"
"""The environment variable naming the worker's end of its build socket."""
MAX_MESSAGE = 32 << 20
"""The longest message either side accepts (sources of 8 MiB, escaped)."""
TORCH_HEADERS = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")


class ProtocolError(RuntimeError):
    """The other side sent something that is not a message, or went away."""


def pair() -> tuple[socket.socket, socket.socket]:
    """(judge's end, worker's end); the worker's is inheritable."""
    judge_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker_end.set_inheritable(True)
    return judge_end, worker_end


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a message over {MAX_MESSAGE >> 20} MiB")
    sock.sendall(len(data).to_bytes(8, "little") + data)


def receive(sock: socket.socket) -> dict[str, Any]:
    size = int.from_bytes(_exactly(sock, 8), "little")
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message over {MAX_MESSAGE >> 20} MiB")
    try:
        message = json.loads(_exactly(sock, size))
    except ValueError:
        raise ProtocolError("a message that is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message that is not an object")
    return message


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ProtocolError("the other side closed the build socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Client:
    """This process's end: one request at a time, whatever thread asks."""

    def __init__(self, fd: int | None = None):
        text = os.environ.get(ENV_FD, "") if fd is None else str(fd)
        self.sock = socket.socket(fileno=int(text)) if text.isdigit() else None
        self.lock = threading.Lock()

    def build(self, request: dict[str, Any]) -> str:
        """The module's path, once the judge has built and checked it."""
        name = request["name"]
        if self.sock is None:
            raise RuntimeError(f"Error building extension '{name}': this process has no "
                               "build socket (the judge builds single-file extensions)")
        with self.lock:
            try:
                send(self.sock, {"t": "build", **request})
                reply = receive(self.sock)
            except OSError as exc:
                raise ProtocolError(f"the build socket failed ({exc})") from None
        if reply.get("t") == "built" and isinstance(reply.get("path"), str):
            return reply["path"]
        raise RuntimeError(f"Error building extension '{name}': "
                           f"{str(reply.get('message') or 'refused by the judge')}")


def install(modules: list[Any]) -> None:
    """Route ``load_inline`` and ``load`` to the judge from now on; every module they
    return is added to ``modules`` (the run-time guard's list)."""
    import torch.utils.cpp_extension as cpp

    client = Client()
    inline_sig, load_sig = inspect.signature(cpp.load_inline), inspect.signature(cpp.load)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        given = inline_sig.bind(*args, **kwargs)
        given.apply_defaults()
        return _loaded(client, inline_request(given.arguments), given.arguments, modules)

    def load(*args: Any, **kwargs: Any) -> Any:
        given = load_sig.bind(*args, **kwargs)
        given.apply_defaults()
        return _loaded(client, file_request(given.arguments), given.arguments, modules)

    load_inline.__doc__, load.__doc__ = cpp.load_inline.__doc__, cpp.load.__doc__
    cpp.load_inline, cpp.load = load_inline, load


def inline_request(a: dict[str, Any]) -> dict[str, Any]:
    """``load_inline``'s arguments as the request: its files written as torch writes them."""
    if a.get("sycl_sources") or a.get("with_sycl"):
        raise RuntimeError("SYCL sources are not built by the judge")
    headers = not a.get("no_implicit_headers", False)
    cpp = _listed(a["cpp_sources"])
    cuda = _listed(a.get("cuda_sources"))
    if headers:
        cpp.insert(0, "#include <torch/extension.h>")
    functions = a.get("functions")
    if functions is not None:
        cpp += _bindings(functions, a.get("with_pytorch_error_handling", True))
    units = [{"file": "main.cpp", "text": "\n".join(cpp)}]
    if cuda:
        units.append({"file": "cuda.cu",
                      "text": "\n".join([*(TORCH_HEADERS if headers else ()), *cuda])})
    return _request(a, units)


def file_request(a: dict[str, Any]) -> dict[str, Any]:
    """``load``'s arguments as the request: each source file read here."""
    if a.get("is_standalone") or a.get("with_sycl"):
        raise RuntimeError("the judge builds Python extensions only (no standalone or SYCL)")
    units = [{"file": Path(p).name, "text": Path(p).read_text()} for p in _listed(a["sources"])]
    return _request(a, units)


def _request(a: dict[str, Any], units: list[dict[str, str]]) -> dict[str, Any]:
    return {"name": str(a["name"]), "units": units, "cflags": _listed(a.get("extra_cflags")),
            "cuda_cflags": _listed(a.get("extra_cuda_cflags")),
            "ldflags": _listed(a.get("extra_ldflags")),
            "include_paths": _listed(a.get("extra_include_paths")),
            "with_cuda": a.get("with_cuda")}


def _bindings(functions: Any, error_handling: bool) -> list[str]:
    """The pybind11 module torch generates for ``functions`` (names, or names to docs)."""
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, list):
        functions = {f: f for f in functions}
    elif not isinstance(functions, dict):
        raise ValueError(f"Expected 'functions' to be a list or dict, but was "
                         f"{type(functions)}")
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for name, doc in functions.items():
        bound = f"torch::wrap_pybind_function({name})" if error_handling else str(name)
        lines.append(f'm.def("{name}", {bound}, "{doc}");')
    return [*lines, "}"]


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _loaded(client: Client, request: dict[str, Any], a: dict[str, Any], modules: list[Any]
            ) -> Any:
    path = client.build(request)
    if not a.get("is_python_module", True):
        import torch

        torch.ops.load_library(path)
        return path
    spec = importlib.util.spec_from_file_location(str(a["name"]), path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension '{a['name']}' from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    modules.append(module)
    return module
