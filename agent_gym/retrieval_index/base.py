"""The retriever interface every search backend implements (DESIGN §6)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from agent_gym.error import AgentGymError


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float


class RetrievalError(AgentGymError, RuntimeError):
    """A retriever could not answer (dead server, corrupt index, ...)."""


class IndexCorruptError(RetrievalError):
    """An index's files are not the ones its build wrote (cut short by a copy, edited); rebuild it."""


class Retriever(ABC):
    """Batched search over a corpus of ``{"id", "title", "text"}`` documents.

    Implementations must be safe to share between the environments of one process
    (the vector env holds a single instance) and must accept any ``str`` query,
    including empty, huge or punctuation-only ones, without raising.
    """

    name: str = "retriever"

    @abstractmethod
    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """Return the top-``k`` hits for each query, best first."""

    def search_one(self, query: str, k: int = 5) -> list[Hit]:
        """Convenience wrapper for a single query."""
        return self.search([query], k)[0]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files, processes or connections; idempotent."""

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
