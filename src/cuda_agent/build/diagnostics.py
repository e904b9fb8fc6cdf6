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
MAX_LOG = 2 << 20
"""The most characters of compiler output one build keeps (``join_logs``): each process's is
cut at 1 MiB as it runs, and a build runs one per source."""


def parse(output: str, limit: int = MAX_DIAGNOSTICS) -> tuple[Diagnostic, ...]:
    """Parse compiler output; errors first, then warnings, at most ``limit`` in all (the
    first ones found, each once), in one pass: a log of any size costs its length."""
    errors: dict[Diagnostic, None] = {}
    warnings: dict[Diagnostic, None] = {}
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
            found = Diagnostic(match["file"].strip(), int(match["line"]),
                               int(col) if col else None, severity, _trim(message))
        elif _OTHER.search(line) and not line.lstrip().startswith(("In file", "from ")):
            found = Diagnostic(None, None, None, "error", _trim(line.strip()))
        else:
            continue
        kept = errors if found.severity in ("error", "fatal error") else warnings
        if len(kept) < limit:
            kept[found] = None
        if len(errors) >= limit:
            break  # nothing later can be shown
    return tuple([*errors, *warnings][:limit])


def join_logs(logs: list[str], limit: int = MAX_LOG) -> str:
    """``logs`` joined by newlines in at most about ``limit`` characters: each keeps its
    start, the longer ones cut to an equal share of what the shorter leave."""
    kept, left = list(logs), limit
    for count, i in enumerate(sorted(range(len(logs)), key=lambda k: len(logs[k]))):
        share = left // (len(logs) - count)
        if len(logs[i]) > share:
            kept[i] = (logs[i][:share] + f"\n... [{len(logs[i]) - share} characters of this "
                       "log cut] ...")
        left -= min(len(logs[i]), share)
    return "\n".join(kept)


def trim_log(output: str, limit: int = 4000) -> str:
    """Keep the head and tail of a long compiler log."""
    if len(output) <= limit:
        return output
    half = limit // 2
    return output[:half] + f"\n... [{len(output) - limit} characters cut] ...\n" + output[-half:]


def _trim(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
