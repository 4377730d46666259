"""Text spaces for language agents.

Gymnasium's stock :class:`gymnasium.spaces.Text` only admits a fixed character set (letters and digits by
default), so it rejects JSON, punctuation and most of Unicode. :class:`UnicodeText` admits any ``str`` within
its length bounds; it is the observation and action space of every agent-gym environment.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

from agent_gym.error import InvalidValue

__all__ = ["UnicodeText"]

# What `sample()` draws from: printable ASCII plus a spread of other scripts and symbols, and the characters
# that wire formats treat specially, so sampled actions exercise parsers the way fuzzing does.
_SAMPLE_ALPHABET = (
    "".join(chr(code) for code in range(32, 127))
    + "\n\t"
    + "éßøπΩжЖ中文字日本語한국어العربيةहिन्दी€£¥…—“”‘’•→✓🙂🚀"
)


class UnicodeText(Space[str]):
    """Any Python ``str`` whose length lies in ``[min_length, max_length]``.

    Args:
        max_length: the longest admitted string, in characters.
        min_length: the shortest admitted string.
        seed: seed of the space's own RNG (used by :meth:`sample`).
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        if not isinstance(max_length, int | np.integer) or max_length < 0:
            raise InvalidValue(f"max_length must be a non-negative int, got {max_length!r}")
        if not isinstance(min_length, int | np.integer) or not 0 <= min_length <= max_length:
            raise InvalidValue(f"min_length must be an int in [0, max_length], got {min_length!r}")
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        super().__init__(shape=None, dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of up to ``min(max_length, 256)`` characters from a mixed-script alphabet."""
        if mask is not None or probability is not None:
            raise InvalidValue("UnicodeText.sample does not support masks")
        longest = max(self.min_length, min(self.max_length, 256))
        length = int(self.np_random.integers(self.min_length, longest + 1))
        indices = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=length)
        return "".join(_SAMPLE_ALPHABET[i] for i in indices)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)

    def __repr__(self) -> str:
        return f"UnicodeText(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.min_length == self.min_length
            and other.max_length == self.max_length
        )

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.min_length, self.max_length))
