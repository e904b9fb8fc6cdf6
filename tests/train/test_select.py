"""RFT selection: one trajectory per rule that breaks exactly that rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.agent.types import Message
from cuda_agent.train.select import RULES, SelectConfig, check_trajectory, select_trajectories
from tests.train.conftest import TrajectoryMaker, Turn, call


def good_turns() -> list[Turn]:
    return [
        Turn(Message("assistant", "Reading.", (call("read_file", {"path": "model.py"}, "a"),)),
             [(True, "class Model: ...")]),
        Turn(Message("assistant", "Writing.", (
            call("write_file", {"path": "kernels/k.cpp", "content": "x"}, "b"),)),
            [(True, "created kernels/k.cpp")]),
        Turn(Message("assistant", "Done.", (call("submit", {}, "c"),)), [(True, "submitted")]),
    ]


def with_turn(turn: Turn) -> list[Turn]:
    turns = good_turns()
    return [*turns[:-1], turn, turns[-1]]


CASES = {
    "complete": dict(stop="turn_limit"),
    "positive_reward": dict(reward=-1),
    "well_formed_calls": dict(turns=with_turn(Turn(
        Message("assistant", "", (call("write_file", None, "m"),)),
        [(False, "write_file: the arguments were not a valid JSON object: {not json")]))),
    "valid_behaviour": dict(turns=with_turn(Turn(
        Message("assistant", "", (call("write_file", {"path": "reference.py", "content": ""},
                                       "v"),)),
        [(False, "reference.py: is a fixed file of the workspace and cannot be changed; "
                 "write kernels/ or model_new.py")]))),
    "no_redundant_loops": dict(turns=[*good_turns()[:1], *[Turn(
        Message("assistant", "Again.", (call("build", {}, f"r{i}"),)), [(True, "build ok")])
        for i in range(3)], good_turns()[-1]]),
}


def test_a_good_trajectory_passes_every_rule(make_trajectory: TrajectoryMaker) -> None:
    report = select_trajectories([make_trajectory(good_turns())])
    assert len(report.kept) == 1 and report.dropped == {}
    assert report.counts == dict.fromkeys(RULES, 0)


@pytest.mark.parametrize("rule", list(CASES))
def test_each_rule_alone(rule: str, make_trajectory: TrajectoryMaker) -> None:
    options = dict(CASES[rule])
    path = make_trajectory(options.pop("turns", good_turns()), **options)
    report = select_trajectories([path])
    assert report.kept == []
    reasons = report.dropped[path]
    assert {r.split(":", 1)[0] for r in reasons} == {rule}, reasons
    assert report.counts[rule] == 1 and sum(report.counts.values()) == 1


def test_other_invalid_behaviours(make_trajectory: TrajectoryMaker) -> None:
    escape = make_trajectory(with_turn(Turn(
        Message("assistant", "", (call("read_file", {"path": "../../etc/passwd"}, "e"),)),
        [(False, "../../etc/passwd: '..' is not allowed; paths stay inside the workspace")])))
    unknown = make_trajectory(with_turn(Turn(
        Message("assistant", "", (call("rm_rf", {}, "u"),)),
        [(False, "unknown tool 'rm_rf'; the tools are: shell, read_file")])))
    harmless = make_trajectory(with_turn(Turn(
        Message("assistant", "", (call("read_file", {"path": "nope.py"}, "n"),)),
        [(False, "nope.py: no such file")])))
    report = select_trajectories([escape, unknown, harmless])
    assert report.kept == [harmless]
    assert report.dropped[escape] == ["valid_behaviour: read_file: refused: ../../etc/passwd: "
                                      "'..' is not allowed; paths stay inside the workspace"]
    assert report.dropped[unknown] == ["valid_behaviour: call of unknown tool 'rm_rf'"]


def test_loop_threshold_and_interrupted_runs(make_trajectory: TrajectoryMaker) -> None:
    turns = CASES["no_redundant_loops"]["turns"]
    assert check_trajectory_from(make_trajectory(turns), SelectConfig(max_repeats=4)) == []
    # same call with different arguments is not a loop
    varied = [*good_turns()[:1], *[Turn(Message("assistant", "", (
        call("read_file", {"path": f"f{i}.py"}, f"x{i}"),)), [(True, "...")]) for i in range(4)],
        good_turns()[-1]]
    assert check_trajectory_from(make_trajectory(varied), SelectConfig()) == []


def check_trajectory_from(path: Path, config: SelectConfig) -> list[str]:
    from cuda_agent.agent.trajectory import read_trajectory

    return check_trajectory(read_trajectory(path), config)


def test_unfinished_unreadable_and_rule_subset(make_trajectory: TrajectoryMaker,
                                               tmp_path: Path) -> None:
    unfinished = make_trajectory(good_turns(), end=False)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not json\n{}\n")
    report = select_trajectories([unfinished, broken])
    assert report.dropped[unfinished] == [
        "complete: no episode_end record (unfinished episode)",
        "positive_reward: no reward (episode not judged)"]
    assert report.dropped[broken][0].startswith("unreadable:")
    assert report.counts["unreadable"] == 1
    assert "kept 0 of 2" in report.summary()
    only = select_trajectories([make_trajectory(good_turns(), reward=1, stop="turn_limit")],
                               SelectConfig(rules=("positive_reward",)))
    assert len(only.kept) == 1
    with pytest.raises(ValueError, match="unknown selection rule"):
        select_trajectories([unfinished], SelectConfig(rules=("nope",)))
