"""What every training command shares: the output folder, metrics, checkpoints, curves.

    run = Run(config, stage="rft")
    start = run.resume({"actor": actor}, {"actor": optimizer})
    run.log(step, {"loss": 0.3})
    run.maybe_checkpoint(step, modules, optimizers)
    run.finish()

``OUT`` (``logging.out_dir``) gets ``config.json``, ``metrics.jsonl`` (one JSON object per
logged step), ``tensorboard/``, ``checkpoints/step-N/`` (trainable weights, optimiser and
scheduler states, the step, the RNG states) and, at the end, ``curves.png`` files.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuda_agent.train.config import TrainConfig, dump_config
from cuda_agent.train.models import load_trainable_state, trainable_state

CURVES = ("reward", "explained_variance", "loss")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: nn.Module, lr: float, config: TrainConfig
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable weights, linear warm-up then constant."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=config.optim.weight_decay)
    warmup = config.optim.warmup_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, schedule


def clip_and_step(model: nn.Module, optimizer: Any, clip: float) -> float:
    """Clip the gradient norm of ``model``'s trainable weights, step the optimiser and its
    schedule (``optimizer`` is the pair make_optimizer returns); the norm before clipping."""
    opt, schedule = optimizer
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                          clip)
    opt.step()
    schedule.step()
    return float(norm)


class Run:
    """The output folder of one training command."""

    def __init__(self, config: TrainConfig, stage: str):
        self.config = config
        self.stage = stage
        self.out = config.resolve(config.logging.out_dir).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"config-{stage}.json").write_text(dump_config(config) + "\n")
        self.metrics_path = self.out / "metrics.jsonl"
        self._writer: Any = None
        self._wandb: Any = None
        self._start = time.perf_counter()
        if config.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.out / "tensorboard"))
        if config.logging.wandb_project:
            import wandb  # optional dependency

            self._wandb = wandb.init(project=config.logging.wandb_project,
                                     config=config.model_dump(mode="json"), dir=str(self.out))

    # -- metrics ---------------------------------------------------------------------------
    def log(self, step: int, metrics: dict[str, float], force: bool = False) -> None:
        if not force and step % self.config.logging.log_every:
            return
        record = {"stage": self.stage, "step": step,
                  "time_s": round(time.perf_counter() - self._start, 3), **metrics}
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            if self._writer is not None:
                self._writer.add_scalar(f"{self.stage}/{key}", value, step)
        if self._wandb is not None:
            self._wandb.log({f"{self.stage}/{k}": v for k, v in metrics.items()}, step=step)

    def records(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines()
                if line.strip()]

    # -- checkpoints -----------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints" / self.stage

    def save(self, step: int, modules: dict[str, nn.Module], optimizers: dict[str, Any]) -> Path:
        folder = self.checkpoints / f"step-{step:06d}"
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({name: trainable_state(m) for name, m in modules.items()},
                   tmp / "weights.pt")
        torch.save({name: {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
                    for name, (opt, sched) in optimizers.items()}, tmp / "optimizer.pt")
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available()
                    else None}, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, "stage": self.stage}))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        for old in sorted(self.checkpoints.glob("step-??????"))[:-self.config.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def maybe_save(self, step: int, last: bool, modules: dict[str, nn.Module],
                   optimizers: dict[str, Any]) -> None:
        if step % self.config.checkpoint.every == 0 or last:
            self.save(step, modules, optimizers)

    def latest(self) -> Path | None:
        found = sorted(self.checkpoints.glob("step-??????"))
        return found[-1] if found else None

    def resume(self, modules: dict[str, nn.Module], optimizers: dict[str, Any]) -> int:
        """Load the newest checkpoint (when resuming is on); the step to continue after."""
        folder = self.latest() if self.config.checkpoint.resume else None
        if folder is None:
            return 0
        weights = torch.load(folder / "weights.pt", map_location="cpu")
        for name, module in modules.items():
            load_trainable_state(module, weights[name])
        states = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False)
        for name, (opt, sched) in optimizers.items():
            opt.load_state_dict(states[name]["optimizer"])
            sched.load_state_dict(states[name]["scheduler"])
        rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return int(json.loads((folder / "state.json").read_text())["step"])

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> list[Path]:
        """Close the writers and draw the curves; the PNG files written."""
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
        return plot_curves(self.records(), self.out, self.stage)


def plot_curves(records: list[dict[str, Any]], out: Path, stage: str) -> list[Path]:
    """One PNG per curve in CURVES that this stage logged (``OUT/STAGE-NAME.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rows = [r for r in records if r.get("stage") == stage]
    for name in CURVES:
        points = [(r["step"], r[name]) for r in rows if isinstance(r.get(name), (int, float))]
        if not points:
            continue
        figure, axes = plt.subplots(figsize=(6, 3.5))
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=2)
        axes.set_xlabel("step")
        axes.set_ylabel(name)
        axes.set_title(f"{stage}: {name}")
        axes.grid(alpha=0.3)
        path = out / f"{stage}-{name}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
