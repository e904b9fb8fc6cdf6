"""The cuda-agent episode as a verl (0.9.1) agent loop: verl's rollout servers generate,
the workspace tools act, the judge rewards.

    # recipes/verl/agent_loops.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: cuda_agent
      _target_: cuda_agent.train.verl_loop.CudaAgentLoop
      settings: {max_turns: 150, device: cuda}
      pool: {backend: ray, ray_address: auto}     # omit: judge in the agent-loop process

verl's ``AgentLoopWorker`` builds one ``CudaAgentLoop`` per sample (``hydra.utils.instantiate``
with the entry's fields as keyword arguments) and awaits ``run(sampling_params, **row)``.
The row's ``extra_info.task`` names the task (anything ``load_task`` reads, e.g.
``builtin:gelu_bias_scale`` or ``tasks.jsonl::3``). Each episode owns a temporary workspace
for its whole trajectory; every turn is one ``server_manager.generate`` call on the whole
context; tool outputs enter the response with mask 0; the milestone reward is returned as
``reward_score``, so verl's reward function is not called for these rows.

verl is imported only inside ``run``: this module imports without it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from cuda_agent.train.episode_state import (
    AgentEpisode,
    ChatCodec,
    EpisodeJudge,
    EpisodeSettings,
    LocalJudge,
    PoolJudge,
    Rollout,
    run_rollout,
)

log = logging.getLogger(__name__)
AGENT_NAME = "cuda_agent"


def plain(value: Any) -> Any:
    """An OmegaConf node (what hydra hands over) as plain Python data."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


class SharedPool:
    """One judge pool per process, made on first use (why: a verl AgentLoopWorker is one
    Ray actor running many episodes at once; each must not start its own pool)."""

    _lock = threading.Lock()
    _pools: dict[str, Any] = {}

    @classmethod
    def get(cls, config: Mapping[str, Any]) -> Any:
        from cuda_agent.execution import PoolConfig, make_pool

        parsed = PoolConfig.model_validate(dict(config))
        key = parsed.model_dump_json()
        with cls._lock:
            if key not in cls._pools:
                cls._pools[key] = make_pool(parsed)
            return cls._pools[key]


def task_ref(row: Mapping[str, Any]) -> str:
    """The task a dataset row names: ``extra_info.task`` (or ``tools_kwargs.task``)."""
    for field in ("extra_info", "tools_kwargs"):
        found = plain(row.get(field)) or {}
        if isinstance(found, Mapping) and found.get("task"):
            return str(found["task"])
    raise ValueError("the dataset row names no task: set extra_info.task "
                     "(e.g. 'builtin:gelu_bias_scale')")


class CudaAgentLoop:
    """A verl agent loop (the ``AgentLoopBase`` contract: constructed with verl's keyword
    arguments, ``async run(sampling_params, **row) -> AgentLoopOutput``)."""

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any,
                 processor: Any = None, settings: Any = None, pool: Any = None,
                 judge_timeout_s: float | None = None, **_: Any):
        config = getattr(trainer_config, "config", trainer_config)
        rollout = config.actor_rollout_ref.rollout
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        self.server_manager = server_manager
        self.codec = ChatCodec(tokenizer)
        self.settings = EpisodeSettings.model_validate(plain(settings) or {})
        self.pool_config = plain(pool)
        self.judge_timeout_s = judge_timeout_s

    def judge(self) -> EpisodeJudge:
        if self.pool_config:
            return PoolJudge(SharedPool.get(self.pool_config), self.judge_timeout_s)
        return LocalJudge()

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        from cuda_agent.tasks import load_task

        rollout = await self.rollout(load_task(task_ref(row)), sampling_params)
        trace = rollout.trace
        prompt = trace.prompt_ids
        if len(prompt) > self.prompt_length:  # verl pads prompts to prompt_length
            log.warning("prompt of %d tokens cut to rollout.prompt_length=%d", len(prompt),
                        self.prompt_length)
            prompt = prompt[-self.prompt_length:]
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=trace.response_ids,
            response_mask=trace.response_mask,
            response_logprobs=trace.logprobs if trace.scored else None,
            reward_score=rollout.reward, num_turns=2 * rollout.turns + 1,
            metrics=AgentLoopMetrics(),
            extra_fields={"stop_reason": rollout.stop, "judge_error": rollout.verdict.error,
                          "correct": bool((rollout.verdict.result or {}).get("correct"))})

    async def rollout(self, task: Any, sampling_params: dict[str, Any]) -> Rollout:
        """One episode on a fresh workspace, generated through ``server_manager``."""
        request_id = uuid.uuid4().hex  # one id per episode: sticky to one server (prefix cache)

        async def generate(ids: list[int]) -> tuple[list[int], list[float] | None]:
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=ids, sampling_params=dict(sampling_params))
            return list(out.token_ids), (list(out.log_probs) if out.log_probs else None)

        with AgentEpisode(task, self.settings, self.judge()) as episode:
            return await run_rollout(episode, self.codec, generate, self.response_length)
