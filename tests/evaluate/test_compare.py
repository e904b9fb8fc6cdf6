"""``eval compare``: correctness and regressions first, geomeans over named sets, and a run
that lost correct answers never reads as a gain (``evaluate.compare``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.evaluate import compute_table
from cuda_agent.evaluate.compare import compare_runs, comparison_markdown
from cuda_agent.evaluate.metrics import TaskRecord, table_to_dict


def R(task: str, correct: bool, reward: int, speedup: float | None = None,
      reason: str = "") -> TaskRecord:
    """A level-1 task's record; ``speedup`` over eager and torch.compile alike."""
    runtime = None if speedup is None else 1.0
    base = None if speedup is None else speedup
    return TaskRecord(task, 1, correct, reward, runtime, base, base, reason)


# run A: ten correct answers, three fast and seven modest; run B lost the seven modest ones
# and the fast ones got slower: its geomean over its correct answers rises from 7x to 65x
RUN_A = [R(f"fast{k}", True, 3, 16.0 * 16) for k in range(3)] + \
        [R(f"slow{k}", True, 2, 1.5) for k in range(7)]
RUN_B = [R(f"fast{k}", True, 3, 65.0) for k in range(3)] + \
        [R(f"slow{k}", False, -1, reason="outputs differ") for k in range(7)]


def test_a_run_that_lost_correct_answers_is_never_a_gain():
    cmp = compare_runs(RUN_A, RUN_B)
    eager = dict(cmp.geomeans)["eager"]
    assert eager.correct_b > eager.correct_a  # the misleading figure, still shown
    assert cmp.verdict.startswith("not a gain: B lost 7 correct answer(s) (10 -> 3 of 10")
    assert [c.key for c in cmp.lost] == [f"L1/slow{k}" for k in range(7)]
    assert cmp.lost[0].reason_b == "outputs differ" and not cmp.gained
    # over all tasks a wrong answer is 1x; over the tasks correct in both the set is fixed
    assert eager.all_b < eager.all_a and eager.both == 3
    assert round(eager.both_a) == 256 and round(eager.both_b) == 65


def test_losing_answers_slower_than_eager_raises_every_changing_geomean_but_is_no_gain():
    """Answers slower than eager lost: the geomean over all tasks (a wrong one as 1x) rises
    too, so the verdict, not a geomean, says what happened."""
    slower = [*RUN_A[:3], *(R(f"slow{k}", True, 1, 0.5) for k in range(7))]
    cmp = compare_runs(slower, RUN_B)
    eager = dict(cmp.geomeans)["eager"]
    assert eager.correct_b > eager.correct_a and eager.all_b > eager.all_a
    assert cmp.verdict.startswith("not a gain: B lost 7 correct answer(s)")


def test_the_report_reads_verdict_pass_rate_and_regressions_first():
    text = comparison_markdown(compare_runs(RUN_A, RUN_B), "old", "new")
    order = [text.index(s) for s in ("not a gain", "pass rate over the 10 tasks of both runs: "
                                     "10 -> 3 correct (100.0% -> 30.0%, -70.0 points)",
                                     "Regressions: correct in A, wrong in B (7)",
                                     "| L1/slow0 | 2 -> -1 | outputs differ |",
                                     "Geomean speed-ups")]
    assert order == sorted(order), text
    assert "all tasks, a wrong or untimed answer as 1x" in text
    assert "(3 tasks) |" in text


def test_rewards_lower_or_higher_without_a_lost_answer():
    a = [R("x", True, 3, 2.0), R("y", True, 2, 1.2), R("z", False, -1)]
    dropped = compare_runs(a, [R("x", True, 2, 1.1), R("y", True, 2, 1.2), R("z", False, -1)])
    assert dropped.verdict == "not a gain: 1 reward(s) lower, none higher"
    assert [(c.key, c.reward_a, c.reward_b) for c in dropped.dropped] == [("L1/x", 3, 2)]
    gained = compare_runs(a, [R("x", True, 3, 2.0), R("y", True, 2, 1.2), R("z", True, 1, 0.9)])
    assert gained.verdict == "a gain: no correct answer lost, 1 newly correct"
    mixed = compare_runs(a, [R("x", True, 2, 1.1), R("y", True, 2, 1.2), R("z", True, 1, 0.9)])
    assert mixed.verdict.startswith("mixed: no correct answer lost, 1 newly correct")
    same = compare_runs(a, a)
    assert same.verdict == "no change in correctness or rewards"


def test_tasks_in_one_run_only_are_named_not_compared():
    cmp = compare_runs([R("x", True, 2, 2.0), R("old", True, 3, 9.0)],
                       [R("x", True, 2, 2.0), R("new", False, -1)])
    assert (cmp.tasks, cmp.only_a, cmp.only_b) == (1, ("L1/old",), ("L1/new",))
    assert "only in A (not compared): 1: L1/old" in comparison_markdown(cmp)


def test_the_cli_prints_the_comparison_before_the_tables(tmp_path: Path):
    for name, records in (("a", RUN_A), ("b", RUN_B)):
        out = tmp_path / name
        out.mkdir()
        rows = [{"key": f"L1/{r.task}", "task": r.task, "level": 1, "reason": r.reason,
                 "result": {"task": r.task, "correct": r.correct, "reward": r.reward,
                            "runtime_ms": r.runtime_ms, "eager_ms": r.eager_ms,
                            "compile_ms": r.compile_ms, "reasons": [r.reason]}}
                for r in records]
        (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (out / "metrics.json").write_text(json.dumps(table_to_dict(compute_table(records))))
    shown = CliRunner().invoke(app, ["eval", "compare", str(tmp_path / "a"),
                                     str(tmp_path / "b")])
    assert shown.exit_code == 0, shown.output
    assert shown.output.index("not a gain: B lost 7") < shown.output.index("Per level")
    missing = CliRunner().invoke(app, ["eval", "compare", str(tmp_path / "a"),
                                       str(tmp_path / "none")])
    assert missing.exit_code != 0 and "metrics.json: not found" in missing.output
