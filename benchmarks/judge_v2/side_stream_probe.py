"""Private-stream work against the disturbance filter (GPU probe).

Times ``torch.sin`` over 32M floats honestly and from a private stream that is never joined,
with the judge's disturbance filter on and off (``DISTURBED_MARGIN`` raised), and prints the
medians, how many calls were left out and the flush times. Run on the GPU machine:

    PYTHONPATH=src python3 benchmarks/judge_v2/side_stream_probe.py
"""

from __future__ import annotations

import torch

from cuda_agent.build import BuildConfig, Builder, load_extension
from cuda_agent.judge import device_timer
from cuda_agent.judge.timing import Rotation, load_blocker, measure, stats

N = 1 << 25


def rotation() -> Rotation:
    def variant(k: int) -> list[torch.Tensor]:
        gen = torch.Generator(device="cuda").manual_seed(1000 + k)
        return [torch.randn(N, device="cuda", generator=gen)]

    return Rotation(variant, 2)


def main() -> None:
    blocker = load_blocker(load_extension(Builder(BuildConfig(device="cuda")).build_tracer()))
    side = torch.cuda.Stream()

    def hostile(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            return torch.sin(x)

    margin = device_timer.DISTURBED_MARGIN
    for rep in range(2):
        for name, fn in (("honest", torch.sin), ("hostile", hostile)):
            for label, value in (("filter", margin), ("no filter", 100.0)):
                device_timer.DISTURBED_MARGIN = value
                result = measure(fn, rotation(), "cuda", blocker=blocker, budget_s=2.0,
                                 max_runs=2000)
                d = result.details
                print(f"{rep} {name:8} {label:9} median {stats(result.samples).median_ms:.5f} "
                      f"ms, runs {len(result.samples)}, left out {d['disturbed']}, flush "
                      f"median {d['flush_ms_median']:.4f} ms", flush=True)
    device_timer.DISTURBED_MARGIN = margin


if __name__ == "__main__":
    main()
