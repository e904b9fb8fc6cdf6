"""The data set on disk: CUDA-Agent-Ops rows, written as tasks finish, resumable.

    OUT/jsonl/train.jsonl    accepted rows, appended and fsynced one by one
    OUT/data/train.parquet   written from the JSONL at the end (``export_parquet``)
    OUT/run/verdicts.jsonl   one line per finished candidate (the state: done ids)
    OUT/run/config.json      the run's configuration (a resumed run must match it)
    OUT/run/sessions.jsonl   one line per session: its start, length, accepted, candidates

A row holds ``ops``, ``data_source`` and ``code`` (the CUDA-Agent-Ops layout) plus ``name``,
``task_id``, shapes, eager/compile times, device, composer and filter version. After a kill,
a partial last line is cut off, and a candidate counts as done when its verdict or its row
was written, so a restart neither loses nor repeats a task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROWS = Path("jsonl") / "train.jsonl"
PARQUET = Path("data") / "train.parquet"
VERDICTS = Path("run") / "verdicts.jsonl"
CONFIG = Path("run") / "config.json"
SESSIONS = Path("run") / "sessions.jsonl"
RESUME_KEYS = ("seed", "composer", "device")


class DatasetWriter:
    """Appends rows and verdicts durably; knows which candidate ids are done."""

    def __init__(self, out: Path, config: dict[str, Any]):
        self.out = out
        for sub in (ROWS, VERDICTS):
            (out / sub).parent.mkdir(parents=True, exist_ok=True)
        self._check_config(config)
        self.rows = read_jsonl(out / ROWS, repair=True)
        self.verdicts = read_jsonl(out / VERDICTS, repair=True)
        have = {v["task_id"] for v in self.verdicts}
        self._rows = (out / ROWS).open("a")
        self._verdicts = (out / VERDICTS).open("a")
        for row in self.rows:  # killed between the row and its verdict
            if row["task_id"] not in have:
                self.add_verdict({"task_id": row["task_id"], "name": row["name"],
                                  "accepted": True, "reasons": [], "ops": row["ops"],
                                  "eager_ms": row.get("eager_ms"), "recovered": True})
        self.done = {v["task_id"] for v in self.verdicts}

    def _check_config(self, config: dict[str, Any]) -> None:
        path = self.out / CONFIG
        if path.exists():
            old = json.loads(path.read_text())
            clash = [k for k in RESUME_KEYS if old.get(k) != config.get(k)]
            if clash:
                raise ValueError(f"{self.out} holds a run with different {', '.join(clash)} "
                                 f"({', '.join(f'{k}={old.get(k)!r}' for k in clash)}); "
                                 "use another folder")
        path.write_text(json.dumps(config, indent=1, default=str))

    @property
    def accepted(self) -> int:
        return len(self.rows)

    def add_row(self, row: dict[str, Any]) -> None:
        _append(self._rows, row)
        self.rows.append(row)

    def add_verdict(self, verdict: dict[str, Any]) -> None:
        _append(self._verdicts, verdict)
        self.verdicts.append(verdict)
        self.done = getattr(self, "done", set()) | {verdict["task_id"]}

    def add_session(self, session: dict[str, Any]) -> None:
        """One line per session, for throughput over the sessions that made the set."""
        with (self.out / SESSIONS).open("a") as handle:
            _append(handle, session)

    def close(self) -> None:
        self._rows.close()
        self._verdicts.close()


def _append(handle, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, default=str) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def read_jsonl(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Read complete lines; with ``repair``, cut off a partial last line left by a kill."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        if repair:
            with path.open("r+b") as handle:
                handle.truncate(len(data))
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def export_parquet(out: Path) -> Path:
    """Write ``data/train.parquet`` from the JSONL rows (re-creatable at any time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = read_jsonl(out / ROWS)
    path = out / PARQUET
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows) if rows else pa.table(
        {"ops": pa.array([], pa.list_(pa.string())), "data_source": pa.array([], pa.string()),
         "code": pa.array([], pa.string())})
    pq.write_table(table, path)
    return path


def make_row(task_id: int, name: str, code: str, ops: tuple[str, ...], data_source: str,
             composer: str, verdict: Any, op_classes: list[str]) -> dict[str, Any]:
    return {"ops": list(ops), "data_source": data_source, "code": code, "name": name,
            "op_classes": op_classes,
            "task_id": task_id, "composer": composer,
            "input_shapes": [list(s) for s in verdict.input_shapes],
            "output_shapes": [list(s) for s in verdict.output_shapes],
            "eager_ms": verdict.eager_ms, "compile_ms": verdict.compile_ms,
            "device": verdict.device, "filter_version": verdict.filter_version,
            "kernelbench_similarity": verdict.metrics.get("kernelbench_similarity")}
