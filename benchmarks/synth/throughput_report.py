"""Throughput of one `cuda-agent synth` session, from what it wrote (used by device_throughput.sh).

    python benchmarks/synth/throughput_report.py RUN_DIR --start EPOCH --end EPOCH \\
        --workers 14 --device cuda --label "NVIDIA H100 80GB HBM3" [--warmup-s 60]

Reads RUN_DIR/run/verdicts.jsonl (one line per finished candidate, with the time it was
recorded) and RUN_DIR/jsonl/train.jsonl (accepted rows), counts only this session's
candidates (recorded at or after START; a resumed folder's earlier ones are reported apart),
and prints a markdown table: candidates, accepted, rejections per reason, accepted tasks per
hour over the whole session and after the first WARMUP seconds (start-up excluded), the
projected hours for TARGET tasks, and eager runtimes. A run that was killed at its time limit
has no summary, so this also writes it (the pipeline's own ``write_summary``: summary.json,
summary.md, runtime_hist.png, the data-set card card.md with card/*.png) and
data/train.parquet, and checks the parquet row count.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from cuda_agent.synth.dataset import CONFIG, PARQUET, ROWS, VERDICTS, read_jsonl


def reason_code(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


def measure(run: Path, start: float, end: float, warmup_s: float, target: int
            ) -> dict[str, Any]:
    verdicts = read_jsonl(run / VERDICTS)
    rows = read_jsonl(run / ROWS)
    session = [v for v in verdicts if v.get("time", start) >= start]
    earlier_ids = {v["task_id"] for v in verdicts if v.get("time", start) < start}
    judged = {v["task_id"] for v in verdicts}
    accepted_at = {v["task_id"]: v.get("time", end) for v in session if v["accepted"]}
    # a row whose verdict was not written yet (killed between the two lines) counts at END
    orphans = [r for r in rows if r["task_id"] not in judged]
    for row in orphans:
        accepted_at[row["task_id"]] = end
    session_rows = [r for r in rows if r["task_id"] in accepted_at]
    rejected = [v for v in session if not v["accepted"]]
    first = Counter(reason_code(v["reasons"][0]) for v in rejected if v["reasons"])
    wall = max(end - start, 1e-9)
    steady_s = end - (start + warmup_s)
    steady_acc = sum(1 for t in accepted_at.values() if t >= start + warmup_s)
    steady_cand = sum(1 for v in session if v["time"] >= start + warmup_s) + len(orphans)
    times = sorted(r["eager_ms"] for r in session_rows if r.get("eager_ms"))
    seconds = [v["seconds"] for v in session if v.get("seconds") is not None]
    per_hour = len(accepted_at) / wall * 3600
    steady = steady_acc / steady_s * 3600 if steady_s >= 30 else None
    stamps = sorted(accepted_at.values())
    return {
        "wall_s": round(wall, 1), "candidates": len(session) + len(orphans),
        "accepted": len(accepted_at), "rejected": len(rejected),
        "rows_without_verdict": len(orphans), "earlier_candidates": len(earlier_ids),
        "earlier_rows": len([r for r in rows if r["task_id"] in earlier_ids]),
        "rows_in_jsonl": len(rows),
        "first_rejection_reason": dict(first.most_common()),
        "rejection_reasons": dict(Counter(reason_code(r) for v in rejected
                                          for r in v["reasons"]).most_common()),
        "accepted_per_hour": round(per_hour, 1),
        "candidates_per_hour": round((len(session) + len(orphans)) / wall * 3600, 1),
        "warmup_s": warmup_s,
        "steady_accepted": steady_acc, "steady_candidates": steady_cand,
        "steady_s": round(max(steady_s, 0), 1),
        "steady_accepted_per_hour": round(steady, 1) if steady is not None else None,
        "first_accept_s": round(stamps[0] - start, 1) if stamps else None,
        "target": target,
        "projected_hours": round(target / per_hour, 2) if per_hour else None,
        "projected_hours_steady": round(target / steady, 2) if steady else None,
        "eager_ms_p50": round(statistics.median(times), 3) if times else None,
        "eager_ms_p10_p90": (round(times[int(0.1 * len(times))], 3),
                             round(times[min(len(times) - 1, int(0.9 * len(times)))], 3))
        if times else None,
        "candidate_s_mean": round(statistics.fmean(seconds), 2) if seconds else None,
    }


def write_outputs(run: Path, m: dict[str, Any], start: float) -> dict[str, Any]:
    """The pipeline's summary files and parquet (a killed run has none); parquet rows."""
    from cuda_agent.synth.config import SynthConfig
    from cuda_agent.synth.dataset import SESSIONS, export_parquet
    from cuda_agent.synth.filters import find_kernelbench
    from cuda_agent.synth.report import write_summary

    done: dict[str, Any] = {}
    summary = run / "summary.json"
    finished = summary.exists() and summary.stat().st_mtime >= start  # pipeline wrote it
    try:
        import pyarrow.parquet as pq

        if not finished:
            export_parquet(run)
        done["parquet_rows"] = pq.read_metadata(run / PARQUET).num_rows
    except Exception as exc:  # noqa: BLE001 - reported, the table still prints
        done["parquet_error"] = f"{type(exc).__name__}: {exc}"
    try:
        if not finished:
            config = SynthConfig.model_validate(json.loads((run / CONFIG).read_text()))
            kb = find_kernelbench(config.kernelbench)
            with (run / SESSIONS).open("a") as handle:  # the stopped session never wrote it
                handle.write(json.dumps({
                    "start": start, "elapsed_s": m["wall_s"], "accepted": m["accepted"],
                    "candidates": m["candidates"], "workers": config.workers,
                    "kernelbench": str(kb) if kb else None}) + "\n")
            write_summary(run, config)
            done["summary"] = "written by this report (run was stopped)"
        else:
            done["summary"] = "written by the pipeline (run finished)"
        written = json.loads(summary.read_text())
        done["summary_accepted"] = written["accepted"]
        done["compute_heavy_share"] = written.get("compute_heavy_share")
        done["op_classes"] = written.get("op_classes")
        done["kernelbench"] = written.get("kernelbench")
        done["card"] = str(run / "card.md") if (run / "card.md").is_file() else "missing"
    except Exception as exc:  # noqa: BLE001
        done["summary_error"] = f"{type(exc).__name__}: {exc}"
    return done


def markdown(m: dict[str, Any], args: argparse.Namespace, files: dict[str, Any]) -> str:
    top = ", ".join(f"{k} {v}" for k, v in list(m["first_rejection_reason"].items())[:6])
    rest = len(m["first_rejection_reason"]) - 6
    top += f", +{rest} more" if rest > 0 else ""
    steady = (f"{m['steady_accepted_per_hour']} ({m['steady_accepted']} in "
              f"{m['steady_s']} s after the first {m['warmup_s']:.0f} s)"
              if m["steady_accepted_per_hour"] is not None else "n/a (run too short)")
    goal = m["steady_accepted_per_hour"] or m["accepted_per_hour"]
    rows = [
        ("device", args.label or args.device),
        ("workers", args.workers),
        ("settings", args.settings or "-"),
        ("stopped by", args.status),
        ("wall seconds", m["wall_s"]),
        ("candidates tried", m["candidates"]),
        ("accepted", f"{m['accepted']} ({m['accepted'] / m['candidates']:.0%})"
         if m["candidates"] else 0),
        ("rejected (first reason, top)", f"{m['rejected']}: {top}" if m["rejected"] else 0),
        ("accepted/hour, whole run", m["accepted_per_hour"]),
        ("accepted/hour, steady", steady),
        ("candidates/hour, whole run", m["candidates_per_hour"]),
        ("first accepted task after (s)", m["first_accept_s"]),
        (f"projected hours for {m['target']:,} (whole / steady)",
         f"{m['projected_hours']} / {m['projected_hours_steady']}"),
        (f"meets {args.goal:,}/hour", "yes" if goal >= args.goal else "no"),
        ("eager ms median (p10, p90)", f"{m['eager_ms_p50']} {m['eager_ms_p10_p90']}"),
        ("mean seconds per candidate (one worker)", m["candidate_s_mean"]),
        ("rows written: jsonl / parquet / summary",
         f"{m['rows_in_jsonl']}"
         f" / {files.get('parquet_rows', files.get('parquet_error', '-'))}"
         f" / {files.get('summary_accepted', files.get('summary_error', '-'))}"),
    ]
    if "card" in files:
        classes = ", ".join(f"{k} {v:.0%}" for k, v in (files["op_classes"] or {}).items())
        rows += [("compute-heavy share (whole set)", files["compute_heavy_share"]),
                 ("op classes (share of operators)", classes or "-"),
                 ("KernelBench decontamination", files["kernelbench"]),
                 ("data-set card", files["card"])]
    if m["earlier_candidates"]:
        rows.append(("earlier session (not counted)",
                     f"{m['earlier_candidates']} candidates, {m['earlier_rows']} rows"))
    if m["rows_without_verdict"]:
        rows.append(("rows without a verdict (killed between)", m["rows_without_verdict"]))
    lines = ["| synth throughput | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="The synth --out folder.")
    parser.add_argument("--start", type=float, required=True, help="Session start (epoch s).")
    parser.add_argument("--end", type=float, required=True, help="Session end (epoch s).")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--label", default="", help="Device name for the table.")
    parser.add_argument("--status", default="?", help="How the run ended (for the table).")
    parser.add_argument("--settings", default="", help="Run settings (for the table).")
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--target", type=int, default=6000)
    parser.add_argument("--goal", type=int, default=2000, help="Accepted tasks/hour wanted.")
    parser.add_argument("--no-summary", action="store_true",
                        help="Do not write summary/parquet files for a stopped run.")
    parser.add_argument("--out", type=Path, help="Write the table (.md) and numbers (.json).")
    args = parser.parse_args()
    m = measure(args.run, args.start, args.end, args.warmup_s, args.target)
    files = {} if args.no_summary else write_outputs(args.run, m, args.start)
    table = markdown(m, args, files)
    print(table)
    print("rejections, every reason:", json.dumps(m["rejection_reasons"]))
    if args.out:
        args.out.with_suffix(".md").write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps(
            {**m, **files, "device": args.device, "label": args.label, "workers": args.workers,
             "status": args.status, "settings": args.settings}, indent=1))


if __name__ == "__main__":
    main()
