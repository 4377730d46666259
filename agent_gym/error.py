"""The base of every error agent-gym raises on purpose, as Gymnasium's ``gymnasium.error`` does.

``except agent_gym.error.AgentGymError`` catches any of them. Each error class keeps its own module and its
other base (``ValueError``, ``RuntimeError``, ``FileNotFoundError``...), so code that catches those still works.
The three generic classes below are the validation errors of settings, options and ids: code written against
the built-in (``except ValueError``) keeps working.
"""

from __future__ import annotations

__all__ = ["AgentGymError", "InvalidValue", "InvalidType", "KeyNotFound", "IndexOutOfRange"]


class AgentGymError(Exception):
    """Base class of agent-gym's errors; the message says what is wrong and what to do next."""


class InvalidValue(AgentGymError, ValueError):
    """A setting, option or argument outside what is accepted; the message names the valid values."""


class InvalidType(AgentGymError, TypeError):
    """A keyword that is not taken, or a value of the wrong type; the message names what is accepted."""


class KeyNotFound(AgentGymError, KeyError):
    """An id (a task, a page) that is not there."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument; a message reads better without the quotes.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class IndexOutOfRange(AgentGymError, IndexError):
    """A position (a document row, a slot) outside the sequence it indexes; the message gives the valid range."""
