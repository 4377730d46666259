"""Which tasks each training step plays: a pure function of (seed, position), so a resumed run draws the same."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TaskSampler"]


class TaskSampler:
    """Which tasks each step trains on: a function of (seed, position), so resume needs only the position.

    Each draw is a ``reset`` spec ``{"seed": ..., "options": {"task_index": ...}}``: envs following docs/DESIGN.md §2
    take the task index modulo their task count; an env that ignores options still gets a reproducible seed.
    """

    def __init__(self, seed: int, position: int = 0) -> None:
        self.seed = seed
        self.position = position

    def draw(self, count: int) -> list[dict[str, Any]]:
        specs = []
        for _ in range(count):
            rng = np.random.default_rng([self.seed, self.position])
            specs.append(
                {
                    "seed": int(rng.integers(2**31 - 1)),
                    "options": {"task_index": int(rng.integers(2**31 - 1))},
                }
            )
            self.position += 1
        return specs

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.position = int(state["seed"]), int(state["position"])
