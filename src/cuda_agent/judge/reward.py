"""The milestone reward of the paper, a plain function shared by judge, trainer and eval."""

from __future__ import annotations


def milestone_reward(correct: bool, runtime_ms: float | None, eager_ms: float | None,
                     compile_ms: float | None, margin: float = 0.95) -> int:
    """-1 if incorrect; 3 if under ``margin`` x both baselines; 2 if under eager only; else 1.

    A baseline that was not measured cannot be beaten.
    """
    if not correct:
        return -1
    if runtime_ms is None or eager_ms is None or runtime_ms >= margin * eager_ms:
        return 1
    if compile_ms is not None and runtime_ms < margin * compile_ms:
        return 3
    return 2
