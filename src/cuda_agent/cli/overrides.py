"""Apply ``key.sub=value`` overrides from the command line to a pydantic config."""

from __future__ import annotations

import json
from typing import TypeVar

import typer
from pydantic import BaseModel, ValidationError

C = TypeVar("C", bound=BaseModel)


def apply(config: C, overrides: list[str]) -> C:
    """Return a copy of ``config`` with each ``a.b=value`` set; values parse as JSON if they can."""
    data = config.model_dump()
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
    try:
        return type(config).model_validate(data)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
