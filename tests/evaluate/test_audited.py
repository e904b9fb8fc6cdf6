"""Metrics without the problems a task audit rejected, against hand-computed figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.evaluate import EvalConfig, run_eval
from cuda_agent.evaluate.audited import load_rejected
from cuda_agent.execution import PoolConfig
from cuda_agent.judge import JudgeConfig
from tests.evaluate.test_run import RELU

# task: (level, correct, reward, runtime, eager, compile); c and d are rejected by the audit
RESULTS = {"a": (1, True, 3, 1.0, 2.0, 4.0), "b": (1, True, 1, 2.0, 1.0, 1.0),
           "c": (1, False, -1, None, None, None), "d": (1, True, 3, 1.0, 8.0, 8.0),
           "e": (2, True, 2, 1.0, 3.0, 0.5)}
AUDIT = [("a", 1, True, []), ("b", 1, True, []),
         ("c", 1, False, ["constant_output: the output does not depend on the inputs"]),
         ("d", 1, False, ["not_duplicate: same normalised structure as L1/a"]),
         ("e", 2, True, []), ("z", 3, False, ["too_fast: 0.001 ms"])]


def _row(name: str, level: int | None, correct: bool, reward: int, t, e, c) -> dict:
    result = {"task": name, "correct": correct, "reward": reward, "runtime_ms": t,
              "eager_ms": e, "compile_ms": c, "reasons": []}
    key = f"L{level}/{name}" if level is not None else name
    return {"key": key, "task": name, "level": level, "reason": "", "result": result}


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    run, audit = tmp_path / "run", tmp_path / "audit"
    run.mkdir()
    audit.mkdir()
    _write(run / "results.jsonl", [_row(n, *v) for n, v in RESULTS.items()])
    _write(audit / "audit.jsonl", [{"level": lv, "problem_id": i, "name": n, "accepted": ok,
                                    "reasons": why} for i, (n, lv, ok, why) in enumerate(AUDIT)])
    return run, audit


def test_report_recomputes_without_rejected(folders: tuple[Path, Path]):
    run, audit = folders
    assert set(load_rejected(audit)) == {"L1/c", "L1/d", "L3/z"}
    shown = CliRunner().invoke(app, ["eval", "report", str(run), "--audit", str(audit)])
    assert shown.exit_code == 0, shown.output
    data = json.loads((run / "metrics_audited.json").read_text())
    every, kept = data["all"], data["without_rejected"]
    level1 = every["levels"][0]
    assert (level1["tasks"], level1["pass_rate"], level1["faster_vs_eager"]) == (4, 0.75, 0.5)
    assert level1["geomean_vs_eager"] == pytest.approx(2.0)            # (2 * 0.5 * 8) ** (1/3)
    assert every["overall"]["geomean_vs_eager"] == pytest.approx(24 ** 0.25)
    kept1, kept_all = kept["levels"][0], kept["overall"]
    assert (kept1["tasks"], kept1["pass_rate"], kept1["faster_vs_eager"]) == (2, 1.0, 0.5)
    assert kept1["geomean_vs_eager"] == pytest.approx(1.0)             # (2 * 0.5) ** (1/2)
    assert kept1["geomean_vs_compile"] == pytest.approx(2 ** 0.5)      # (4 * 0.5) ** (1/2)
    assert kept_all["tasks"] == 3 and kept_all["faster_vs_compile"] == pytest.approx(1 / 3)
    assert kept_all["geomean_vs_eager"] == pytest.approx(math.cbrt(3.0))
    assert dict(kept_all["rewards"])[3] == 1 and dict(every["overall"]["rewards"])[3] == 2
    assert [x["task"] for x in data["excluded"]] == ["L1/c", "L1/d"]   # z was not evaluated
    assert "| level 1 (2) | 100.0 |" in shown.output and "| level 1 (4) | 75.0 |" in shown.output
    assert "| L1/d | not_duplicate: same normalised structure as L1/a |" in shown.output
    missing = CliRunner().invoke(app, ["eval", "report", str(run), "--audit", str(run)])
    assert missing.exit_code == 2 and "synth audit" in missing.output


def test_eval_run_with_audit_writes_both_tables(tmp_path: Path):
    tasks, answers, out, audit = (tmp_path / n for n in ("tasks", "answers", "out", "audit"))
    for folder in (tasks, answers, out, audit):
        folder.mkdir()
    for name in ("relu", "relu2"):
        (tasks / f"{name}.py").write_text(RELU)
    # every task already has its row: nothing is judged, the metrics are recomputed
    _write(out / "results.jsonl", [_row("relu", None, True, 2, 1.0, 2.0, None),
                                   _row("relu2", None, False, -1, None, None, None)])
    _write(audit / "audit.jsonl", [{"level": None, "name": "relu2", "accepted": False,
                                    "reasons": ["not_duplicate: same as relu"]}])
    config = EvalConfig(pool=PoolConfig(gpus=[], judge=JudgeConfig(device="cpu")), audit=audit)
    table = run_eval(str(tasks), answers, out, config, show_progress=False)
    assert table.overall.pass_rate == 0.5
    data = json.loads((out / "metrics_audited.json").read_text())
    assert data["without_rejected"]["overall"]["pass_rate"] == 1.0
    assert data["excluded"] == [{"task": "relu2", "reasons": "not_duplicate: same as relu"}]
    assert "| relu2 | not_duplicate: same as relu |" in (out / "metrics_audited.md").read_text()
