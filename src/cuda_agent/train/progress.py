"""A rich progress bar for the training commands (off with ``logging.progress: false``)."""

from __future__ import annotations

from typing import Any

from cuda_agent.train.config import TrainConfig

SHOWN = ("loss", "reward", "explained_variance", "kl", "tokens_per_s")


class Progress:
    """``with Progress(config, "rft", total, start) as bar: bar.advance(metrics)``."""

    def __init__(self, config: TrainConfig, stage: str, total: int, start: int = 0):
        self.enabled = config.logging.progress
        self.stage, self.total, self.start = stage, total, start
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("{task.fields[info]}"), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.stage, total=self.total,
                                            completed=self.start, info="")
        return self

    def advance(self, metrics: dict[str, float]) -> None:
        if self._bar is None:
            return
        info = "  ".join(f"{k} {metrics[k]:.4g}" for k in SHOWN if k in metrics)
        self._bar.update(self._task, advance=1, info=info)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
