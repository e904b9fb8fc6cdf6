"""A long-lived process that probes tasks one after another (started by ``runner``).

    python -m cuda_agent.synth.worker   # reads JSON requests on stdin, one a line

Each reply is one JSON line on the original stdout; the task's own prints (Python or C) go
to stderr, so they cannot corrupt the protocol. Imports torch once, which is what makes a
worker cheaper than a process per task.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    memory_gb = float(os.environ.get("CUDA_AGENT_SYNTH_MEMORY_GB", "0"))
    if memory_gb:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    from cuda_agent.synth.config import FilterConfig
    from cuda_agent.synth.probe import probe_task

    threads = int(os.environ.get("CUDA_AGENT_SYNTH_THREADS", "0"))
    if threads:
        torch.set_num_threads(threads)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            result = probe_task(request["code"], request["device"],
                                FilterConfig.model_validate(request["filters"]),
                                request.get("seed", 0))
        except BaseException as exc:  # noqa: BLE001 - report, never die on a task
            result = {"error": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc()[-2000:]}
        reply.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
