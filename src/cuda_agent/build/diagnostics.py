"""Turn g++ / nvcc / linker output into a short list of structured diagnostics."""

from __future__ import annotations

import re

from cuda_agent.results import Diagnostic

_GCC = re.compile(
    r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
    r"(?P<sev>fatal error|error|warning):\s*(?P<msg>.*)$"
)
_NVCC = re.compile(
    r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*(?P<sev>catastrophic error|error|warning)"
    r"(?:\s*#[\w-]+)?:\s*(?P<msg>.*)$"
)
_OTHER = re.compile(r"(undefined reference|ptxas (?:fatal|error)|error:|collect2:|ld:)")

MAX_DIAGNOSTICS = 20
MAX_MESSAGE = 400


def parse(output: str, limit: int = MAX_DIAGNOSTICS) -> tuple[Diagnostic, ...]:
    """Parse compiler output; errors first, then warnings, at most ``limit`` in all."""
    found: list[Diagnostic] = []
    lines = output.splitlines()
    for i, raw in enumerate(lines):
        line = raw.rstrip()
        nvcc = _NVCC.match(line)
        match = _GCC.match(line) or nvcc
        if match:
            message = match["msg"].strip()
            # nvcc continues a message on indented lines; gcc indents a source excerpt
            j = i + 1
            while nvcc and j < len(lines) and lines[j].startswith("  ") and lines[j].strip() != "^":
                if _GCC.match(lines[j].strip()) or _NVCC.match(lines[j].strip()):
                    break
                message += " " + lines[j].strip()
                j += 1
                if len(message) > MAX_MESSAGE:
                    break
            severity = "error" if match["sev"] == "catastrophic error" else match["sev"]
            col = match.groupdict().get("col")
            found.append(Diagnostic(match["file"].strip(), int(match["line"]),
                                    int(col) if col else None, severity,
                                    _trim(message)))
        elif _OTHER.search(line) and not line.lstrip().startswith(("In file", "from ")):
            found.append(Diagnostic(None, None, None, "error", _trim(line.strip())))
    unique = list(dict.fromkeys(found))
    errors = [d for d in unique if d.severity in ("error", "fatal error")]
    warnings = [d for d in unique if d not in errors]
    return tuple((errors + warnings)[:limit])


def trim_log(output: str, limit: int = 4000) -> str:
    """Keep the head and tail of a long compiler log."""
    if len(output) <= limit:
        return output
    half = limit // 2
    return output[:half] + f"\n... [{len(output) - limit} characters cut] ...\n" + output[-half:]


def _trim(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
