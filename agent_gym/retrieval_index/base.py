"""The retriever interface every search backend implements (docs/DESIGN.md §6), and the code they share.

:class:`Retriever` owns what every backend does alike: it refuses searches after :meth:`close`,
checks ``k``, answers ``k = 0`` without searching, and closes the document store on
:meth:`close`. A backend implements :meth:`Retriever._search` (and :meth:`Retriever._release`
when it holds more than a document store). The query helpers here (:func:`clean_query`,
:func:`map_batch`...) are the ones all backends use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from agent_gym.error import AgentGymError, InvalidValue

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "PARALLEL_MIN_BATCH",
    "Hit",
    "IndexCorruptError",
    "RetrievalError",
    "Retriever",
    "check_k",
    "clean_query",
    "default_threads",
    "documents_list",
    "map_batch",
    "map_chunks",
]

# Lucene refuses boolean queries over 1,024 clauses; ~8k characters stays well under that for
# any backend while keeping every realistic query whole.
MAX_QUERY_CHARS = 8192
# Lucene's default BooleanQuery clause limit.
MAX_QUERY_TERMS = 1024

# Batches at least this long are spread over threads. The engines mostly release the GIL while
# scoring (measured: a pure-Python loop keeps 80-100% of its speed beside a searching thread).
PARALLEL_MIN_BATCH = 16

T = TypeVar("T")
R = TypeVar("R")


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


def check_k(k: int) -> int:
    """``k`` itself if it is a non-negative ``int``; else ``ValueError``."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InvalidValue(f"k must be a non-negative int, got {k!r}")
    return k


def clean_query(query: object) -> str:
    """Make any query safe to analyze: a ``str``, valid UTF-8, at most :data:`MAX_QUERY_CHARS`."""
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    elif not isinstance(query, str):
        query = str(query)
    query = query[:MAX_QUERY_CHARS]
    # Lone surrogates ("\ud800") cannot cross into Rust or Java; replace them.
    return query.encode("utf-8", "replace").decode("utf-8")


def default_threads() -> int:
    """Threads used for batched search: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def map_batch(function: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """``[function(x) for x in items]``, on a thread pool when the batch is large enough to pay."""
    if threads <= 1 or len(items) < PARALLEL_MIN_BATCH:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(function, items))


def map_chunks(function: Callable[[Sequence[T]], list[R]], items: Sequence[T], threads: int) -> list[R]:
    """``function(items)``, split into ``threads`` contiguous chunks run on a thread pool when that pays."""
    if threads <= 1 or len(items) < PARALLEL_MIN_BATCH:
        return function(items)
    size = -(-len(items) // threads)
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        return [result for part in pool.map(function, chunks) for result in part]


def documents_list(docs: Iterable[Any]) -> list[Any]:
    """``docs`` as a list; ``ValueError`` if there are none (no backend indexes an empty corpus)."""
    docs = docs if isinstance(docs, list) else list(docs)
    if not docs:
        raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
    return docs


class Retriever:
    """Batched search over a corpus of ``{"id", "title", "text"}`` documents.

    Implementations must be safe to share between the environments of one process
    (the vector env holds a single instance) and must accept any ``str`` query,
    including empty, huge or punctuation-only ones, without raising.

    A backend implements :meth:`_search`, which sees a list of queries and ``k >= 1``; or, when it
    has its own checks (a remote client, a cache), overrides :meth:`search` itself.
    """

    name: str = "retriever"
    _closed: bool = False
    _docs: Sequence[Any] | None = None

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """Return the top-``k`` hits for each query, best first."""
        if self._closed:
            raise RetrievalError(f"search on a closed {type(self).__name__} retriever")
        k = check_k(k)
        queries = list(queries)
        if k == 0 or not queries:
            return [[] for _ in queries]
        return self._search(queries, k)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The backend's search of a non-empty batch, ``k >= 1``."""
        raise NotImplementedError(f"{type(self).__name__} implements neither search nor _search")

    def search_one(self, query: str, k: int = 5) -> list[Hit]:
        """Convenience wrapper for a single query."""
        return self.search([query], k)[0]

    def close(self) -> None:
        """Release files, processes or connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        closer = getattr(self._docs, "close", None)  # a DocStore's memory map; lists have none
        if callable(closer):
            closer()
        self._release()

    def _release(self) -> None:  # noqa: B027 - optional hook
        """What a backend frees beyond its document store (runs once, from :meth:`close`)."""

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
