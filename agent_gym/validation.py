"""Checks of user settings, shared by the env core and the env factories: each error names the valid range."""

from __future__ import annotations

import numbers
from typing import Any

from agent_gym.error import InvalidValue

__all__ = ["require_int"]


def require_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int, or a ``ValueError`` that names the setting and its range (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidValue(f"{name} must be at least {minimum} (an integer), got {value!r:.80}")
    return int(value)
