"""Task records: what one episode is about.

A :class:`Task` is a question with gold answers (multi-hop QA) or a tool task with a checker.
Task sources are plain sequences of tasks; :class:`TaskSet` adds lookup by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gym.error import InvalidType, InvalidValue, KeyNotFound


@dataclass(frozen=True)
class Hop:
    """One step of a question's gold decomposition.

    ``query`` is what a search for this hop's evidence would ask; ``answer`` the hop's answer;
    ``title`` the page that supports it (when known).
    """

    question: str
    answer: str
    query: str = ""
    title: str = ""


@dataclass(frozen=True)
class CheckResult:
    """A checker's verdict with its detail (e.g. how many hidden tests passed), for ``info["check"]``."""

    score: float
    details: dict[str, Any] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.score)


@dataclass(frozen=True)
class Task:
    """One episode's task.

    Attributes:
        id: stable identifier, unique within its source.
        question: the text put to the agent.
        answers: gold answers; ``answers[0]`` is canonical, the rest are aliases. A single ``str`` is one
            answer (``answers="5280"`` is ``("5280",)``, never its characters).
        supporting_titles: titles of the pages that hold the evidence (process rewards use them); a single
            ``str`` is one title.
        decomposition: the gold hops, in order (scripted policies and analysis use them).
        kind: a short label, e.g. ``"bridge"``, ``"comparison"``, ``"arithmetic"``.
        metadata: anything else the source keeps (dataset fields, hop count, ...).
        checker: optional ``checker(answer) -> float`` in [0, 1] that replaces EM for tool tasks
            whose answers are not strings to match (e.g. numbers, programs). It may return a
            :class:`CheckResult` instead, whose ``details`` the env reports as ``info["check"]``.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] = ()
    decomposition: tuple[Hop, ...] = ()
    kind: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    checker: Callable[[str], float] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise InvalidType(f"Task id must be a str, got {type(self.id).__name__} {self.id!r:.80}")
        if not isinstance(self.question, str):
            raise InvalidType(f"Task {self.id!r}: question must be a str, got {type(self.question).__name__}")
        for name in ("answers", "supporting_titles"):
            object.__setattr__(self, name, _strings(self.id, name, getattr(self, name)))
        object.__setattr__(self, "decomposition", tuple(self.decomposition))
        if self.checker is None and not any(answer.strip() for answer in self.answers):
            raise InvalidValue(f"Task {self.id!r}: no answer can ever match (answers={self.answers!r} and no "
                               "checker); give answers=('...',) or a checker")
        if self.checker is not None and not callable(self.checker):
            raise InvalidType(f"Task {self.id!r}: checker must be callable, got {type(self.checker).__name__}")


def _strings(task_id: str, name: str, value: Any) -> tuple[str, ...]:
    """A tuple of strings from a str (one item) or an iterable of them; a TypeError that says how, otherwise."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable):
        raise InvalidType(f"Task {task_id!r}: {name} must be a str or a tuple of str, got {type(value).__name__}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise InvalidType(f"Task {task_id!r}: {name} must be strings, got {type(item).__name__} {item!r:.80}; "
                              f"write {name}=({str(item)!r},)")
    return items


class TaskSet(Sequence[Task]):
    """An ordered, immutable collection of tasks with lookup by id."""

    def __init__(self, tasks: Iterable[Task], name: str = "tasks") -> None:
        self._tasks: tuple[Task, ...] = tuple(tasks)
        self.name = name
        self._by_id = {task.id: index for index, task in enumerate(self._tasks)}
        if len(self._by_id) != len(self._tasks):
            raise InvalidValue(f"{name}: task ids are not unique")

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return TaskSet(self._tasks[index], name=self.name)
        return self._tasks[index]

    def by_id(self, task_id: str) -> Task:
        """Return the task with this id, or raise ``KeyError`` naming the source."""
        try:
            return self._tasks[self._by_id[task_id]]
        except KeyError:
            raise KeyNotFound(f"{self.name}: no task with id {task_id!r}") from None

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._by_id
        return item in self._tasks

    def split(self, fraction: float, seed: int = 0) -> tuple[TaskSet, TaskSet]:
        """Deterministically split into (first, second) with ``fraction`` of tasks in the first."""
        import random

        order = list(range(len(self._tasks)))
        random.Random(seed).shuffle(order)
        cut = int(round(fraction * len(order)))
        first = [self._tasks[i] for i in sorted(order[:cut])]
        second = [self._tasks[i] for i in sorted(order[cut:])]
        return TaskSet(first, f"{self.name}[:{fraction}]"), TaskSet(second, f"{self.name}[{fraction}:]")


def in_test_split(text: str, test_fraction: float) -> bool:
    """A stable partition by content: True for about ``test_fraction`` of all texts, the same on every machine,
    so generated train and test splits never share a question whatever their seeds."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < test_fraction * 2**64
