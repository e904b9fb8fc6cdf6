"""The call protocol between the judge and a worker: the judge's driver against the worker's
channel over a real socket pair, its reservoir of kept calls, its clock, and input digests."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import torch

from cuda_agent.judge import calls
from cuda_agent.judge.calls import CallChannel, Lines, ProtocolError
from cuda_agent.judge.clock import ClockError, judge_clock
from cuda_agent.judge.digest import digest
from cuda_agent.judge.driver import CallDriver, DriverPlan, Record, Reservoir


def _serve(plan: DriverPlan, worker, read_kept=None):
    """A driver on one end of a socket pair, ``worker(channel)`` on the other (a thread)."""
    judge_end, worker_end = calls.pair()
    driver = CallDriver(Lines(judge_end), plan, read_kept).start()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker(CallChannel(worker_end.detach()))
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    driver.join(60)
    assert not thread.is_alive() and not errors, errors
    return driver


def _make_calls(channel: CallChannel, phase: str, stop_after: int | None = None,
                kept_log: list | None = None) -> int:
    made = 0
    while (call := channel.need(phase, stop_after is not None and made >= stop_after)):
        channel.ready()
        if channel.done("memfd", [], []) and kept_log is not None:
            kept_log.append(call)
        made += 1
    return made


def test_seeds_are_fresh_and_the_judge_ends_each_phase():
    plan = DriverPlan(keep=3, scales=(0.25, 4.0), calibrate=5, expected_calls=10,
                      rng=random.Random(1))
    seen: dict[str, int] = {}

    def worker(channel: CallChannel) -> None:
        seen["calibrate"] = _make_calls(channel, "calibrate")
        seen["timed"] = _make_calls(channel, "timed", stop_after=20)
        seen["tail"] = _make_calls(channel, "tail")

    driver = _serve(plan, worker, read_kept=lambda message: ([], []))
    assert seen["calibrate"] == 5 and seen["timed"] == 20 and driver.finished
    seeds = [r.seed for r in driver.records]
    assert len(set(seeds)) == len(seeds)  # no seed handed out twice
    assert sorted(r.scale for r in driver.records if r.scale != 1.0) == [0.25, 4.0]
    kept = driver.kept()
    assert len(kept) == 3 + 2 and all(k.scale != 1.0 or k.index in driver.reservoirs[True].kept
                                      for k in kept)
    assert all(r.go >= r.ready >= r.sent for r in driver.records)


def test_the_judge_reads_a_kept_call_before_the_worker_can_learn_it_was_kept():
    """Outputs are committed with ``done``: the judge reads them before it answers."""
    reads: list[int] = []
    answers: list[bool] = []
    plan = DriverPlan(keep=2, calibrate=1, rng=random.Random(6))

    def read(message: dict) -> tuple[list, list]:
        reads.append(len(answers))  # how many answers the worker had when this was read
        return [], []

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        while channel.need("timed", len(answers) >= 6):
            channel.ready()
            answers.append(channel.done("memfd", [], []))
        _make_calls(channel, "tail")

    _serve(plan, worker, read_kept=read)
    kept_at = [k for k, kept in enumerate(answers) if kept]
    assert kept_at and all(k in reads for k in kept_at)  # read while call k awaited its answer


def test_the_judge_decides_when_a_phase_ends_and_phases_go_in_order():
    plan = DriverPlan(calibrate=1, warmup=4, min_runs=5, rng=random.Random(7))
    seen: dict[str, int] = {}

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        seen["warmup"] = _make_calls(channel, "warmup", stop_after=0)  # would stop at once
        seen["timed"] = _make_calls(channel, "timed", stop_after=0)
        with pytest.raises(ProtocolError):  # back to an ended phase: refused
            channel.need("warmup")

    driver = _serve(plan, worker)
    assert (seen["warmup"], seen["timed"]) == (4, 5)
    assert driver.error and "after the judge ended it" in driver.error


def test_a_worker_without_the_record_phase_may_not_ask_for_it():
    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        with pytest.raises(ProtocolError):
            channel.need("record")

    driver = _serve(DriverPlan(calibrate=1, record=False, rng=random.Random(8)), worker)
    assert driver.error and "record" in driver.error


def test_the_tail_owes_what_the_run_did_not_reach():
    """A worker that stops at once still gets every scaled call and fills the reservoir."""
    plan = DriverPlan(keep=4, scales=(0.25, 4.0), calibrate=1, expected_calls=100,
                      rng=random.Random(2))
    kept: list = []

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        _make_calls(channel, "timed", stop_after=1)
        _make_calls(channel, "tail", kept_log=kept)

    driver = _serve(plan, worker, read_kept=lambda message: ([], []))
    assert driver.owed() == 0 and len(driver.kept()) == 6
    assert sorted(c.scale for c in kept if c.scale != 1.0) == [0.25, 4.0]


def test_the_reservoir_keeps_every_position_alike():
    """Over many runs of 200 calls, keeping 5: each position is kept about 5/200 of the time,
    early and late alike (a candidate gains nothing by cheating only late)."""
    counts: Counter = Counter()
    rng = random.Random(3)
    for _ in range(4000):
        reservoir = Reservoir(5, rng)
        for index in range(200):
            reservoir.offer(index)
        counts.update(reservoir.kept)
    early = sum(counts[i] for i in range(50))
    late = sum(counts[i] for i in range(150, 200))
    assert abs(early - late) < 0.15 * (early + late) / 2, (early, late)
    assert sum(counts.values()) == 4000 * 5


def test_a_worker_that_breaks_the_protocol_fails_the_driver():
    def worker(channel: CallChannel) -> None:
        channel.lines.send({"t": "done"})  # done before any call
        with pytest.raises(ProtocolError):
            channel.lines.receive()

    driver = _serve(DriverPlan(calibrate=1, rng=random.Random(4)), worker)
    assert driver.error and "expected need" in driver.error


def test_garbage_on_the_socket_is_refused_not_fatal():
    def worker(channel: CallChannel) -> None:
        channel.lines.sock.sendall(b"\xff" * 70000 + b"\n")

    driver = _serve(DriverPlan(rng=random.Random(5)), worker)
    assert driver.error and "longer than" in driver.error


def _record(phase: str, call_ms: float, prepare_ms: float = 1.0, index: int = 0) -> Record:
    record = Record(index, phase, 1, 1.0, True, 0.0)
    record.ready = prepare_ms / 1e3
    record.go = record.ready
    record.done = record.go + call_ms / 1e3
    return record


def test_the_judges_clock_subtracts_the_protocols_own_cost():
    stand_ins = [_record("calibrate", 0.1) for _ in range(9)]
    timed = [_record("timed", 2.1) for _ in range(20)]
    clock = judge_clock(stand_ins + timed)
    assert clock.median_ms == pytest.approx(2.0) and clock.early_ms == 0.0


def test_work_before_ready_is_charged_to_the_counted_calls():
    """The counted calls' preparation beyond the stand-ins' counts against them, whatever the
    other calls (warm-up or not) did: a long honest warm-up dilutes nothing."""
    stand_ins = [_record("calibrate", 0.1) for _ in range(9)]
    warm = [_record("warmup", 5.0) for _ in range(80)]
    early = [_record("timed", 0.6, prepare_ms=2.5) for _ in range(12)]  # began on the seed
    clock = judge_clock(stand_ins + warm + early)
    assert clock.median_ms == pytest.approx(0.5 + 1.5) and clock.early_ms == pytest.approx(1.5)


def test_no_stand_ins_no_clock():
    with pytest.raises(ClockError):
        judge_clock([_record("timed", 1.0)])


def test_a_digest_sees_any_change_and_depends_on_the_key():
    x = torch.randn(1000)
    y = torch.arange(7, dtype=torch.int64)
    base = digest([x, y], key=11)
    assert digest([x.clone(), y.clone()], key=11) == base
    assert digest([x, y], key=12) != base
    swapped = x.clone()
    swapped[[3, 700]] = swapped[[700, 3]]
    assert digest([swapped, y], 11)[0] != base[0]
    nudged = x.clone()
    nudged[999] = torch.nextafter(nudged[999], torch.tensor(10.0))
    assert digest([nudged, y], 11)[0] != base[0]
    assert digest([x.view(10, 100), y], 11)[0] != base[0]  # the shape is part of it


def test_the_judgements_draws_come_from_a_keyed_generator(tmp_path):
    """Python's own generator gives its state away after a few hundred outputs (a candidate
    sees every seed): the judge draws from a keyed one, reproducible only with the key."""
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.plan import JudgePlan
    from cuda_agent.judge.secret import Keyed
    from cuda_agent.tasks import load_task
    from tests.conftest import SCALE_ADD_TASK

    assert Keyed(7).getrandbits(62) == Keyed(7).getrandbits(62)
    assert Keyed(7).getrandbits(62) != Keyed(8).getrandbits(62)
    assert Keyed().getrandbits(128) != Keyed().getrandbits(128)  # a fresh secret key each
    parent = Keyed(7)
    first, second = parent.child(), parent.child()
    assert first.getrandbits(64) != second.getrandbits(64)
    with pytest.raises(TypeError):
        parent.getstate()
    (tmp_path / "task.py").write_text(SCALE_ADD_TASK)
    plan = JudgePlan(JudgeConfig(device="cpu"), load_task(tmp_path / "task.py"), "cpu", 3,
                     tmp_path)
    assert isinstance(plan.rng, Keyed) and isinstance(plan.driver_plan(1).rng, Keyed)
    assert isinstance(DriverPlan().rng, Keyed)
    again = JudgePlan(JudgeConfig(device="cpu", seed=3), load_task(tmp_path / "task.py"),
                      "cpu", 3, tmp_path)
    assert (plan.key, plan.init_seed) == (again.key, again.init_seed)  # the seed reproduces


def test_the_warm_up_ends_by_the_judges_count_alone_and_none_of_it_is_kept():
    """A worker asking for ever more warm-up calls gets the judge's number of them, and the
    kept calls all come from the counted ones: work done only in the warm-up proves
    nothing."""
    plan = DriverPlan(keep=3, calibrate=1, warmup=6, min_runs=8, rng=random.Random(9))
    seen: dict[str, int] = {}

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        seen["warmup"] = _make_calls(channel, "warmup")  # never asks to stop
        seen["timed"] = _make_calls(channel, "timed", stop_after=0)
        _make_calls(channel, "tail")

    driver = _serve(plan, worker, read_kept=lambda message: ([], []))
    assert (seen["warmup"], seen["timed"]) == (6, 8)
    phases = {r.index: r.phase for r in driver.records}
    assert len(driver.kept()) == 3 and all(phases[k.index] == "timed" for k in driver.kept())


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
def test_each_kind_of_call_is_checked(keep: int):
    """Wall calls and device-timer calls each fill a reservoir of their own: a candidate
    told which kind a call is cannot skip the work in one kind unseen (a single kept call
    is drawn from both kinds alike, so that no kind is never kept)."""
    kinds: Counter = Counter()
    for seed in range(40):
        plan = DriverPlan(keep=keep, calibrate=1, wall_share=0.25, min_runs=30,
                          rng=random.Random(seed))

        def worker(channel: CallChannel) -> None:
            _make_calls(channel, "calibrate")
            _make_calls(channel, "timed", stop_after=0)
            _make_calls(channel, "tail")

        driver = _serve(plan, worker, read_kept=lambda message: ([], []))
        wall = {r.index: r.wall for r in driver.records}
        got = Counter(wall[k.index] for k in driver.kept())
        assert sum(got.values()) == keep
        if keep > 1:
            assert got[True] >= 1 and got[False] >= 1, got
        kinds.update(got)
        if keep == 1:  # one reservoir for both kinds: none of size 0 to learn
            assert driver.reservoirs[True] is driver.reservoirs[False]
    assert kinds[True] and kinds[False]


def test_the_tail_fills_the_kind_still_owed():
    """A worker that stops at once: the tail's calls are of the kinds not yet kept."""
    plan = DriverPlan(keep=4, calibrate=1, wall_share=0.25, rng=random.Random(11))

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        _make_calls(channel, "timed", stop_after=0)
        _make_calls(channel, "tail")

    driver = _serve(plan, worker, read_kept=lambda message: ([], []))
    wall = {r.index: r.wall for r in driver.records}
    assert Counter(wall[k.index] for k in driver.kept()) == {True: 2, False: 2}


def test_descriptors_may_not_describe_more_than_one_call_in_all():
    """Each descriptor within the pack, but together many times its size: refused before
    the judge copies anything."""
    from types import SimpleNamespace

    from cuda_agent.judge.plan import kept_reader

    read = kept_reader(SimpleNamespace(pack_fd=None, device_pack=None), "cpu", 4096)
    whole = {"offset": 0, "nbytes": 4096, "dtype": "float32", "shape": [1024]}
    with pytest.raises(ProtocolError, match="described in all"):
        read({"pack": "memfd", "outputs": [whole] * 8, "inputs": []})
    with pytest.raises(ProtocolError, match="described in all"):  # a negative size hides none
        read({"pack": "memfd", "outputs": [whole, {**whole, "nbytes": -4096}, whole],
              "inputs": []})


def test_the_first_counted_call_is_announced_once():
    calls_seen: list[int] = []
    plan = DriverPlan(calibrate=2, warmup=3, min_runs=4, rng=random.Random(12))

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        _make_calls(channel, "warmup")
        _make_calls(channel, "timed", stop_after=0)

    judge_end, worker_end = calls.pair()
    driver = CallDriver(Lines(judge_end), plan, None,
                        at_counted=lambda: calls_seen.append(len(driver.records))).start()
    thread = threading.Thread(target=worker, args=(CallChannel(worker_end.detach()),))
    thread.start()
    thread.join(60)
    driver.join(60)
    assert calls_seen == [2 + 3 + 1]


@pytest.mark.parametrize("timed", [True, False])
def test_a_job_gets_only_its_own_kind_of_phases(timed: bool):
    """A timed job's calls cannot be asked for as ``check`` calls (which the judge's clock
    does not count), nor an untimed job's as timed ones."""
    other = "check" if timed else "timed"

    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        with pytest.raises(ProtocolError):
            channel.need(other)

    driver = _serve(DriverPlan(calibrate=1, timed=timed, rng=random.Random(13)), worker)
    assert driver.error and other in driver.error


def test_the_timed_calls_cannot_be_skipped():
    """A timed job's worker that goes from the warm-up straight to the tail (where the
    judge owes it the kept calls) is refused: every timed job makes ``min_runs`` calls."""
    def worker(channel: CallChannel) -> None:
        _make_calls(channel, "calibrate")
        _make_calls(channel, "warmup")
        with pytest.raises(ProtocolError):
            channel.need("tail")

    plan = DriverPlan(keep=2, calibrate=1, warmup=2, min_runs=20, rng=random.Random(14))
    driver = _serve(plan, worker, read_kept=lambda message: ([], []))
    assert driver.error and "before the judge ended the timed calls" in driver.error
