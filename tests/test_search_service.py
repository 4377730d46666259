"""The search server's parts without HTTP: ``SearchService``'s handlers called directly on decoded bodies.

The HTTP behaviour (status codes, error bodies, limits, deadlines) is tested over real sockets in
tests/test_search_server*.py; these check the same rules one part at a time, in milliseconds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from agent_gym.error import InvalidValue  # noqa: E402
from agent_gym.retrieval_index.base import Hit  # noqa: E402
from agent_gym.retrieval_index.service.server import (  # noqa: E402
    SearchService,
    _HTTPProblem,
    _is_packed,
    _RetrieverHolder,
)


class Echo:
    """k hits per query, each naming the query; ``search`` fails on the query "boom"."""

    name = "echo"
    num_documents = 7

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        if "boom" in queries:
            raise RuntimeError("disk gone")
        return [[Hit(id=f"{q}-{i}", title=q.title(), text=f"about {q}", score=float(k - i)) for i in range(k)]
                for q in queries]

    def close(self) -> None:
        pass


def _service(**limits: int) -> tuple[SearchService, Echo]:
    retriever = Echo()
    holder = _RetrieverHolder(lambda: retriever)
    holder.load()  # synchronously, as the app's loader thread does
    return SearchService(holder, **limits), retriever


def _problem(call) -> _HTTPProblem:  # noqa: ANN001
    with pytest.raises(_HTTPProblem) as caught:
        call()
    return caught.value


def test_search_answers_k_hits_per_query_and_defaults_k():
    service, retriever = _service(default_k=2)
    answer = service.search(service.parse_search({"queries": ["paris", "rome"]}))
    assert [[hit["id"] for hit in hits] for hits in answer["results"]] == [["paris-0", "paris-1"],
                                                                          ["rome-0", "rome-1"]]
    assert answer["results"][0][0] == {"id": "paris-0", "title": "Paris", "text": "about paris", "score": 2.0}
    assert retriever.calls[-1] == (["paris", "rome"], 2)  # the warm-up search came first


def test_the_limits_refuse_with_the_status_the_http_answer_carries():
    service, _ = _service(max_queries=2, max_query_chars=5, default_k=1, max_k=3)
    assert _problem(lambda: service.search_hits(["a"], 4)).status == 422
    too_many = _problem(lambda: service.search_hits(["a", "b", "c"], 1))
    assert (too_many.status, "max_queries=2" in too_many.message) == (413, True)
    too_long = _problem(lambda: service.search_hits(["a", "abcdef"], 1))
    assert (too_long.status, too_long.message.startswith("query 1 has 6 characters")) == (413, True)
    assert service.search_hits([], 1) == []


def test_a_malformed_body_is_a_422_naming_the_expected_shape():
    service, _ = _service()
    problem = _problem(lambda: service.parse_search({"queries": "paris"}))
    assert problem.status == 422 and 'expected JSON {"queries": [str, ...], "k": int}' in problem.message
    assert _problem(lambda: service.parse_search({"queries": [], "extra": 1})).status == 422
    packed = _problem(lambda: service.parse_retrieve({"topk": "3"}, packed=True))
    assert packed.status == 422 and "expected msgpack" in packed.message


def test_a_failing_retriever_is_a_500_and_an_unloaded_one_a_503():
    service, _ = _service()
    assert _problem(lambda: service.search_hits(["boom"], 1)).message == "retriever failed: RuntimeError: disk gone"
    loading = SearchService(_RetrieverHolder(Echo))
    problem = _problem(lambda: loading.search_hits(["x"], 1))
    assert (problem.status, problem.message) == (503, "search index not ready (still loading); retry shortly")
    assert loading.health()[0] == 503 and loading.health()[1]["status"] == "loading"


def test_retrieve_speaks_search_r1_skyrl_and_gem():
    service, _ = _service()
    scored = service.retrieve(service.parse_retrieve({"queries": ["paris"], "topk": 1, "return_scores": True}))
    assert scored == {"result": [[{"document": {"id": "paris-0", "title": "Paris", "text": "about paris",
                                                "contents": '"Paris"\nabout paris'}, "score": 1.0}]]}
    bare = service.retrieve(service.parse_retrieve({"query": "rome", "topk": 0}))  # topk 0: the default k
    assert len(bare["result"]) == 1 and len(bare["result"][0]) == service.default_k
    gem = service.retrieve(service.parse_retrieve({"query": "rome", "topk": 1}, packed=True), packed=True)
    assert gem == {"result": [{"id": "rome-0", "title": "Rome", "text": "about rome",
                               "contents": '"Rome"\nabout rome'}]}
    both = _problem(lambda: service.retrieve(service.parse_retrieve({"query": "a", "queries": ["b"]})))
    assert both.status == 422 and "not both or neither" in both.message


def test_health_reports_the_backend_documents_and_limits():
    service, _ = _service(max_k=9)
    status, payload = service.health()
    assert status == 200
    assert {key: payload[key] for key in ("status", "backend", "documents", "max_k")} == {
        "status": "ok", "backend": "echo", "documents": 7, "max_k": 9}
    assert SearchService(service.holder, documents=3).health()[1]["documents"] == 3  # the manifest's count wins
    failed = _RetrieverHolder(lambda: 1 / 0)
    failed.load()
    assert SearchService(failed).health() == (503, {"status": "error", "error": "ZeroDivisionError: division by zero",
                                                    **SearchService(failed).limits})


def test_limits_and_body_size_are_checked_and_derived():
    with pytest.raises(InvalidValue):
        SearchService(_RetrieverHolder(Echo), default_k=5, max_k=4)
    service = SearchService(_RetrieverHolder(Echo), max_queries=2, max_query_chars=10)
    assert service.max_body_bytes == 2 * (6 * 10 + 8) + 65536


def test_msgpack_is_told_from_json_by_content_type_or_first_byte():
    assert _is_packed(b"\x82\xa5query", "")
    assert _is_packed(b"{}", "application/msgpack")
    assert not any(_is_packed(raw, "") for raw in (b"", b"{}", b"[1]", b" {}", b"\n{}"))
