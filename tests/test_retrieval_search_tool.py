"""SearchTool: the text the agent reads, and the same hits structured in the result's metadata."""

from __future__ import annotations

from collections.abc import Sequence

from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever
from agent_gym.retrieval_index.search_tool import SearchTool, format_hits

HITS = [Hit("d7", "Paris", "Paris is the capital of France.", 3.5), Hit("d2", "Lyon", "Lyon is a city.", 1.25)]


class FixedRetriever(Retriever):
    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [HITS[:k] for _ in queries]


class DeadRetriever(Retriever):
    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        raise RetrievalError("connection refused")


def test_search_result_metadata_holds_the_shown_hits_in_rank_order() -> None:
    result = SearchTool(FixedRetriever(), top_k=2).run("capital of France")
    assert result.metadata["hits"] == [
        {"doc_id": "d7", "title": "Paris", "text": "Paris is the capital of France.", "score": 3.5},
        {"doc_id": "d2", "title": "Lyon", "text": "Lyon is a city.", "score": 1.25},
    ]


def test_search_result_text_is_the_formatted_hits_byte_for_byte() -> None:
    result = SearchTool(FixedRetriever(), top_k=2).run("capital of France")
    assert result.text == format_hits(HITS)
    assert result.text == "Doc 1 (Title: Paris) Paris is the capital of France.\nDoc 2 (Title: Lyon) Lyon is a city."


def test_batched_calls_each_get_their_own_structured_hits() -> None:
    results = SearchTool(FixedRetriever(), top_k=1).run_batch([{"query": "a"}, {"query": "  "}, {"query": "b"}])
    assert [len(result.metadata.get("hits", [])) for result in results] == [1, 0, 1]
    assert not results[1].ok


def test_unavailable_search_is_a_failed_result_without_hits() -> None:
    result = SearchTool(DeadRetriever()).run("anything")
    assert not result.ok and "hits" not in result.metadata
