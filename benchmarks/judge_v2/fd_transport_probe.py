"""How long a confined worker's outputs take to reach the judge: ``memfd`` vs ``cuda-fd``.

The judge lends a device pack (``judge.device_pack``) and creates a memory file; a worker
(confined in its own namespaces where they can be made, else a plain process) makes the
outputs (default 9 x 256 MiB = 268 MB, as KernelBench 1/40 LayerNorm), packs them both
ways and exits; the judge then reads both packs and checks every byte against the same
outputs made here. Prints each side's time per kind; exits 1 on any mismatch or
fall-back, 2 without a GPU. GPU machine, repository root (under a minute):

    PYTHONPATH=src python3 benchmarks/judge_v2/fd_transport_probe.py [--outputs 9] [--mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WORKER = """
import json, sys, time, torch
from cuda_agent.judge import device_pack
from cuda_agent.judge.transport import Packer
job = json.loads(sys.argv[1])
torch.cuda.init()
start = time.perf_counter()
device_pack.receive(job)
times = {"worker: import + map the lent memory": time.perf_counter() - start}
g = torch.Generator(device="cuda").manual_seed(job["seed"])
outs = [torch.randn(job["elements"], generator=g, device="cuda") for _ in range(job["outputs"])]
torch.cuda.synchronize()
said = {"times": times}
for kind in ("memfd", "cuda-fd"):
    start = time.perf_counter()
    packer = Packer(None, "cuda", kind)
    descriptors = packer.add(outs)
    pack = packer.finish()
    times[f"{kind}: worker packs"] = time.perf_counter() - start
    said[kind] = {"pack": pack, "descriptors": descriptors, "fallback": packer.fallback}
print(json.dumps(said))
"""


def worker_argv(folder: Path, job: dict) -> tuple[list[str], str]:
    from cuda_agent.execution.sandbox_local import confine_argv, namespace_prefix
    from cuda_agent.judge.confine import confinement

    argv = [sys.executable, "-c", WORKER, json.dumps(job)]
    prefix, confine = namespace_prefix(network=False), confinement("auto")
    if prefix is None or confine is None:
        return argv, "plain process (no namespaces here)"
    return confine_argv(prefix, folder, list(confine.keep), init=True) + argv, "confined"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=9)
    parser.add_argument("--mib", type=float, default=256.0, help="MiB per output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    from cuda_agent.judge import device_pack, shared_pack
    from cuda_agent.judge.transport import aligned, open_pack, unpack

    elements = int(args.mib * 2**20) // 4
    ordinal = torch.cuda.current_device()
    total = args.outputs * aligned(elements * 4)
    times: dict[str, float] = {}
    torch.cuda.init()
    start = time.perf_counter()
    offer = device_pack.offer(f"cuda:{ordinal}", total)  # as the judge: allocate, zero, export
    times["judge: allocate + export the lent memory"] = time.perf_counter() - start
    if offer.memory is None:
        print(f"no device pack: {offer.reason}")
        return 1
    memory = offer.memory
    memfd = shared_pack.create(total + (1 << 20))
    judge_end, worker_end = device_pack.channel()
    job = {"pack_bytes": memory.size, "pack_device": ordinal, "outputs": args.outputs,
           "elements": elements, "seed": 1234}
    with tempfile.TemporaryDirectory(prefix="fd-probe-") as folder:
        argv, how = worker_argv(Path(folder), job)
        env = {**os.environ, device_pack.ENV_SOCK: str(worker_end.fileno()),
               shared_pack.ENV_FD: str(memfd)}
        if os.environ.get("PYTHONPATH"):  # the worker runs in another folder: no relative paths
            env["PYTHONPATH"] = os.pathsep.join(
                os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)
        device_pack.send(judge_end, memory)
        start = time.perf_counter()
        done = subprocess.run(argv, pass_fds=(worker_end.fileno(), memfd), env=env, cwd=folder,
                              capture_output=True, text=True, timeout=300)
        times["worker process, start to exit"] = time.perf_counter() - start
    judge_end.close()
    worker_end.close()
    print(f"{args.outputs} outputs x {elements * 4 / 1e6:.0f} MB = {total / 1e9:.2f} GB; "
          f"worker: {how}; lent {memory.size} bytes on cuda:{ordinal}")
    if done.returncode != 0:
        print(f"worker failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
        return 1
    said = json.loads(done.stdout.splitlines()[-1])
    times.update(said["times"])
    g = torch.Generator(device="cuda").manual_seed(job["seed"])
    expected = [torch.randn(elements, generator=g, device="cuda") for _ in range(args.outputs)]
    failed = False
    for kind in ("memfd", "cuda-fd"):
        record = said[kind]
        if record["fallback"] or record["pack"]["kind"] != kind:
            print(f"{kind}: fell back ({record['fallback']}); worker stderr:\n"
                  f"{done.stderr[-2000:]}")
            failed = True
            continue
        torch.cuda.synchronize()
        start = time.perf_counter()
        buffer = open_pack(record["pack"], Path("."), "cuda", kind, memfd, memory)
        got = unpack(buffer, record["descriptors"])
        torch.cuda.synchronize()
        times[f"{kind}: judge reads"] = time.perf_counter() - start
        bad = [k for k, (a, b) in enumerate(zip(got, expected, strict=True))
               if not torch.equal(a, b)]
        if bad:
            print(f"{kind}: outputs {bad} differ")
            failed = True
        del buffer, got
    os.close(memfd)
    for name, seconds in times.items():
        print(f"  {name:44} {seconds * 1e3:9.1f} ms")
    steps = {"memfd": ["memfd: worker packs", "memfd: judge reads"],
             "cuda-fd": ["judge: allocate + export the lent memory",
                         "worker: import + map the lent memory", "cuda-fd: worker packs",
                         "cuda-fd: judge reads"]}
    for kind, names in steps.items():
        if all(name in times for name in names):
            label = f"{kind}: handover, all its steps"
            print(f"  {label:44} {sum(times[n] for n in names) * 1e3:9.1f} ms")
    print("MISMATCH" if failed else "ok: both packs match byte for byte")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
