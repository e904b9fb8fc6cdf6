"""Measurements around the trainer's runs (used by benchmarks/train/device_train.sh).

    # run a `cuda-agent` command in this process; write its peak GPU memory to PEAK.json
    python benchmarks/train/throughput_report.py wrap PEAK.json -- train rft --config C.yaml
    # throughput table of finished runs (OUT: a logging.out_dir; LABEL: the table's row)
    python benchmarks/train/throughput_report.py table --md T.md --json T.json OUT:STAGE:LABEL ...
    # the end-to-end run: reward / explained-variance figures, curves, a summary
    python benchmarks/train/throughput_report.py e2e RUN_OUT DEST [--expert EXPERT_DIR]

Throughput comes from the trainer's own ``metrics.jsonl``: ``time_s`` (seconds since the
stage's run started, after the model was loaded) gives each optimiser step's wall time
(log to log: forward, backward, optimiser, logging); the tokens of each step are recounted
exactly by replaying the trainer's data order (``batch.batch_indices`` over the samples of
``load_samples`` with the run's saved config). The first step (CUDA kernels' warm-up,
allocator growth) is reported apart; tokens/s and s/step are over steps 2..N.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1024 ** 3


# -- wrap ----------------------------------------------------------------------------------
def wrap(peak_path: Path, argv: list[str]) -> int:
    import torch

    from cuda_agent.cli.main import app

    begin = time.perf_counter()
    code: Any = 0
    # `timeout` sends SIGTERM: exit through the finally below so the peak is still written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        app(args=argv, prog_name="cuda-agent")
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        peak: dict[str, Any] = {"argv": argv, "wall_s": round(time.perf_counter() - begin, 2)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak.update(device=torch.cuda.get_device_name(),
                        max_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                        max_reserved_gib=torch.cuda.max_memory_reserved() / GIB)
        peak_path.parent.mkdir(parents=True, exist_ok=True)
        peak_path.write_text(json.dumps(peak, indent=1) + "\n")
    return int(code) if isinstance(code, int) else 1


# -- table ---------------------------------------------------------------------------------
def records(out: Path, stage: str) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.is_file() else []
    return sorted((r for r in rows if r.get("stage") == stage), key=lambda r: r["step"])


def step_tokens(out: Path, stage: str, steps: list[int]) -> tuple[list[int], list[int]]:
    """(all tokens, loss-mask tokens) of each step, by replaying the trainer's data order."""
    from cuda_agent.train.batch import batch_indices
    from cuda_agent.train.config import load_config
    from cuda_agent.train.models import load_tokenizer
    from cuda_agent.train.rft import load_samples

    config = load_config(data=json.loads((out / f"config-{stage}.json").read_text()))
    samples = load_samples(config, load_tokenizer(config.model.path))
    total, masked = [], []
    for k in steps:
        chosen = [samples[i] for i in batch_indices(len(samples), config.optim.batch_size,
                                                    config.optim.seed, k - 1)]
        total.append(sum(len(s) for s in chosen))
        masked.append(sum(sum(s.loss_mask[1:]) for s in chosen))  # position 0 never scores
    return total, masked


def measure(out: Path, stage: str, label: str) -> dict[str, Any]:
    rows = records(out, stage)
    row: dict[str, Any] = {"label": label, "stage": stage, "out": str(out), "steps": len(rows)}
    if not rows:
        row["error"] = "no metrics (the run failed or timed out before its first step)"
        return row
    steps = [r["step"] for r in rows]
    total, masked = step_tokens(out, stage, steps)
    times = [r["time_s"] for r in rows]
    row.update(first_step_s=times[0], tokens_per_step=sum(total) / len(total),
               loss_tokens_per_step=sum(masked) / len(masked),
               final_loss=rows[-1].get("loss"),
               trainer_tokens_per_s=sum(r.get("tokens_per_s", 0.0) for r in rows[1:])
               / (len(rows) - 1) if len(rows) >= 2 else None)
    if len(rows) >= 2:  # steady state: steps 2..N
        span = times[-1] - times[0]
        row.update(s_per_step=span / (len(rows) - 1), tokens_per_s=sum(total[1:]) / span,
                   loss_tokens_per_s=sum(masked[1:]) / span)
    peak = out / f"peak-{stage}.json"
    if peak.is_file():
        data = json.loads(peak.read_text())
        row.update({k: data.get(k) for k in ("device", "max_allocated_gib", "max_reserved_gib",
                                             "wall_s")})
    config = json.loads((out / f"config-{stage}.json").read_text())
    lora = config["model"]["lora"]
    row["mode"] = f"LoRA r{lora['r']}" if lora else "full"
    row["batch"] = f"{config['optim']['batch_size']}x{config['optim']['micro_batch_size']}"
    return row


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| run | weights | batch (samples x micro) | steps | tokens/step | s/step | "
            "tokens/s | loss tokens/s | trainer tokens/s | 1st step s | peak alloc GiB | "
            "peak reserved GiB | wall s | final loss |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['error']} |")
            continue
        lines.append(
            f"| {r['label']} | {r['mode']} | {r['batch']} | {r['steps']} | "
            f"{fmt(r['tokens_per_step'])} | {fmt(r.get('s_per_step'), 2)} | "
            f"{fmt(r.get('tokens_per_s'))} | {fmt(r.get('loss_tokens_per_s'))} | "
            f"{fmt(r.get('trainer_tokens_per_s'))} | {fmt(r['first_step_s'], 1)} | "
            f"{fmt(r.get('max_allocated_gib'), 1)} | {fmt(r.get('max_reserved_gib'), 1)} | "
            f"{fmt(r.get('wall_s'), 0)} | {fmt(r.get('final_loss'), 3)} |")
    return "\n".join(lines)


def make_table(specs: list[str], md: Path | None, js: Path | None, title: str) -> None:
    rows = []
    for spec in specs:
        out, stage, label = spec.split(":", 2)
        try:
            rows.append(measure(Path(out), stage, label))
        except Exception as exc:  # a run that failed early: say so in its row
            rows.append({"label": label, "stage": stage, "error": f"{type(exc).__name__}: "
                         f"{str(exc)[:160]}"})
    device = next((r["device"] for r in rows if r.get("device")), "no GPU (CPU run)")
    text = (f"### {title}\n\ndevice: {device}\n\n{table(rows)}\n\n"
            "tokens/s: all sequence tokens of steps 2..N / their wall time (from the "
            "trainer's metrics.jsonl; model loading excluded); loss tokens: the assistant's "
            "(trained) tokens; trainer tokens/s: mean of the trainer's own per-step figure; "
            "peak: torch.cuda.max_memory_{allocated,reserved} of the whole process.\n")
    print(text)
    if md:
        md.write_text(text)
    if js:
        js.write_text(json.dumps(rows, indent=1) + "\n")


# -- e2e -----------------------------------------------------------------------------------
def episodes(run: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((run / "rollouts").glob("step-*/*/trajectory.jsonl")):
        end: dict[str, Any] = {}
        for line in path.read_text().splitlines():
            if line.strip() and '"episode_end"' in line:
                end = json.loads(line).get("result") or {}
        final = end.get("final") or {}
        why = end.get("error") or "; ".join(final.get("reasons") or [])
        found.append({"step": path.parent.parent.name, "task": end.get("task"),
                      "reward": end.get("reward"), "stop": end.get("stop_reason"),
                      "judge_device": final.get("device"), "why": str(why)[:140]})
    return found


def e2e(run: Path, dest: Path, expert: Path | None) -> None:
    from cuda_agent.train.run import plot_curves

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()
            if x.strip()] if (run / "metrics.jsonl").is_file() else []
    dest.mkdir(parents=True, exist_ok=True)
    lines = ["### End-to-end: expert (CUDA replay) -> RFT -> value -> PPO", ""]
    if expert is not None:
        end = {}
        traj = expert / "trajectory.jsonl"
        for line in (traj.read_text().splitlines() if traj.is_file() else []):
            if '"episode_end"' in line:
                end = json.loads(line).get("result") or {}
        final = end.get("final") or {}
        lines.append(f"expert: reward {end.get('reward')}, device {final.get('device')}, "
                     f"speed-up vs eager {final.get('speedup_vs_eager')}, vs compile "
                     f"{final.get('speedup_vs_compile')}, stop {end.get('stop_reason')}")
        lines.append("")
    keys = {"rft": ("loss", "grad_norm", "tokens_per_s"),
            "value": ("loss", "explained_variance", "reward"),
            "ppo": ("reward", "explained_variance", "loss", "value_loss", "kl",
                    "clip_fraction", "episodes", "rollout_s")}
    for stage, names in keys.items():
        got = [r for r in rows if r.get("stage") == stage]
        lines.append(f"#### {stage}: {len(got)} steps")
        if got:
            lines.append("| step | time_s | " + " | ".join(names) + " |")
            lines.append("|" + "---|" * (len(names) + 2))
            for r in got:
                lines.append(f"| {r['step']} | {r['time_s']:.1f} | " + " | ".join(
                    f"{r[n]:.4g}" if isinstance(r.get(n), (int, float)) else "-"
                    for n in names) + " |")
        lines.append("")
        # the trainer draws the curves at a stage's end; redraw from metrics.jsonl so a
        # stage cut short by its timeout still has them
        for png in plot_curves(rows, dest, stage):
            if png.name == "value-reward.png":  # constant (the trajectories' rewards)
                png.unlink()
    eps = episodes(run)
    lines.append(f"#### PPO episodes (real judge): {len(eps)}")
    if eps:
        lines.append("| step | task | reward | stop | judge device | why |")
        lines.append("|---|---|---|---|---|---|")
        for e in eps:
            lines.append(f"| {e['step']} | {e['task']} | {e['reward']} | {e['stop']} | "
                         f"{e['judge_device']} | {e['why'].replace('|', '/')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (dest / "e2e_summary.md").write_text(text)
    if (run / "metrics.jsonl").is_file():
        shutil.copy(run / "metrics.jsonl", dest / "metrics.jsonl")
    print("files:", ", ".join(sorted(p.name for p in dest.iterdir() if p.is_file())))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "wrap":
        argv = sys.argv[3:]
        raise SystemExit(wrap(Path(sys.argv[2]), argv[1:] if argv[:1] == ["--"] else argv))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table")
    t.add_argument("runs", nargs="+", help="OUT:STAGE:LABEL")
    t.add_argument("--md", type=Path)
    t.add_argument("--json", type=Path)
    t.add_argument("--title", default="Trainer throughput")
    e = sub.add_parser("e2e")
    e.add_argument("run", type=Path)
    e.add_argument("dest", type=Path)
    e.add_argument("--expert", type=Path)
    args = parser.parse_args()
    if args.command == "table":
        make_table(args.runs, args.md, args.json, args.title)
    else:
        e2e(args.run, args.dest, args.expert)


if __name__ == "__main__":
    main()
