"""The judge: build, run candidate and reference in separate processes, compare, time, reward."""

from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.judge import Judge
from cuda_agent.judge.reward import milestone_reward

__all__ = ["Candidate", "CandidateError", "Judge", "JudgeConfig", "milestone_reward"]
