"""Reports of ``pool_load.py``: one case's Markdown, the summary of the cases in an output
folder (``pool_load.py --summarize OUT``) and the targets they are held to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOP_PHASES = ("build", "reference", "collect_reference", "baselines", "candidate",
              "collect_candidate", "compare", "compare_timed")
STAGES = ("reference.start", "reference.preloaded", "reference.forward", "reference.timing",
          "candidate.start", "candidate.preloaded", "candidate.forward", "candidate.timing")
GPU_PHASES = ("workers_start", "gpu_wait", "gpu_held", "gpu_exclusive")
"""The GPU's turn per job (``gpu_lock``): they overlap the phases above, so they stand apart."""
BUSY_TARGET = 0.90
SCALING_TARGETS = {2: 1.8, 4: 3.5}
"""Judgements per minute on N GPUs over one GPU's, at least (issue 34's goal); other N:
0.9 x N."""
RATE_TARGET = 1500.0
"""Judgements per GPU-hour with three workers per GPU (issue 31)."""


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def case_markdown(r: dict[str, Any]) -> str:
    if "window_s" not in r:
        return f"### {r['label']}\n\nnot measured: {r.get('error', 'unknown error')}\n"
    checks = r["checks"].items()
    lines = [f"### {r['label']}: {r['workers']} worker(s) ({r['device']}), {r['jobs']} jobs, "
             f"mix {', '.join(r['mix'])}, fresh builds {r['fresh_share']:.0%}", "",
             "| metric | value |", "|---|---|",
             f"| window (first submit to last result) | {r['window_s']:.1f} s |",
             f"| queue non-empty for | {r['queue_drained_after_s']:.1f} s |",
             f"| jobs/min | {r['jobs_per_min']:.1f} |",
             f"| jobs/min per {'GPU' if r['gpus'] else 'worker'} | "
             f"{r['jobs_per_min_per_gpu']:.1f} |",
             f"| jobs per {'GPU' if r['gpus'] else 'worker'}-hour | "
             f"{r.get('jobs_per_gpu_hour', '-')}"
             + (f" ({r['jobs_per_gpu_hour_fed']} while jobs were kept queued, "
                f"{r['fed_s']:.0f} s)" if r.get("jobs_per_gpu_hour_fed") else "") + " |",
             f"| warm-up (not measured) | {r.get('warmup_s', 0)} s"
             f"{', calibration ' + str(r['calibration_s']) + ' s' if 'calibration_s' in r else ''}"
             " |",
             f"| verdicts | {json.dumps(r['verdicts'])} |",
             f"| checks | {', '.join(k + ('=ok' if v else '=FAIL') for k, v in checks)} |",
             f"| worker occupancy (held a job / window) | "
             f"{', '.join(f'{p} {pct(v)}' for p, v in r['worker_occupancy'].items())} |",
             f"| mean time a worker held a job | {r['held_s_mean']:.2f} s |"]
    if r.get("turn"):
        lines += ["", "The GPU's turn over the window (judges' log; shares of the window): "
                  "exclusive = a judge's timed phases, shared only = untimed GPU work of one "
                  "judge or more, timing = a worker's timed calls running, depth = judges "
                  "holding it shared at once, on average:", "",
                  "| lock | held | exclusive | shared only | timing | depth |",
                  "|---|---|---|---|---|---|"]
        for lock, t in r["turn"].items():
            lines.append(f"| {Path(lock).name} | {pct(t['held'])} | {pct(t['exclusive'])} | "
                         f"{pct(t['shared_only'])} | {pct(t['timing'])} | "
                         f"{t['shared_depth']} |")
        held = [p["gpu_exclusive"] for p in r["phases"].values() if p.get("gpu_exclusive")]
        if held:
            per_job = sum(held) / len(held)
            lines += ["", f"A job held the turn exclusive {per_job:.2f} s on average: at most "
                      f"{3600 / per_job:.0f} judgements per GPU-hour while timing stays "
                      "exclusive."]
    if r["gpus"]:
        lines += ["", f"GPU utilisation ({r['util_source']}; utilization.gpu = share of the "
                  "sample period in which any kernel ran, not SM occupancy):", "",
                  "| GPU | window | samples | mean util | samples with util > 0 |",
                  "|---|---|---|---|---|"]
        for name, key in (("queue non-empty", "util_while_queued"),
                          ("jobs queued or running", "util_while_running")):
            for g, u in r[key].items():
                lines.append(f"| {g} | {name} | {u['samples']} | {pct(u['mean_util'])} | "
                             f"{pct(u['busy_share'])} |")
    keys = [k for k in ("judge_s", *TOP_PHASES, "other", *GPU_PHASES, *STAGES)
            if any(r["phases"][c].get(k) for c in ("fresh", "cached"))]
    lines += ["", "Judge phases, mean seconds per job (build, compare and the worker "
              "processes' start-up run on the CPU; reference and candidate are the GPU "
              "parts; `x.start` = a worker's interpreter start-up, `x.preloaded` = it "
              "waited for its job):", "",
              "| phase | fresh build | cached build |", "|---|---|---|"]
    for k in keys:
        cells = [str(r["phases"][c].get(k, "")) for c in ("fresh", "cached")]
        lines.append(f"| {k} | {cells[0]} | {cells[1]} |")
    for c in ("fresh", "cached"):
        p = r["phases"][c]
        if p and p.get("judge_s"):
            gpu_side = sum(p[k] for k in ("reference", "candidate", "compare", "compare_timed"))
            lines.append(f"\n{c} ({p['jobs']} jobs): build {p['build'] / p['judge_s']:.0%} of "
                         f"the judge's time per job; the phases that use the GPU (reference, "
                         f"candidate, compare) {gpu_side / p['judge_s']:.0%}, of which worker "
                         f"start-up waits and the candidate's load are CPU time")
    if r["failures"]:
        lines += ["", "Failures:", *(f"- {f}" for f in r["failures"])]
    return "\n".join(lines) + "\n"


def summary_markdown(cases: list[dict[str, Any]]) -> str:
    lines = ["## Judge pool load", "",
             "| case | workers | jobs | window s | jobs/min | jobs/GPU-hour (while fed) | "
             "turn held / exclusive / timing | GPU util (queue non-empty) | util > 0 (queue "
             "non-empty) | all correct, none lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cases:
        if "window_s" not in r:
            lines.append(f"| {r['label']} | {r.get('workers')} | - | - | - | - | - | - | - | "
                         f"FAILED: {r.get('error', '')[:200]} |")
            continue
        util = r["util_while_queued"]
        mean = ", ".join(pct(u["mean_util"]) for u in util.values()) or "n/a"
        busy = ", ".join(pct(u["busy_share"]) for u in util.values()) or "n/a"
        turn = "; ".join(f"{pct(t['held'])} / {pct(t['exclusive'])} / {pct(t['timing'])}"
                         for t in (r.get("turn") or {}).values()) or "-"
        fed = f" ({r['jobs_per_gpu_hour_fed']})" if r.get("jobs_per_gpu_hour_fed") else ""
        lines.append(f"| {r['label']} | {r['workers']} | {r['jobs']} | {r['window_s']:.1f} | "
                     f"{r['jobs_per_min']:.1f} | {r.get('jobs_per_gpu_hour', '-')}{fed} | "
                     f"{turn} | {mean} | {busy} | {'yes' if r['ok'] else 'NO'} |")
    done = [r for r in cases if "window_s" in r and r["gpus"]]
    more = sorted((r for r in done if len(r["gpus"]) > 1), key=lambda r: len(r["gpus"]))
    lines.append("")
    for r in done:
        worst = min((u["mean_util"] or 0.0) for u in r["util_while_queued"].values())
        lines.append(f"- {r['label']}: lowest mean GPU utilisation while the queue was "
                     f"non-empty {worst:.0%} (target {BUSY_TARGET:.0%}: "
                     f"{'met' if worst >= BUSY_TARGET else 'NOT met'})")
        for lock, t in (r.get("turn") or {}).items():
            lines.append(f"- {r['label']}: {Path(lock).name}'s turn held {t['held']:.0%} of "
                         f"the window, {t['exclusive']:.0%} exclusive (busy target "
                         f"{BUSY_TARGET:.0%} held: "
                         f"{'met' if t['held'] >= BUSY_TARGET else 'NOT met'})")
        if r.get("jobs_per_gpu") == 3 and r.get("jobs_per_gpu_hour") is not None:
            rate = r["jobs_per_gpu_hour"]
            lines.append(f"- {r['label']}: {rate:.0f} judgements per GPU-hour with 3 workers "
                         f"per GPU (target {RATE_TARGET:.0f}: "
                         f"{'met' if rate >= RATE_TARGET else 'NOT met'})")
    rates = {r["jobs_per_gpu"]: r for r in done if len(r["gpus"]) == 1
             and r.get("jobs_per_gpu_hour")}
    if 1 in rates and len(rates) > 1:
        base = rates[1]["jobs_per_gpu_hour"]
        lines += [f"- {n} workers on one GPU against 1: "
                  f"{r['jobs_per_gpu_hour'] / base:.2f}x judgements per GPU-hour"
                  for n, r in sorted(rates.items()) if n != 1]
    for many in more:
        # against one GPU with the same backend and workers per GPU
        one = next((r for r in done if len(r["gpus"]) == 1
                    and r.get("backend", "local") == many.get("backend", "local")
                    and r.get("jobs_per_gpu") == many.get("jobs_per_gpu")), None)
        if one is None:
            continue
        n = len(many["gpus"])
        ratio = many["jobs_per_min"] / one["jobs_per_min"]
        target = SCALING_TARGETS.get(n, 0.9 * n)
        cut = [r["label"] for r in (one, many) if r.get("cut_by_budget")]
        verdict = ("NOT valid: jobs cut by the budget in " + ", ".join(cut) if cut else
                   "met" if ratio >= target else "NOT met")
        lines.append(f"- scaling {n} GPUs / 1 GPU: {ratio:.2f}x judgements per minute "
                     f"(target {target:g}x: {verdict}; {many['jobs']} jobs, every one "
                     f"{'back once' if many.get('ok') else 'NOT back correct and once'})")
    return "\n".join(lines) + "\n"


SUMMARY_KEYS = ("label", "gpus", "workers", "jobs_per_gpu", "jobs", "completed",
                "cut_by_budget", "window_s", "jobs_per_min", "jobs_per_min_per_gpu",
                "jobs_per_gpu_hour", "jobs_per_gpu_hour_fed", "turn", "ok",
                "util_while_queued", "error")


def summarize(out: Path) -> int:
    cases = [json.loads(p.read_text()) for p in sorted(out.glob("pool_load_*.json"))]
    cases.sort(key=lambda r: (len(r.get("gpus", [])), r.get("jobs_per_gpu", 1)))
    # a case carried from an earlier call's summary has no details to print
    text = summary_markdown(cases) + "\n" + "\n".join(case_markdown(r) for r in cases
                                                        if "phases" in r)
    (out / "pool_load.md").write_text(text)
    summary = {"cases": {r["label"]: {k: r.get(k) for k in SUMMARY_KEYS} for r in cases}}
    by_gpus = {len(r.get("gpus", [])): r for r in cases if "window_s" in r}  # the last case
    for n in sorted(by_gpus):
        if n > 1 and 1 in by_gpus:
            summary[f"scaling_{n}_over_1"] = round(by_gpus[n]["jobs_per_min"]
                                                   / by_gpus[1]["jobs_per_min"], 3)
    (out / "pool_load.json").write_text(json.dumps(summary, indent=2))
    print(text)
    return 0 if cases and all(r.get("ok") for r in cases) else 1
