"""The trainer's configuration: one YAML file, one section per component.

    config = load_config(Path("configs/train/tiny.yaml"), ["optim.lr=1e-4"])

Sections: ``model`` (what to load and how), ``data`` (which trajectories), ``optim`` (the
optimiser and the batch), ``ppo`` (the RL stage), ``toy`` (the toy text task), ``logging``
and ``checkpoint``. Unknown keys are errors that name their full path (``optim.lrr``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class TrainConfigError(ValueError):
    """The configuration file or an override is wrong; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Section):
    """Low-rank adapters (peft) instead of full fine-tuning."""

    r: int = Field(16, gt=0, description="Rank of the adapters.")
    alpha: int = Field(32, gt=0, description="Scale numerator (the update is alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] | str = Field(
        "all-linear", description="Module names to adapt, or 'all-linear'.")


class ModelConfig(_Section):
    """The actor (a causal LM folder) and the critic built from it."""

    path: str = Field(min_length=1, description="Folder that AutoModelForCausalLM and "
                      "AutoTokenizer load (the actor and, by default, the critic's base).")
    critic_path: str | None = Field(
        None, description="Critic checkpoint folder (written by `train value`); None: a "
        "fresh value head on the actor's weights.")
    dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="Compute precision; 'auto': bf16 on CUDA, fp32 on CPU.")
    master_weights: bool = Field(True, description="Keep the weights that train in fp32 and "
                                 "compute in `dtype` under autocast; false: store them in "
                                 "`dtype` (half the memory, but an update smaller than ~0.4% "
                                 "of a bf16 weight is lost).")
    device: str = Field("auto", description="'auto' (CUDA when present), 'cpu', 'cuda:0'.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the "
                                         "backward pass (less memory, ~30% slower).")
    lora: LoraSettings | None = Field(None, description="LoRA adapters; null: full "
                                      "fine-tuning.")


class DataConfig(_Section):
    """Where the training trajectories come from."""

    trajectories: list[str] = Field(default_factory=list, description="Globs of trajectory "
                                    "JSONL files (relative to the config file's folder).")
    manifest: str | None = Field(None, description="A rollout manifest (JSONL, one record "
                                 "with a 'trajectory' path per line), added to the globs.")
    max_len: int = Field(4096, gt=8, description="Tokens per sample at most (longer ones "
                         "are truncated).")
    select: bool = Field(True, description="RFT: keep only trajectories that pass the "
                         "selection (positive reward, no loops, no malformed calls).")
    selection: dict[str, Any] = Field(default_factory=dict, description="Options of the "
                                      "selection (its config's fields).")
    value_select: bool = Field(False, description="Value pretraining: pass the "
                               "trajectories through the RFT selection too; false: the "
                               "critic learns from every outcome, failures included.")


class OptimConfig(_Section):
    """The optimiser (AdamW), its schedule and the batch."""

    lr: float = Field(3e-6, gt=0, description="Actor learning rate (paper: 3e-6).")
    critic_lr: float = Field(6e-6, gt=0, description="Critic learning rate (paper: 6e-6).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    batch_size: int = Field(8, gt=0, description="Samples per optimiser step.")
    micro_batch_size: int = Field(1, gt=0, description="Samples per forward pass "
                                  "(gradients are accumulated).")
    epochs: int = Field(1, gt=0, description="Passes over the data (RFT, value).")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many steps "
                                  "(RFT, value); PPO uses ppo.steps.")
    seed: int = Field(0, description="Seed of torch, python and the data order.")


class PPOConfig(_Section):
    """The RL stage (asymmetric-clip PPO with a critic)."""

    mode: Literal["agent", "single_turn", "toy"] = Field(
        "agent", description="'agent': multi-turn episodes; 'single_turn': the warm-up, "
        "the whole kernel in one reply; 'toy': the toy text task (tests).")
    steps: int = Field(150, gt=0, description="PPO steps (paper: 150).")
    rollouts_per_step: int = Field(8, gt=0, description="Episodes collected per step.")
    tasks: list[str] = Field(default_factory=list, description="Task references "
                             "(builtin:NAME, PATH[::SELECTOR]), cycled through.")
    device: str = Field("auto", description="Judge device: cpu, cuda or auto.")
    max_turns: int = Field(20, gt=0, description="Agent turns per episode (paper: 150).")
    max_new_tokens: int = Field(1024, gt=0, description="Tokens of one reply at most.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of rollouts.")
    judge: dict[str, Any] = Field(default_factory=dict, description="Final-judgement "
                                  "overrides (e.g. trials, time_compile).")
    clip_low: float = Field(0.2, gt=0, description="Ratio clip below (eps_low).")
    clip_high: float = Field(0.28, gt=0, description="Ratio clip above (eps_high).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference loss weight; 0: off.")
    value_clip: float | None = Field(None, description="Critic value clip; None: off.")
    whiten_advantages: bool = Field(True, description="Normalise advantages per batch.")
    ppo_epochs: int = Field(1, gt=0, description="Passes over each step's samples.")
    critic_warmup_steps: int = Field(0, ge=0, description="First steps update only the "
                                     "critic.")


class ToyConfig(_Section):
    """The toy text task: reward = share of generated tokens equal to ``target``."""

    prompt: str = Field("0 1 2", description="The prompt text.")
    target: str = Field("7", description="The rewarded token.")
    new_tokens: int = Field(8, gt=0, description="Tokens generated per rollout.")


class LoggingConfig(_Section):
    """Where metrics go."""

    out_dir: str = Field("train-runs/run", description="Output folder (metrics.jsonl, "
                         "tensorboard/, checkpoints/, curves, actor-*/, critic-*/).")
    tensorboard: bool = Field(True, description="Write TensorBoard scalars.")
    wandb_project: str | None = Field(None, description="Also log to Weights & Biases "
                                      "(needs the wandb package); None: off.")
    log_every: int = Field(1, gt=0, description="Log metrics every N steps.")
    progress: bool = Field(True, description="Show a rich progress bar.")


class CheckpointConfig(_Section):
    """Saving and resuming."""

    every: int = Field(50, gt=0, description="Save a checkpoint every N steps (and at end).")
    keep: int = Field(2, gt=0, description="Checkpoints kept (oldest deleted).")
    resume: bool = Field(True, description="Continue from the newest checkpoint in "
                         "OUT/checkpoints when there is one.")


class TrainConfig(_Section):
    """The whole file."""

    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    toy: ToyConfig = Field(default_factory=ToyConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    base_dir: str = Field(".", description="Folder relative paths are taken from "
                          "(set to the config file's folder by load_config).")

    def resolve(self, path: str) -> Path:
        """``path`` relative to ``base_dir`` unless absolute."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p


def load_config(path: Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> TrainConfig:
    """Read YAML ``path`` (or take ``data``), apply ``a.b=value`` overrides, validate."""
    raw: dict[str, Any] = dict(data or {})
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise TrainConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise TrainConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise TrainConfigError(f"{path}: the top level must be a mapping")
        raw = loaded
        raw.setdefault("base_dir", str(path.resolve().parent))
    for item in overrides or []:
        _set(raw, item)
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: "
                             f"{'unknown field' if e['type'] == 'extra_forbidden' else e['msg']}"
                             for e in exc.errors())
        where = f"{path}: " if path is not None else ""
        raise TrainConfigError(f"{where}bad training config: {problems}") from None
    return _absolute(config)


def _absolute(config: TrainConfig) -> TrainConfig:
    """Model folders and the output folder made absolute (from ``base_dir``)."""
    model = config.model.model_copy(update={
        "path": str(config.resolve(config.model.path)),
        "critic_path": str(config.resolve(config.model.critic_path))
        if config.model.critic_path else None})
    logging = config.logging.model_copy(update={
        "out_dir": str(config.resolve(config.logging.out_dir).resolve())})
    return config.model_copy(update={"model": model, "logging": logging})


def _set(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise TrainConfigError(f"override {item!r} is not KEY.PATH=VALUE")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrainConfigError(f"override {item!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def dump_config(config: TrainConfig) -> str:
    """The resolved configuration as JSON (written next to the outputs)."""
    return json.dumps(config.model_dump(mode="json"), indent=2)
