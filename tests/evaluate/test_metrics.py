"""Metrics against numbers worked out by hand on small synthetic record sets."""

from __future__ import annotations

import json

import pytest

from cuda_agent.evaluate import (
    TaskRecord,
    compare_markdown,
    compute_table,
    record_from_judge,
    table_from_dict,
    to_markdown,
)
from cuda_agent.evaluate.metrics import table_to_dict

R = TaskRecord
RECORDS = [
    # level 1: speed-ups vs eager 2, 1, 1.02; vs compile 1.5, 4, (none)
    R("a", 1, True, 3, runtime_ms=1.0, eager_ms=2.0, compile_ms=1.5),
    R("b", 1, True, 1, runtime_ms=1.0, eager_ms=1.0, compile_ms=4.0),
    R("c", 1, True, 1, runtime_ms=1.0, eager_ms=1.02, compile_ms=None),
    R("d", 1, False, -1),
    # level 2: speed-ups vs eager 3, vs compile 0.8
    R("e", 2, True, 2, runtime_ms=1.0, eager_ms=3.0, compile_ms=0.8),
    R("f", 2, False, -1, reason="no answer"),
]


def test_level_one():
    row = compute_table(RECORDS).levels[0]
    assert (row.name, row.tasks, row.correct) == ("level 1", 4, 3)
    assert row.pass_rate == 0.75
    assert row.faster_vs_eager == 0.25          # a only; c is under eager but not under 0.95x
    assert row.plain_faster_vs_eager == 0.5     # a and c
    assert row.faster_vs_compile == 0.5         # a and b; c has no compile baseline
    assert row.plain_faster_vs_compile == 0.5
    assert row.geomean_vs_eager == pytest.approx(1.268265, abs=1e-6)   # (2*1*1.02)^(1/3)
    assert row.geomean_vs_compile == pytest.approx(2.449490, abs=1e-6)  # sqrt(1.5*4)
    assert row.fast_p_vs_eager == ((0.0, 0.75), (0.5, 0.75), (0.8, 0.75), (1.0, 0.5),
                                   (1.5, 0.25), (2.0, 0.0))
    assert row.fast_p_vs_compile == ((0.0, 0.5), (0.5, 0.5), (0.8, 0.5), (1.0, 0.5),
                                     (1.5, 0.25), (2.0, 0.25))
    assert row.rewards == ((-1, 1), (1, 2), (2, 0), (3, 1))


def test_level_two_and_overall():
    table = compute_table(RECORDS)
    two, overall = table.levels[1], table.overall
    assert (two.pass_rate, two.faster_vs_eager, two.faster_vs_compile) == (0.5, 0.5, 0.0)
    assert (two.geomean_vs_eager, two.geomean_vs_compile) == pytest.approx((3.0, 0.8))
    assert (overall.name, overall.tasks, overall.correct) == ("overall", 6, 4)
    assert overall.pass_rate == pytest.approx(4 / 6)
    assert overall.faster_vs_eager == pytest.approx(2 / 6)        # a, e
    assert overall.plain_faster_vs_eager == 0.5                   # a, c, e
    assert overall.faster_vs_compile == pytest.approx(2 / 6)      # a, b
    assert overall.geomean_vs_eager == pytest.approx(1.572852, abs=1e-6)    # 6.12^(1/4)
    assert overall.geomean_vs_compile == pytest.approx(1.686865, abs=1e-6)  # 4.8^(1/3)
    assert overall.rewards == ((-1, 2), (1, 2), (2, 1), (3, 1))
    assert dict(overall.fast_p_vs_eager)[1.0] == 0.5              # a, c, e


def test_zero_correct_and_missing_baselines():
    records = [R("x", 1, False, -1), R("y", 1, False, -1, runtime_ms=1.0, eager_ms=9.0)]
    row = compute_table(records).overall
    assert (row.pass_rate, row.faster_vs_eager, row.faster_vs_compile) == (0.0, 0.0, 0.0)
    assert (row.geomean_vs_eager, row.geomean_vs_compile) == (None, None)
    assert dict(row.fast_p_vs_eager)[0.0] == 0.0
    untimed = compute_table([R("z", None, True, 1, runtime_ms=1.0, eager_ms=4.0)]).overall
    assert (untimed.faster_vs_eager, untimed.faster_vs_compile) == (1.0, 0.0)
    assert untimed.geomean_vs_eager == pytest.approx(4.0)
    assert untimed.geomean_vs_compile is None


def test_empty_level_is_shown_without_rates():
    table = compute_table(RECORDS, levels=(1, 2, 3))
    three = table.levels[2]
    assert (three.name, three.tasks, three.pass_rate, three.geomean_vs_eager) == (
        "level 3", 0, None, None)
    assert three.rewards == ((-1, 0), (1, 0), (2, 0), (3, 0))
    assert "| level 3 (0) | - | - | - | - | - |" in to_markdown(table)


def test_markdown_and_json_round_trip():
    table = compute_table(RECORDS)
    text = to_markdown(table)
    assert text.splitlines()[0] == ("| | pass | faster vs compile | faster vs eager | "
                                    "geomean vs compile | geomean vs eager |")
    assert "| level 1 (4) | 75.0 | 50.0 | 25.0 | 2.45x | 1.27x |" in text
    assert "| level 2 (2) | 50.0 | 0.0 | 50.0 | 0.80x | 3.00x |" in text
    assert "| overall (6) | 66.7 | 33.3 | 33.3 | 1.69x | 1.57x |" in text
    assert table_from_dict(json.loads(json.dumps(table_to_dict(table)))) == table


def test_compare_shows_both_runs_and_deltas():
    a = compute_table(RECORDS)
    b = compute_table([R("a", 1, True, 3, runtime_ms=1.0, eager_ms=2.0, compile_ms=1.5)])
    text = compare_markdown(a, b, "old", "new")
    assert "| level 1 | 4 -> 1 | 75.0 -> 100.0 (+25.0) |" in text
    assert "| level 2 | 2 -> - | 50.0 -> - |" in text
    assert "1.27x -> 2.00x (+0.73x)" in text


def test_record_from_judge_dict():
    data = {"task": "19_ReLU", "correct": True, "reward": 2, "reasons": ["ok", "fine"],
            "runtime_ms": 0.5, "eager_ms": 1.0, "compile_ms": None, "device": "cpu"}
    record = record_from_judge(data, level=1)
    assert record == R("19_ReLU", 1, True, 2, 0.5, 1.0, None, "ok; fine")
    assert (record.speedup_vs_eager, record.speedup_vs_compile) == (2.0, None)
