"""What a workspace's sources can make the judge's own process hold or spend on a build:
the symbols read from an object (one small source can define millions), the symbol lists
kept between builds, the tools' output, and the compiler output parsed.

    pytest -q -p no:cacheprovider tests/build/test_bounds.py
"""

from __future__ import annotations

import gc
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder, bounded, diagnostics, symbols
from cuda_agent.results import Diagnostic


def _many_symbols(n: int, tag: str) -> str:
    """A source of a few hundred bytes whose object defines ``n`` symbols (gas macros)."""
    return f"""// {tag}
asm(R"(
.altmacro
.macro gen i
.globl sym_{tag}_\\i
sym_{tag}_\\i: .quad 0
.endm
.data
.set k, 0
.rept {n}
gen %k
.set k, k+1
.endr
.text
)");
"""


def _object(folder: Path, n: int, tag: str) -> Path:
    source = folder / f"{tag}.cpp"
    source.write_text(_many_symbols(n, tag))
    obj = source.with_suffix(".o")
    subprocess.run(["g++", "-c", str(source), "-o", str(obj)], check=True, timeout=300)
    return obj


def _peak(call) -> tuple[object, int]:
    """``call()``'s result and the most memory it held at once (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_object_with_too_many_symbols_is_refused_unread(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Past the cap the check stops reading ``nm``: the refusal names the source, and the
    judge held a fraction of what listing every symbol takes."""
    obj = _object(tmp_path, 100_000, "many")
    policy = symbols.workspace_policy("g++")
    monkeypatch.setattr(symbols, "MAX_SYMBOLS", 2_000)
    problems, peak = _peak(lambda: symbols.check_objects([("kernels/many.cpp", obj)], policy))
    assert list(map(str, problems)) == [
        "kernels/many.cpp lists over 2000 symbols (more than the judge reads from one "
        "build's objects or one file): not allowed"]
    assert peak < 4 << 20  # every symbol's line, name and tuple: about 15 MiB
    # the cap is on the check, not one file: two objects under it each are over it together
    half = _object(tmp_path, 1_500, "half")
    (problem,) = symbols.check_objects([("kernels/a.cpp", half), ("kernels/b.cpp", half)],
                                       policy)
    assert (problem.where, problem.symbol) == ("kernels/b.cpp", "over 2000 symbols")
    (problem,) = symbols.check_file(obj, symbols.single_file_policy(()), "many.o")
    assert str(problem).startswith("many.o lists over 2000 symbols")


def test_a_build_over_the_symbol_cap_fails_naming_the_source(tmp_path: Path):
    """Through the builder, at the real cap: one source of a few hundred bytes."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "many.cpp").write_text(
        _many_symbols(symbols.MAX_SYMBOLS + 1, "cap"))
    result = Builder(BuildConfig(device="cpu")).build(tmp_path)
    assert not result.ok
    assert result.diagnostics[0] == Diagnostic(
        "kernels/many.cpp", None, None, "error",
        f"lists over {symbols.MAX_SYMBOLS} symbols (more than the judge reads from one "
        "build's objects or one file): not allowed")


def test_the_symbol_lists_kept_between_builds_are_bounded(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    """A warm judge keeps objects' lists up to a byte budget, whatever it has judged: the
    oldest go first, and what the process holds after the checks stays under it."""
    policy = symbols.workspace_policy("g++")
    objects = [_object(tmp_path, 20_000, f"b{k}") for k in range(6)]
    monkeypatch.setattr(symbols, "_LISTINGS", bounded.Cache(1024, 8 << 20,
                                                            symbols._listing_size))
    gc.collect()
    tracemalloc.start()
    try:
        for k, obj in enumerate(objects):
            assert symbols.check_objects([(f"kernels/b{k}.cpp", obj)], policy) == []
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
            assert symbols._LISTINGS.bytes <= 8 << 20
            assert held < 12 << 20  # the kept lists, under their budget, and little else
    finally:
        tracemalloc.stop()
    assert 0 < len(symbols._LISTINGS) < 2 * len(objects)  # two lists each: some dropped
    assert symbols._LISTINGS.max_entries == 1024 and symbols.MAX_SYMBOLS == 100_000


def test_the_cache_is_bounded_by_entries_and_bytes():
    cache = bounded.Cache(3, 100, len)
    for k in range(10):
        cache.get(k, lambda k=k: "x" * 20)
    assert len(cache) == 3 and cache.bytes == 60
    assert cache.get(9, lambda: "changed") == "x" * 20 and cache.hits == 1
    cache.get("big", lambda: "y" * 26)  # over a quarter of the bytes: not kept
    assert "big" not in cache._items
    for k in range(4):
        cache.get(("w", k), lambda: "z" * 24)
    assert cache.bytes <= 100 and len(cache) <= 3


def test_a_tools_output_is_read_in_bounded_memory():
    """Endless output, one endless line, and too many lines: each stops the command."""
    with pytest.raises(bounded.OutputLimit), bounded.Lines(["yes"], max_lines=1000) as out:
        for _ in out:
            pass
    assert out._proc.returncode is not None  # killed, not left running

    def one_line():
        with bounded.Lines(["head", "-c", str(64 << 20), "/dev/zero"],
                           max_line=1 << 20) as lines:
            return sum(1 for _ in lines)

    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(bounded.OutputLimit):
            one_line()
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()
    with bounded.Lines(["printf", "a\\nb\\n"], max_bytes=4) as out:
        assert list(out) == ["a", "b"] and out.returncode == 0


class _Counted(Diagnostic):
    """A diagnostic that counts its comparisons (the work of telling them apart)."""

    compared = 0
    most = 10**6
    """Past this many the count stops the parse (a quadratic one would take minutes)."""

    def __eq__(self, other: object) -> bool:
        _Counted.compared += 1
        assert _Counted.compared <= self.most, "a comparison for each pair of diagnostics"
        return super().__eq__(other)

    __hash__ = Diagnostic.__hash__


def _comparisons(n: int, limit: int, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(diagnostics, "Diagnostic", _Counted)
    log = "".join(f"e:{i}:2: error: #error\ne:{i}:3: warning: w\n" for i in range(n))
    _Counted.compared = 0
    found = diagnostics.parse(log, limit)
    assert len(found) == min(limit, 2 * n)
    return _Counted.compared


def test_parsing_a_log_costs_its_length(monkeypatch: pytest.MonkeyPatch):
    """N distinct errors and warnings are told apart in about N comparisons, not N^2: ten
    times the log, about ten times the work, whatever the number of diagnostics kept."""
    for limit in (diagnostics.MAX_DIAGNOSTICS, 10**6):
        small = _comparisons(2_000, limit, monkeypatch)
        large = _comparisons(20_000, limit, monkeypatch)
        assert large <= 20 * small + 1_000, (limit, small, large)


def test_a_builds_joined_log_is_bounded_and_keeps_each_sources_start():
    logs = [f"kernels/k{k}.cpp:1:1: error: first\n" + "x" * (1 << 20) for k in range(64)]
    logs[3] = "kernels/k3.cpp:2:1: error: short\n"
    joined = diagnostics.join_logs(logs)
    assert len(joined) < diagnostics.MAX_LOG + 64 * 100
    assert all(f"kernels/k{k}.cpp:" in joined for k in range(64))
    assert "kernels/k3.cpp:2:1: error: short\n" in joined
    assert diagnostics.join_logs(["a", "b"]) == "a\nb"
