"""The ``search`` tool: a :class:`~agent_gym.tools.Tool` over any :class:`Retriever`.

Results are shown the way Agent-R1 and Search-R1 show them: one line per hit, ``Doc i (Title: ...) text``.
Each result's metadata lists the retrieved titles; :meth:`SearchTool.evidence` hands them to the env, whose
process rewards and evidence recall match them against the task's supporting titles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_gym.retrieval_index.base import RetrievalError, Retriever
from agent_gym.tools import Tool, ToolResult

__all__ = ["SearchTool", "first_hits", "format_hits"]


def format_hits(hits: Sequence[Any]) -> str:
    """Render hits as numbered ``Doc i (Title: ...) text`` lines."""
    if not hits:
        return "No results found."
    return "\n".join(f"Doc {rank} (Title: {hit.title}) {hit.text}" for rank, hit in enumerate(hits, start=1))


def first_hits(text: str, count: int) -> str:
    """The first ``count`` hits of a result that :func:`format_hits` rendered (other text is returned as it is).

    For code that holds only the rendered text (a transcript's tool message); code that has the step's info reads
    the structured hits of ``info["tool_calls"][i]["hits"]`` instead.
    """
    cut = text.find(f"\nDoc {count + 1} (Title: ") if text.startswith("Doc 1 (Title: ") else -1
    return text if cut < 0 else text[:cut]


class SearchTool(Tool):
    """Search a corpus; the calls of a whole batch go to the retriever as one batched query."""

    timeout_s = None  # remote retrievers enforce their own time-outs and retries

    def __init__(
        self,
        retriever: Retriever,
        *,
        top_k: int = 5,
        name: str = "search",
        description: str = "Search Wikipedia and return the most relevant passages for a query.",
        max_query_chars: int = 512,
        documents: Sequence[Any] | None = None,
    ) -> None:
        self.retriever = retriever
        self.documents = documents  # optional: the corpus's records, for corpus_texts()
        self.top_k = top_k
        self.name = name
        self.description = description
        self.max_query_chars = max_query_chars
        self.parameters = {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to search for, in a few words"}},
            "required": ["query"],
        }

    def corpus_texts(self) -> list[str]:
        """The corpus's pages as text (title, then body), when the tool was given its ``documents``: a
        tokenizer trained for this tool should see every word a search can return."""
        return [f"{document.title} {document.text}" for document in self.documents or ()]

    def run(self, query: str) -> ToolResult:
        return self.run_batch([{"query": query}])[0]

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        results: list[ToolResult | None] = [None] * len(calls)
        queries: list[str] = []
        positions: list[int] = []
        for index, arguments in enumerate(calls):
            query = " ".join(str(arguments["query"]).split())[: self.max_query_chars]
            if not query:
                results[index] = ToolResult.error("the query is empty; search for a few words.")
            else:
                queries.append(query)
                positions.append(index)
        if queries:
            try:
                batches = self.retriever.search(queries, self.top_k)
            except RetrievalError as exc:  # a dead search server is the agent's observation, not a crash
                batches = None
                for index in positions:
                    results[index] = ToolResult.error(f"search is unavailable: {exc}")
            if batches is not None:
                for index, hits in zip(positions, batches, strict=True):
                    results[index] = ToolResult(
                        text=format_hits(hits),
                        metadata={"titles": [hit.title for hit in hits], "ids": [hit.id for hit in hits],
                                  "hits": [{"doc_id": hit.id, "title": hit.title, "text": hit.text,
                                            "score": float(hit.score)} for hit in hits]},
                    )
        return [result for result in results if result is not None]

    def evidence(self, result: ToolResult) -> list[str]:
        """The titles of the pages this search returned."""
        return [str(title) for title in result.metadata.get("titles", ())]

    def close(self) -> None:
        self.retriever.close()
