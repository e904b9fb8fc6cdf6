"""Python source for values: literals, importable names, configs (``Cls(**{...})``).

``Renderer.literal`` raises ``NotSource`` for a value that has no faithful source form (a
tensor, a module, an object without ``to_dict``); the caller then saves it instead.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import math
from typing import Any

import torch


class NotSource(ValueError):
    """A value cannot be written as Python source; the message says which and why."""


def importable(obj: Any) -> tuple[str, str]:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise NotSource(f"{obj!r} is not importable (defined in {module or '?'}"
                        f"{', inside a function' if qualname and '<' in qualname else ''})")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not obj:
        raise NotSource(f"{module}.{qualname} does not resolve to {obj!r}")
    return module, qualname


class Renderer:
    """Renders values as source, collecting the ``from M import N`` lines they need."""

    def __init__(self, reserved: set[str] | None = None) -> None:
        self.reserved = set(reserved or ())
        self._aliases: dict[tuple[str, str], str] = {}

    @property
    def imports(self) -> list[str]:
        lines = []
        for (module, top), alias in sorted(self._aliases.items()):
            suffix = "" if alias == top else f" as {alias}"
            lines.append(f"from {module} import {top}{suffix}")
        return lines

    def name_of(self, obj: Any) -> str:
        """An expression naming the class, function or other importable ``obj``."""
        module, qualname = importable(obj)
        top, _, rest = qualname.partition(".")
        alias = self._aliases.get((module, top))
        if alias is None:
            alias, n = top, 1
            while alias in self.reserved or alias in self._aliases.values():
                alias, n = f"{top}_{n}", n + 1
            self._aliases[(module, top)] = alias
        return f"{alias}.{rest}" if rest else alias

    def literal(self, value: Any, where: str = "value", indent: int = 0) -> str:
        """Source text that evaluates to a value equal to ``value``."""
        if isinstance(value, enum.Enum):
            return f"{self._guard(where, self.name_of, type(value))}.{value.name}"
        if value is None or isinstance(value, (bool, int, str, bytes)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, torch.dtype):
            return str(value)
        if isinstance(value, torch.device):
            return f"torch.device({str(value)!r})"
        if isinstance(value, torch.Size):
            return f"torch.Size({self.literal(list(value), where)})"
        if isinstance(value, (list, tuple, set, frozenset)):
            return self._sequence(value, where, indent)
        if isinstance(value, dict):
            return self._dict(value, where, indent)
        if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
            return self._guard(where, self.name_of, value)
        if dataclasses.is_dataclass(value):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
            return self._call(type(value), fields, where, indent)
        if callable(getattr(value, "to_dict", None)):
            return self._config(value, where, indent)
        raise NotSource(f"{where}: a {type(value).__module__}.{type(value).__qualname__} "
                        "has no source form")

    def _guard(self, where: str, fn: Any, value: Any) -> str:
        try:
            return fn(value)
        except NotSource as exc:
            raise NotSource(f"{where}: {exc}") from None

    def _sequence(self, value: Any, where: str, indent: int) -> str:
        items = [self.literal(v, f"{where}[{i}]", indent) for i, v in enumerate(value)]
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        if isinstance(value, tuple):
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        body = ", ".join(sorted(items))
        if isinstance(value, frozenset):
            return f"frozenset({{{body}}})" if items else "frozenset()"
        return f"{{{body}}}" if items else "set()"

    def _dict(self, value: dict, where: str, indent: int) -> str:
        pairs = [(self.literal(k, f"{where} key", indent + 1),
                  self.literal(v, f"{where}[{k!r}]", indent + 1)) for k, v in value.items()]
        if len(pairs) <= 3:
            return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
        pad = "    " * (indent + 1)
        body = "".join(f"{pad}{k}: {v},\n" for k, v in pairs)
        return "{\n" + body + "    " * indent + "}"

    def _call(self, cls: type, fields: dict[str, Any], where: str, indent: int) -> str:
        name = self._guard(where, self.name_of, cls)
        return f"{name}(**{self._dict(fields, where, indent)})"

    def _config(self, value: Any, where: str, indent: int) -> str:
        """``Cls(**value.to_dict())``, if rebuilding that way gives the same ``to_dict()``."""
        data = value.to_dict()
        try:
            same = type(value)(**data).to_dict() == data
        except Exception:
            same = False
        if not same:
            raise NotSource(f"{where}: {type(value).__qualname__}(**to_dict()) does not "
                            "rebuild an equal object")
        return self._call(type(value), data, where, indent)
