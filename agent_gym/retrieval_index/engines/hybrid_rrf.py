"""Hybrid retrieval: reciprocal-rank fusion (RRF) of two retrievers.

RRF (Cormack, Clarke and Buettcher, SIGIR 2009) scores a document ``sum_r 1 / (k_rrf + rank_r)``
over the rankings that contain it, with ranks from 1 and ``k_rrf = 60`` as in the paper. It
needs no score calibration, so BM25 and cosine scores fuse as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Hit, Retriever

__all__ = ["HybridRetriever", "reciprocal_rank_fusion"]


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], k: int, k_rrf: float = 60.0) -> list[Hit]:
    """Fuse rankings of hits (matched by id) into the top ``k``, each with its RRF score."""
    scores: dict[str, float] = {}
    first_seen: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (k_rrf + rank)
            first_seen.setdefault(hit.id, hit)
    # Stable sort keeps the first ranking's order among ties.
    best = sorted(scores, key=lambda doc_id: -scores[doc_id])[:k]
    return [
        Hit(id=doc_id, title=first_seen[doc_id].title, text=first_seen[doc_id].text, score=scores[doc_id])
        for doc_id in best
    ]


class HybridRetriever(Retriever):
    """Reciprocal-rank fusion of two retrievers over the same corpus (typically BM25 + dense).

    Each retriever is asked for ``max(k, depth)`` hits so that a document ranked just below the
    cut-off by one of them can still win on the fused score.
    """

    name = "hybrid"

    def __init__(self, first: Retriever, second: Retriever, k_rrf: float = 60.0, depth: int = 50):
        if k_rrf <= 0:
            raise InvalidValue(f"k_rrf must be positive, got {k_rrf}")
        self.first, self.second = first, second
        self.k_rrf = float(k_rrf)
        self.depth = int(depth)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        depth = max(k, self.depth)
        first = self.first.search(queries, depth)
        second = self.second.search(queries, depth)
        return [reciprocal_rank_fusion((a, b), k, self.k_rrf) for a, b in zip(first, second, strict=True)]

    def _release(self) -> None:
        self.first.close()
        self.second.close()
