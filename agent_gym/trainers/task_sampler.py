"""Which tasks each training step plays: a pure function of (seed, position), so a resumed run draws the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agent_gym.env import task_fields
from agent_gym.error import InvalidValue

__all__ = ["TaskSampler", "task_strata"]


class TaskSampler:
    """Which tasks each step trains on: a function of (seed, position), so resume needs only the position.

    Each draw is a ``reset`` spec ``{"seed": ..., "options": {"task_index": ...}}``: envs following docs/DESIGN.md §2
    take the task index modulo their task count; an env that ignores options still gets a reproducible seed.

    With ``strata`` (a value of a task field -> the indices of its tasks, :func:`task_strata`), draw ``k`` takes
    its task from stratum ``k mod len(strata)``, uniformly: a step of ``tasks_per_step`` draws holds each value
    equally often when ``tasks_per_step`` is a multiple of the number of values (and in turn across steps when it
    is not), where a uniform draw of 4 tasks from a 1/2-hop mix holds one hop count alone once in 8 steps.
    """

    def __init__(self, seed: int, position: int = 0, strata: Mapping[Any, Sequence[int]] | None = None) -> None:
        self.seed = seed
        self.position = position
        self.strata: list[list[int]] | None = None
        if strata is not None:
            self.strata = [list(strata[value]) for value in sorted(strata, key=repr)]
            if not self.strata or not all(self.strata):
                raise InvalidValue("a stratified task sampler needs at least one stratum, and no empty one")

    def draw(self, count: int) -> list[dict[str, Any]]:
        specs = []
        for _ in range(count):
            rng = np.random.default_rng([self.seed, self.position])
            seed = int(rng.integers(2**31 - 1))
            if self.strata is None:
                index = int(rng.integers(2**31 - 1))
            else:
                members = self.strata[self.position % len(self.strata)]
                index = members[int(rng.integers(len(members)))]
            specs.append({"seed": seed, "options": {"task_index": index}})
            self.position += 1
        return specs

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.position = int(state["seed"]), int(state["position"])


def task_strata(tasks: Sequence[Any], field: str) -> dict[Any, list[int]]:
    """The indices of ``tasks`` by their value of the task field ``field`` (what reset reports in
    ``info["task_fields"]``: ``kind`` or a scalar of the task's metadata, e.g. SynthHop's ``hops``)."""
    strata: dict[Any, list[int]] = {}
    missing = 0
    for index, task in enumerate(tasks):
        fields = task_fields(task)
        if field not in fields:
            missing += 1
            continue
        strata.setdefault(fields[field], []).append(index)
    if missing:
        known = sorted({name for task in tasks[:100] for name in task_fields(task)})
        raise InvalidValue(f"stratify_by={field!r}: {missing} of the {len(tasks)} tasks have no such field (the "
                           f"tasks' fields: {', '.join(known) or 'none'})")
    return strata
