"""An LRU cache in front of any `Retriever`.

GRPO samples a group of rollouts per prompt, and the rollouts of a group issue the same searches
(shared/notes/retrieval.md), so repeated (query, k) pairs are answered from memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Hit, Retriever


class CachedRetriever(Retriever):
    """Answers repeated ``(query, k)`` searches from an LRU cache; thread-safe.

    Misses of one batch go to the inner retriever as one batched call (duplicates searched once).
    Results are exact: a cached top-5 is never cut down to answer a top-3.
    """

    def __init__(self, inner: Retriever, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise InvalidValue(f"max_entries must be >= 1, got {max_entries}")
        self.inner = inner
        self.max_entries = max_entries
        self.name = f"cached-{inner.name}"
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[str, int], tuple[Hit, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def num_documents(self) -> int | None:
        """Document count of the inner retriever, when it reports one."""
        return getattr(self.inner, "num_documents", None)

    def __len__(self) -> int:
        """Number of cached (query, k) entries."""
        return len(self._entries)

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        found: dict[str, tuple[Hit, ...]] = {}
        with self._lock:
            for query in queries:
                cached = self._entries.get((query, k))
                if cached is not None:
                    self._entries.move_to_end((query, k))
                    found[query] = cached
        missing = list(dict.fromkeys(query for query in queries if query not in found))
        # The inner search runs outside the lock, so one slow batch does not block the cache hits of others.
        if missing:
            fresh = self.inner.search(missing, k)
            with self._lock:
                for query, hits in zip(missing, fresh, strict=True):
                    found[query] = self._entries[(query, k)] = tuple(hits)
                    self._entries.move_to_end((query, k))
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        with self._lock:
            self.misses += len(missing)
            self.hits += len(queries) - len(missing)
        return [list(found[query]) for query in queries]

    def clear(self) -> None:
        """Forget every cached result (e.g. after the inner index changed)."""
        with self._lock:
            self._entries.clear()

    def close(self) -> None:
        self.clear()
        self.inner.close()
