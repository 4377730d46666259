"""Naive RAG with a model, the paper's baseline: one search on the question, then the model answers.

The first turn is scripted (the ``naive-rag`` policy's call: the question verbatim as the query); every later
turn is the model's, reading the search results in its context. Play it with ``max_turns=2`` for the paper's
setting, a single retrieval then the answer (`agent-gym eval --model M --naive-rag` does).
"""

from __future__ import annotations

from typing import Any

from agent_gym.policies import make_policy

__all__ = ["ModelNaiveRAGPolicy"]


class ModelNaiveRAGPolicy:
    """A :class:`~agent_gym.agents.model_policy.ModelPolicy` whose first turn searches the question."""

    def __init__(self, model_policy: Any) -> None:
        self.model_policy = model_policy
        self.search = make_policy("naive-rag")
        self.turn = 0

    def __getattr__(self, name: str) -> Any:  # generated_tokens, generation_seconds... of the model
        return getattr(self.__dict__["model_policy"], name)

    def check_env(self, env: Any, tasks: Any = None) -> None:
        check = getattr(self.search, "check_env", None)
        if callable(check):
            check(env, tasks)

    def begin(self, env: Any, observation: str, info: dict[str, Any]) -> None:
        self.turn = 0
        self.search.begin(env, observation, info)
        self.model_policy.begin(env, observation, info)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        self.turn += 1
        return self.search.act(observation, info) if self.turn == 1 else self.model_policy.act(observation, info)
