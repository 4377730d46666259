"""Shared fixtures: a tiny fact-lookup tool environment whose every answer can be computed by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agent_gym.env import ToolEnv
from agent_gym.tasks import Hop, Task
from agent_gym.tools import Tool, ToolResult

#: settings that make AgentR1-SynthHop-v0 small enough for unit tests (about a second to build)
SMALL_SYNTHHOP = {"num_pages": 2000, "num_questions": 50}

FACTS = {
    "France": "France is a country whose capital is Paris.",
    "Japan": "Japan is a country whose capital is Tokyo.",
    "Moby Dick": "Moby Dick is a novel written by Herman Melville.",
    "Herman Melville": "Herman Melville was born in New York City.",
}

FACT_TASKS = (
    Task("capital-france", "What is the capital of France?", ("Paris",), supporting_titles=("France",)),
    Task("capital-japan", "What is the capital of Japan?", ("Tokyo", "Tokio"), supporting_titles=("Japan",)),
    Task(
        "melville-birthplace",
        "Where was the author of Moby Dick born?",
        ("New York City", "NYC"),
        supporting_titles=("Moby Dick", "Herman Melville"),
        decomposition=(
            Hop("Who wrote Moby Dick?", "Herman Melville", "Moby Dick", "Moby Dick"),
            Hop("Where was Herman Melville born?", "New York City", "Herman Melville", "Herman Melville"),
        ),
    ),
)


class FactLookup(Tool):
    """Looks a title up in :data:`FACTS`; reports the title it found as retrieved evidence, like search."""

    name = "lookup"
    description = "Look up the encyclopedia entry with this exact title."
    parameters = {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "the entry's title"}},
        "required": ["title"],
    }

    def __init__(self) -> None:
        self.batches: list[int] = []  # size of every run_batch call, so tests can see batching

    def run(self, title: str) -> ToolResult:
        if title not in FACTS:
            return ToolResult(text=f"No entry titled {title!r}.", metadata={"titles": []})
        return ToolResult(text=FACTS[title], metadata={"titles": [title]})

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        self.batches.append(len(calls))
        return [self.run(**arguments) for arguments in calls]

    def evidence(self, result: ToolResult) -> list[str]:
        return list(result.metadata.get("titles", ()))


@pytest.fixture
def make_fact_env() -> Callable[..., ToolEnv]:
    """Build a ToolEnv over :data:`FACT_TASKS` with one :class:`FactLookup`; kwargs are ToolEnv settings."""

    def make(tasks: Sequence[Task] = FACT_TASKS, **settings: Any) -> ToolEnv:
        return ToolEnv(list(tasks), [FactLookup()], **settings)

    return make
