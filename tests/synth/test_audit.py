"""The filters over a few KernelBench problems find their reported defects by themselves."""

from __future__ import annotations

import json

from cuda_agent.synth.audit import audit
from cuda_agent.synth.config import FilterConfig

PICK = {(1, 19), (2, 80), (1, 12)}


def test_audit_finds_identity_and_constant(tmp_path, kernelbench):
    rows = [json.loads(line) for line in kernelbench.read_text().splitlines()]
    subset = tmp_path / "kb.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows
                              if (r["level"], r["problem_id"]) in PICK))
    filters = FilterConfig(compile_check=False, max_numel=1 << 16, min_ms_cpu=0.0,
                           max_ms_cpu=1e9)
    got = {(r["level"], r["problem_id"]): r for r in audit(subset, tmp_path / "out", filters)}
    assert got[(1, 19)]["checks"]["not_identity"] is False
    assert got[(1, 19)]["shrunk"]  # sizes were reduced for the CPU
    assert not got[(2, 80)]["accepted"]
    assert {"not_constant", "no_redundant_ops"} & {
        r.split(":")[0] for r in got[(2, 80)]["reasons"]}
    assert got[(1, 12)]["accepted"], got[(1, 12)]["reasons"]
    assert "| 1 |" in (tmp_path / "out" / "audit.md").read_text()
