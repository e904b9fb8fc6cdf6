"""Task synthesis: seed crawler, composers, filters and the data set writer.

    cuda-agent synth catalog                       # crawl torch/transformers seed operators
    cuda-agent synth --count 30 --out runs/ops30   # compose, filter, write (resumable)
    cuda-agent synth check TASK.py --json          # every filter on one task
    cuda-agent synth audit KERNELBENCH.jsonl       # the filters over KernelBench

Nothing is crawled or run at import time. See docs/synthesis.md.
"""
