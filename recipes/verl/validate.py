"""Compose every recipe with Hydra against verl's own configs, on the CPU; print OK per one.

    .venv-verl/bin/python recipes/verl/validate.py            # all four stages
    .venv-verl/bin/python recipes/verl/validate.py ppo rft    # some

Three checks per recipe: (1) it composes with the same defaults verl's entry point uses
(``ppo_trainer`` for verl.trainer.main_ppo, ``sft_trainer_engine`` for
verl.trainer.sft_trainer); (2) every key the recipe sets exists in that base config (a
misspelt key would otherwise be added silently); (3) verl's typed sections accept the
values: ``validate_config`` (actor, batch sizes; the critic's optimizer, as its model is a
placeholder here) and the dataclasses of rollout, multi-turn, agent loop and algorithm for
PPO, the optimizer and engine for SFT. The agent loops file must load and name classes
that import. Exit status 1 if any recipe fails.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

HERE = Path(__file__).resolve().parent
STAGES = {"single_turn_warmup": "ppo_trainer", "rft": "sft_trainer_engine",
          "value_pretrain": "ppo_trainer", "ppo": "ppo_trainer"}
SKIP = {"defaults", "hydra"}


def leaf_keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, DictConfig):
        keys: list[str] = []
        for key in node.keys():  # noqa: SIM118 - `in node` skips '???' values
            if not prefix and key in SKIP:
                continue
            value = node._get_node(key)
            keys += leaf_keys(value, f"{prefix}{key}.") if isinstance(value, DictConfig) \
                and len(value) else [f"{prefix}{key}"]
        return keys
    return []


def own_keys(name: str) -> list[str]:
    """The keys a recipe sets, its parents' in this folder included."""
    raw = OmegaConf.load(HERE / f"{name}.yaml")
    keys = leaf_keys(raw)
    for parent in raw.get("defaults", []):
        if isinstance(parent, str) and (HERE / f"{parent}.yaml").is_file():
            keys += own_keys(parent)
    return keys


def compose_one(name: str, overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(HERE), version_base=None):
        return compose(config_name=name, overrides=overrides or [])


def compose_base(base: str) -> DictConfig:
    verl_config = Path(importlib.import_module("verl.trainer.config").__file__).parent
    with initialize_config_dir(config_dir=str(verl_config), version_base=None):
        return compose(config_name=base)


def has_key(config: DictConfig, dotted: str) -> bool:
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():  # noqa: SIM118
            return False
        node = node._get_node(part)
    return True


def check_keys(name: str, base: DictConfig) -> None:
    unknown = [k for k in own_keys(name) if not has_key(base, k)]
    if unknown:
        raise KeyError(f"keys verl does not know: {', '.join(unknown)}")


def check_ppo(config: DictConfig) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    OmegaConf.resolve(config)
    # the critic's own check loads its model's config from disk: the recipe's model is a
    # placeholder here, so only its optimizer is checked
    if not need_critic(config):
        raise ValueError("these recipes train a critic (GAE): critic must be enabled")
    validate_config(config, use_reference_policy=need_reference_policy(config),
                    use_critic=False)
    rollout = config.actor_rollout_ref.rollout
    for section in (rollout, rollout.multi_turn, rollout.agent, config.algorithm,
                    config.critic.optim):
        omega_conf_to_dataclass(section)
    check_agent_loops(rollout.agent.agent_loop_config_path, rollout.agent.default_agent_loop)


def check_sft(config: DictConfig) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    OmegaConf.resolve(config)
    for section in (config.optim, config.engine, config.checkpoint):
        omega_conf_to_dataclass(section)


def check_agent_loops(path: str, default: str) -> None:
    entries = OmegaConf.load(path)
    if not isinstance(entries, ListConfig):
        raise TypeError(f"{path}: a list of agent loops expected")
    names = []
    for entry in entries:
        module, _, cls = str(entry._target_).rpartition(".")
        getattr(importlib.import_module(module), cls)
        names.append(entry.name)
    if default not in names:
        raise KeyError(f"default_agent_loop {default!r} is not in {path} ({names})")


def validate(name: str) -> None:
    base = STAGES[name]
    config = compose_one(name)
    check_keys(name, compose_base(base))
    (check_ppo if base == "ppo_trainer" else check_sft)(config)


def main(argv: list[str]) -> int:
    os.environ.setdefault("CUDA_AGENT_RECIPES", str(HERE))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    failed = 0
    for name in argv or list(STAGES):
        try:
            validate(name)
        except Exception as exc:  # report every recipe, then fail
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
        else:
            print(f"OK {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
