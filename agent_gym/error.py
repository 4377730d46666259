"""The base of every error agent-gym raises on purpose, as Gymnasium's ``gymnasium.error`` does.

``except agent_gym.error.AgentGymError`` catches any of them. Each error class keeps its own module and its
other base (``ValueError``, ``RuntimeError``, ``FileNotFoundError``...), so code that catches those still works.
"""

from __future__ import annotations

__all__ = ["AgentGymError"]


class AgentGymError(Exception):
    """Base class of agent-gym's errors; the message says what is wrong and what to do next."""
