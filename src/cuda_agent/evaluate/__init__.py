"""Evaluation: judge one answer per task and report Table-1 metrics (docs/evaluation.md)."""

from cuda_agent.evaluate.metrics import (
    EvalTable,
    GroupMetrics,
    TaskRecord,
    compute_table,
    record_from_judge,
    table_from_dict,
)
from cuda_agent.evaluate.report import compare_markdown, to_markdown
from cuda_agent.evaluate.run import EvalConfig, find_answer, run_eval

__all__ = ["EvalConfig", "EvalTable", "GroupMetrics", "TaskRecord", "compare_markdown",
           "compute_table", "find_answer", "record_from_judge", "run_eval", "table_from_dict",
           "to_markdown"]
