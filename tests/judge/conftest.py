"""Fixtures of the judge's tests: a fresh single-file ``load_inline`` candidate whose first
judgement compiles it, made once per test run."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from cuda_agent.execution.backend import judge_result
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.results import JudgeResult, to_dict
from cuda_agent.tasks import load_task
from tests.conftest import INLINE_SCALE_ADD, SCALE_ADD_TASK, once_per_run

# timed in two candidate processes: the second may load what the first compiled
TWO_PROCESSES = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.3,
                            trials=2, scales=(), candidate_processes=2)


@dataclasses.dataclass(frozen=True)
class FreshInline:
    """A single-file candidate of a source no judgement had seen (``INLINE_SCALE_ADD`` with
    a comment of its own), its task, and its first verdict: ``TWO_PROCESSES``, whose first
    candidate process compiled it."""

    task: Path
    candidate: Path
    first: JudgeResult


@pytest.fixture(scope="session")
def fresh_inline(tmp_path_factory: pytest.TempPathFactory) -> FreshInline:
    """Made once per run (a compile of torch's extension headers takes tens of seconds):
    the tests that judge the candidate again find its compiled build kept by the judge."""
    with once_per_run(tmp_path_factory, "fresh-inline") as (folder, made):
        task, candidate, record = (folder / "scale_add.py", folder / "cand.py",
                                   folder / "first.json")
        if made:
            task.write_text(SCALE_ADD_TASK)
            candidate.write_text(INLINE_SCALE_ADD + f"\n# {uuid.uuid4().hex}\n")
            first = Judge(TWO_PROCESSES).judge(load_task(task), Candidate.from_ref(candidate))
            record.write_text(json.dumps(to_dict(first)))
        return FreshInline(task, candidate, judge_result(json.loads(record.read_text())))
