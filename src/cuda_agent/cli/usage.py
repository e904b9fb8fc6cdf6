"""Usage errors (an unknown option or command, a missing argument, a value an option does
not take) in one line, ``error: ... (see 'cuda-agent CMD --help')``, exit status 2, for
every command: the parser's own boxed, multi-line form is not shown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from cuda_agent.cli.exits import BAD_INPUT, REFUSED
from cuda_agent.cli.render import errors

PROG = "cuda-agent"

# typer raises click's exceptions, or those of the click it carries inside: found from the
# one typer exports, so either works
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException = next(c for c in typer.BadParameter.__mro__
                      if c.__name__ == "ClickException")


def run(app: typer.Typer) -> None:
    """Run ``app`` as the ``cuda-agent`` command, usage errors in one line."""
    try:
        code = app(standalone_mode=False, prog_name=PROG)
    except UsageError as exc:
        if type(exc).__name__ != "NoArgsIsHelpError":  # the help, already shown
            _one_line(exc)
        sys.exit(BAD_INPUT)
    except ClickException as exc:
        _one_line(exc)
        sys.exit(exc.exit_code)
    except typer.Abort:
        errors.print("[red]error:[/] aborted", highlight=False)
        sys.exit(REFUSED)
    sys.exit(code if isinstance(code, int) else 0)


def _one_line(exc: Any) -> None:
    message = escape(" ".join(str(exc.format_message()).split()))
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else PROG
    errors.print(f"[red]error:[/] {message} (see '{where} --help')", highlight=False)


def one_of(*allowed: str) -> Callable[[Any], Any]:
    """An option's callback that takes only ``allowed`` values (None passes: unset)."""

    def check(value: Any) -> Any:
        if value is not None and value not in allowed:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}")
        return value

    return check
