"""``--set KEY=VALUE`` overrides (``cuda_agent.cli.overrides``)."""

from __future__ import annotations

import pytest
import typer

from cuda_agent.cli import overrides
from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.config import in_episode


def test_values_parse_as_json_and_nested_keys_reach_sections():
    config = overrides.apply(JudgeConfig(device="cpu"),
                             ["trials=2", "scales=[0.5]", "build.jobs=3", "seed=null"])
    assert (config.trials, config.scales, config.build.jobs, config.seed) == (2, (0.5,), 3, None)
    assert config.device == "cpu"


def test_only_what_was_set_stays_set():
    """An override does not make every other field look chosen: the agent's quick settings
    (in_episode) still apply where the user named none of theirs."""
    config = overrides.apply(JudgeConfig(device="cpu"), ["trials=2"])
    assert config.model_fields_set == {"device", "trials"}
    assert in_episode(config).candidate_processes == 1
    told = overrides.apply(JudgeConfig(), ["candidate_processes=3"])
    assert in_episode(told).candidate_processes == 3


@pytest.mark.parametrize(("item", "expected"), [
    ("trials", "is not KEY=VALUE"), ("nope=1", "unknown field 'nope'"),
    ("trials.x=1", "no section 'trials'"), ("trials=-1", "greater than or equal to 1")])
def test_bad_overrides_say_what_is_wrong(item: str, expected: str):
    with pytest.raises(typer.BadParameter, match=expected):
        overrides.apply(JudgeConfig(), [item])


def test_a_nested_override_leaves_the_rest_of_its_section_unset():
    """``--set judge.trials=3`` on the service sets that field alone, so the service's
    verify and profile still time the candidate in one process."""
    from cuda_agent.service.config import ServiceConfig

    config = overrides.apply(ServiceConfig(), ["judge.trials=3"])
    assert config.judge.model_fields_set == {"trials"} and config.judge.trials == 3
    assert in_episode(config.judge).candidate_processes == 1
    sandbox = overrides.apply(ServiceConfig(), ["sandbox.cpu_s=5"]).sandbox
    assert sandbox.cpu_s == 5 and sandbox == ServiceConfig().sandbox.model_copy(
        update={"cpu_s": 5})  # values a default factory set are kept


def test_tool_overrides_keep_exactly_what_was_named():
    from cuda_agent.cli.agent_options import agent_config

    config = agent_config("cpu", 10, 1000, [], ["candidate_processes=null", "trials=2"])
    assert config.tools.judge == {"candidate_processes": None, "trials": 2}
