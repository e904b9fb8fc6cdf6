"""``cuda-agent train rft|value|ppo --config FILE``: the single-GPU trainer.

    cuda-agent train rft   --config configs/train/qwen-0.5b.yaml
    cuda-agent train value --config configs/train/qwen-0.5b.yaml --set model.path=OUT/rft/final
    cuda-agent train ppo   --config configs/train/qwen-0.5b.yaml --set ppo.steps=20

See docs/training.md ("The single-GPU trainer") and src/cuda_agent/train/.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli.exits import bad_input, failed
from cuda_agent.cli.render import console

app = typer.Typer(help="Train the actor and critic: RFT, value pretraining, PPO (one GPU).",
                  no_args_is_help=True)

CONFIG = typer.Option(..., "--config", "-c", help="Training config (YAML), e.g. "
                      "configs/train/tiny.yaml.")
SETS = typer.Option([], "--set", help="Override KEY.PATH=VALUE (YAML value), e.g. "
                    "--set optim.lr=1e-5 --set ppo.steps=10.")


def _run(stage: str, config_path: Path, sets: list[str]) -> None:
    from cuda_agent.agent.types import PolicyError
    from cuda_agent.tasks import TaskError
    from cuda_agent.train.batch import TrainDataError
    from cuda_agent.train.config import TrainConfigError, load_config
    from cuda_agent.train.guards import TrainSignalError
    from cuda_agent.train.models import ModelLoadError

    try:
        config = load_config(config_path, sets)
        if stage == "rft":
            from cuda_agent.train.rft import train_rft as train
        elif stage == "value":
            from cuda_agent.train.value import train_value as train
        else:
            from cuda_agent.train.ppo import train_ppo as train
        console.rule(f"train {stage}: {config.model.path}")
        result = train(config)
    except (TrainConfigError, TrainDataError, ModelLoadError, TaskError, PolicyError,
            ValueError) as exc:
        raise bad_input(exc) from None
    except TrainSignalError as exc:  # usable input, nothing learned: the job failed
        raise failed(exc) from None
    last = result.metrics[-1] if result.metrics else {}
    shown = ", ".join(f"{k} {last[k]:.4g}" for k in ("loss", "reward", "explained_variance")
                      if isinstance(last.get(k), (int, float)))
    console.print(f"{stage}: {result.steps} steps{': ' + shown if shown else ''}",
                  highlight=False)
    console.print(f"outputs: {result.out} (metrics.jsonl, checkpoints/, curves)")
    if result.final is not None:
        console.print(f"trained model: {result.final}")


@app.command("rft")
def rft(config: Path = CONFIG, sets: list[str] = SETS) -> None:
    """Rejection fine-tuning: SFT of the actor on the selected trajectories."""
    _run("rft", config, sets)


@app.command("value")
def value(config: Path = CONFIG, sets: list[str] = SETS) -> None:
    """Value pretraining: the critic regresses GAE returns of the trajectories."""
    _run("value", config, sets)


@app.command("ppo")
def ppo(config: Path = CONFIG, sets: list[str] = SETS) -> None:
    """PPO: rollouts with the current actor, judged rewards, actor + critic updates."""
    _run("ppo", config, sets)
