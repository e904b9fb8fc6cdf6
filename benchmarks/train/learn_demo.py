"""The learning demonstration: RFT -> value pretraining -> PPO on a family of fused
elementwise chains with a held-out split, every reward from the real judge.

    python benchmarks/train/learn_demo.py --out results/learn-demo            # one H100
    python benchmarks/train/learn_demo.py --out /tmp/demo --device cpu --train 2 --heldout 1 \\
        --layers 2 --hidden 32 --rft-epochs 2 --ppo-steps 1 --rollouts 2 --max-new-tokens 16

A random GPT-2 (no weights are downloaded) with a tokenizer trained on the episode's texts
(make_tiny_model.py) writes one reply per task (single-turn episodes). Stages: the scripted
expert solves the train split (demo_tasks.py; its episodes run and are judged like any
other); RFT on those trajectories; value pretraining on them plus the RFT actor's own
rollouts on the train split (every outcome); PPO on the train split. The held-out split is
rolled out after each stage (base, RFT, PPO): mean reward and pass rate (reward >= 1).
OUT gets summary.md (the table), results.json, heldout.png and the stages' curves
(rft-loss.png, value-explained_variance.png, ppo-reward.png); the work folder (models,
workspaces, trajectories) is OUT/work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from demo_tasks import chain_tasks, write_expert_replay, write_task  # noqa: E402
from make_tiny_model import make_tiny_model  # noqa: E402


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--out", type=Path, required=True)
    add("--device", default="cuda", choices=["cuda", "cpu"])
    add("--train", type=int, default=36, help="train tasks (the expert solves each once)")
    add("--heldout", type=int, default=12, help="held-out tasks (never trained on)")
    add("--layers", type=int, default=4)
    add("--hidden", type=int, default=256)
    add("--rft-epochs", type=int, default=60)
    add("--value-steps", type=int, default=40)
    add("--ppo-steps", type=int, default=8)
    add("--rollouts", type=int, default=12, help="PPO episodes per step")
    add("--max-new-tokens", type=int, default=1200)
    add("--temperature", type=float, default=0.3, help="sampling temperature of evaluations")
    add("--judge", type=json.loads, default=None, help="final-judgement overrides (JSON)")
    add("--seed", type=int, default=0)
    return parser.parse_args()


def base_config(args: argparse.Namespace, work: Path, model: Path, train: list[str]
                ) -> dict[str, Any]:
    judge = args.judge if args.judge is not None else (
        {} if args.device == "cuda" else {"trials": 2, "time_compile": False})
    return {
        "model": {"path": str(model), "device": args.device, "dtype": "fp32"},
        "data": {"max_len": 8192, "select": True},
        "optim": {"lr": 1e-3, "critic_lr": 1e-3, "batch_size": 4, "micro_batch_size": 4,
                  "seed": args.seed},
        "ppo": {"mode": "single_turn", "tasks": train, "device": args.device,
                "max_new_tokens": args.max_new_tokens, "judge": judge,
                "rollouts_per_step": args.rollouts, "steps": args.ppo_steps,
                "kl_coef": 0.0, "ppo_epochs": 2},
        "logging": {"out_dir": str(work / "run"), "tensorboard": False, "progress": False},
        "checkpoint": {"every": 100000, "resume": False},
    }


def config_for(base: dict[str, Any], **sections: dict[str, Any]) -> Any:
    from cuda_agent.train.config import load_config

    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return load_config(data=merged)


def rollout(data: dict[str, Any], model: Path, refs: list[str], folder: Path,
            temperature: float) -> list[Any]:
    """One single-turn episode per task with the model at ``model``; their results."""
    from cuda_agent.train.collect import EpisodeCollector
    from cuda_agent.train.models import load_actor

    config = config_for(data, model={"path": str(model)},
                        ppo={"tasks": refs, "rollouts_per_step": len(refs),
                             "temperature": temperature})
    actor, tokenizer = load_actor(config.model)
    collector = EpisodeCollector(config, actor, tokenizer, folder)
    collector.collect(1)
    return collector.last_results


def score(results: list[Any]) -> dict[str, float]:
    rewards = [r.reward if r.reward is not None else -1 for r in results]
    return {"mean_reward": sum(rewards) / max(len(rewards), 1),
            "pass_rate": sum(1 for r in rewards if r >= 1) / max(len(rewards), 1),
            "episodes": len(rewards)}


def expert_trajectories(refs: list[str], chains: list[tuple[str, ...]], work: Path,
                        device: str, judge: dict[str, Any]) -> list[Path]:
    from cuda_agent.agent.loop import AgentConfig
    from cuda_agent.agent.policies import make_policy
    from cuda_agent.tasks import load_task
    from cuda_agent.train.rollout import RolloutConfig, collect

    replays = {}
    for ref, ops in zip(refs, chains, strict=True):
        task = load_task(ref)
        replays[task.name] = write_expert_replay(work / "replays" / f"{task.name}.json", ops,
                                                 device)
    summary = collect([load_task(r) for r in refs],
                      lambda task: make_policy(f"replay:{replays[task.name]}"),
                      work / "expert", RolloutConfig(device=device, agent=AgentConfig(
                          max_turns=1, judge=judge)))
    rewards = [r.reward for r in summary.finished]
    print(f"expert: {len(rewards)} episodes, rewards {rewards}", flush=True)
    return [work / "expert" / r.path for r in summary.finished]


def main() -> None:
    from cuda_agent.train.ppo import train_ppo
    from cuda_agent.train.rft import train_rft
    from cuda_agent.train.value import train_value

    args = arguments()
    out, work = args.out, args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "tasks").mkdir(parents=True)
    (work / "replays").mkdir()
    begin = time.perf_counter()
    tasks = chain_tasks(args.train + args.heldout, args.seed)
    batch = 4096 if args.device == "cuda" else 256
    refs = [str(write_task(work / "tasks", name, ops, batch)) for name, ops in tasks]
    train, heldout = refs[:args.train], refs[args.train:]
    model = make_tiny_model(work / "model", layers=args.layers, hidden=args.hidden,
                            positions=8192, seed=args.seed)
    data = base_config(args, work, model, train)
    table: dict[str, dict[str, float]] = {}
    stamps: dict[str, float] = {}

    def held_out(stage: str, path: Path) -> None:
        table[stage] = score(rollout(data, path, heldout, work / "eval" / stage,
                                     args.temperature))
        stamps[stage] = round(time.perf_counter() - begin, 1)
        print(f"held-out after {stage}: {table[stage]} ({stamps[stage]} s)", flush=True)

    held_out("base", model)
    expert = expert_trajectories(train, [ops for _, ops in tasks[:args.train]], work,
                                 args.device, data["ppo"]["judge"])
    rft = train_rft(config_for(data, data={"trajectories": [str(p) for p in expert]},
                               optim={"epochs": args.rft_epochs}))
    held_out("rft", rft.final)
    own = rollout(data, rft.final, train, work / "own", args.temperature)
    value_data = [str(p) for p in expert] + [r.trajectory for r in own if r.trajectory]
    value = train_value(config_for(data, model={"path": str(rft.final)},
                                   data={"trajectories": value_data},
                                   optim={"epochs": 100000, "max_steps": args.value_steps}))
    ppo = train_ppo(config_for(data, model={"path": str(rft.final),
                                            "critic_path": str(value.final)}))
    held_out("ppo", ppo.final)
    report(out, work, table, stamps, value.metrics, ppo.metrics, score(own))


def report(out: Path, work: Path, table: dict[str, dict[str, float]],
           stamps: dict[str, float], value: tuple[dict[str, Any], ...],
           ppo: tuple[dict[str, Any], ...], own: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    value = tuple(r for r in value if r.get("stage") == "value")  # metrics.jsonl is shared
    ppo = tuple(r for r in ppo if r.get("stage") == "ppo")
    ev = [r["explained_variance"] for r in value]
    results = {"heldout": table, "elapsed_s": stamps, "rft_actor_on_train": own,
               "value_explained_variance": {"first_step": ev[0], "last_step": ev[-1]},
               "ppo_reward": [r["reward"] for r in ppo],
               "ppo_explained_variance": [r.get("explained_variance") for r in ppo]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [f"| {stage} | {s['mean_reward']:.3f} | {s['pass_rate']:.3f} | {s['episodes']} "
            f"| {stamps[stage]} |" for stage, s in table.items()]
    (out / "summary.md").write_text("\n".join([
        "| held-out after | mean reward | pass rate | episodes | elapsed s |",
        "|---|---|---|---|---|", *rows, "",
        f"Critic explained variance, value pretraining: {ev[0]:.3f} (first step) -> "
        f"{ev[-1]:.3f} (last step); at PPO's steps: "
        f"{[round(x, 3) for x in results['ppo_explained_variance'] if x is not None]}.",
        f"RFT actor on the train split: {own}.", ""]))
    for name in ("rft-loss", "value-explained_variance", "ppo-reward"):
        if (work / "run" / f"{name}.png").is_file():
            shutil.copyfile(work / "run" / f"{name}.png", out / f"{name}.png")
    figure, axes = plt.subplots(figsize=(6, 3.5))
    stages = list(table)
    axes.plot(stages, [table[s]["mean_reward"] for s in stages], marker="o", label="mean reward")
    axes.plot(stages, [table[s]["pass_rate"] for s in stages], marker="s", label="pass rate")
    axes.set_title("held-out split after each stage")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "heldout.png", dpi=100)
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
