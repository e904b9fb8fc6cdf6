"""Incremental, content-addressed builds of a workspace's kernels into ``cuda_extension``."""

from cuda_agent.build.builder import BuildConfig, Builder, load_extension

__all__ = ["BuildConfig", "Builder", "load_extension"]
