"""Apply ``key.sub=value`` overrides from the command line to a pydantic config."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError

C = TypeVar("C", bound=BaseModel)


def apply(config: C, overrides: list[str]) -> C:
    """Return a copy of ``config`` with each ``a.b=value`` set; values parse as JSON if they can."""
    data = config.model_dump()
    touched: dict[str, Any] = {}  # the tree of the keys named, for _set_only
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"override '{item}' is not KEY=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise typer.BadParameter(f"override '{item}': no section '{part}'")
            node = node[part]
        if parts[-1] not in node:
            raise typer.BadParameter(f"override '{item}': unknown field '{parts[-1]}' "
                                     f"(known: {', '.join(sorted(node))})")
        node[parts[-1]] = value
        named = touched
        for part in parts:
            named = named.setdefault(part, {})
    try:
        return type(config).model_validate(_set_only(config, data, touched))
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None


def _set_only(model: BaseModel, data: dict[str, Any], touched: dict[str, Any]
              ) -> dict[str, Any]:
    """``data`` with only the fields ``model`` had set or an override named, at every level:
    what was not set stays unset (``judge.config.in_episode`` reads which fields were)."""
    out = {}
    for key, value in data.items():
        if key in model.model_fields_set or key in touched:
            sub = getattr(model, key, None)
            if isinstance(sub, BaseModel) and isinstance(value, dict):
                value = _set_only(sub, value, touched.get(key, {}))
            out[key] = value
    return out
