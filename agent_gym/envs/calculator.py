"""``AgentR1-Calculator-v0``: arithmetic word problems that need a ``calculate`` tool."""

from __future__ import annotations

import functools
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.envs.word_problems import generate_arithmetic_tasks
from agent_gym.tasks import TaskSet
from agent_gym.tools.calculator import calculate
from agent_gym.validation import require_int

__all__ = ["make_calculator_env", "CALCULATOR_INSTRUCTION"]

CALCULATOR_INSTRUCTION = (
    "Solve the word problem. Do not do arithmetic in your head: use the calculate tool for every operation, "
    "then give the final number within <answer></answer> tags."
)


@functools.lru_cache(maxsize=8)
def _problems(num_questions: int, seed: int, split: str) -> TaskSet:
    return TaskSet(generate_arithmetic_tasks(num_questions, seed=seed, split=split),
                   name=f"arithmetic(seed={seed}, split={split})")


def make_calculator_env(*, num_questions: int = 500, seed: int = 0, split: str = "train",
                        **env_kwargs: Any) -> ToolEnv:
    """Build a Calculator env; ``env_kwargs`` are :class:`~agent_gym.env.ToolEnv` settings."""
    num_questions = require_int("num_questions", num_questions)
    env_kwargs.setdefault("instruction", CALCULATOR_INSTRUCTION)
    env_kwargs.setdefault("max_turns", 6)
    return ToolEnv(_problems(num_questions, seed, split), [calculate], **env_kwargs)
