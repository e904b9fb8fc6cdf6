"""``cuda-agent synth check --json`` output and the command group."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.synth.conftest import GOOD, task


def _synth(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_agent", "synth", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_check_json_keys(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "identity.py"
    good.write_text(GOOD)
    bad.write_text(task("return torch.relu(x)", inputs="torch.rand(64, 256)"))
    window = ["--no-compile", "--set", "min_ms_cpu=0", "--json"]
    ok = _synth("check", str(good), *window)
    assert ok.returncode == 0, ok.stderr
    verdict = json.loads(ok.stdout)
    assert verdict["accepted"] is True and verdict["reasons"] == []
    # a check that could not run (KernelBench's copy absent) reads "skipped", never true
    assert all(isinstance(v, bool) or v == "skipped" for v in verdict["checks"].values())
    assert any("runtime" in name for name in verdict["checks"])
    rejected = _synth("check", str(bad), *window)
    assert rejected.returncode == 1
    verdict = json.loads(rejected.stdout)
    assert verdict["accepted"] is False and verdict["checks"]["not_identity"] is False
    assert any(r.startswith("not_identity") for r in verdict["reasons"])


def test_group_help_lists_sub_commands():
    shown = _synth("--help")
    assert shown.returncode == 0
    for name in ("check", "catalog", "audit", "--count", "--out"):
        assert name in shown.stdout
    assert _synth("--count", "1").returncode == 2  # --out is required
