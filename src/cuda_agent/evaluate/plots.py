"""PNG plots of an evaluation: fast_p curves and the speed-up distribution per level."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cuda_agent.evaluate.metrics import OVERALL, TaskRecord, fast_p, level_name

BASELINES = ("eager", "compile")


def _groups(records: Sequence[TaskRecord]) -> list[tuple[str, list[TaskRecord]]]:
    levels = sorted({r.level for r in records}, key=lambda k: (k is None, k or 0))
    groups = [(level_name(k), [r for r in records if r.level == k]) for k in levels]
    return [*groups, (OVERALL, list(records))] if len(groups) > 1 else groups or [(OVERALL, [])]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fast_p(records: Sequence[TaskRecord], path: Path, p_max: float = 3.0) -> Path:
    """fast_p (fraction of all tasks correct with speed-up > p) against p, per baseline."""
    plt = _pyplot()
    ps = [p_max * i / 120 for i in range(121)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, base in zip(axes, BASELINES, strict=True):
        for name, group in _groups(records):
            ax.plot(ps, [fast_p(group, p, base) or 0.0 for p in ps], label=name)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(title=f"fast_p vs {base}", xlabel="p (speed-up threshold)", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of tasks")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedups(records: Sequence[TaskRecord], path: Path) -> Path:
    """Speed-ups of the correct answers per level (log scale), one panel per baseline."""
    plt = _pyplot()
    groups = _groups(records)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, base in zip(axes, BASELINES, strict=True):
        data = [[s for r in group if r.correct
                 if (s := getattr(r, f"speedup_vs_{base}")) is not None] for _, group in groups]
        for i, values in enumerate(data, 1):
            if values:
                ax.boxplot(values, positions=[i], widths=0.6, showfliers=False)
                ax.scatter([i] * len(values), values, s=10, alpha=0.5)
        ax.set_xticks(range(1, len(groups) + 1), [name for name, _ in groups])
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        if any(data):
            ax.set_yscale("log")
        ax.set(title=f"speed-up vs {base} (correct answers)", ylabel="speed-up")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
