"""The search server, its client and the search cache, over real HTTP on loopback.

The retriever behind the server is a real tantivy BM25 index over a small corpus built here, so these
tests need no other backend. Servers run in a thread (uvicorn on a pre-bound 127.0.0.1 socket) or, where a
test kills or restarts the server, in a subprocess of its own process group.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
tantivy = pytest.importorskip("tantivy")

from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever  # noqa: E402
from agent_gym.retrieval_index.service.client import RemoteRetriever, wait_until_ready  # noqa: E402
from agent_gym.retrieval_index.service.search_cache import CachedRetriever  # noqa: E402
from agent_gym.retrieval_index.service.server import (  # noqa: E402
    FACTORY_ENV,
    INDEX_DIR_ENV,
    SERVER_OPTIONS_ENV,
    app_from_env,
    bind_socket,
    create_app,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_ENV = "AGENT_GYM_TEST_CORPUS"
LOAD_DELAY_ENV = "AGENT_GYM_TEST_LOAD_DELAY"

CORPUS = [
    {"id": "d0", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "d1", "title": "Berlin", "text": "Berlin is the capital of Germany, on the river Spree."},
    {"id": "d2", "title": "Madrid", "text": "Madrid is the capital of Spain and sits on the Manzanares."},
    {"id": "d3", "title": "Rome", "text": "Rome, the Eternal City, is the capital of Italy."},
    {"id": "d4", "title": "Vienna", "text": "Vienna is the capital of Austria, on the Danube."},
    {"id": "d5", "title": "Danube", "text": "The Danube flows through Vienna, Budapest and Belgrade."},
    {"id": "d6", "title": "Seine", "text": "The Seine is a river that flows through Paris."},
    {"id": "d7", "title": "Marie Curie",
     "text": "Marie Curie was a physicist born in Warsaw who won two Nobel prizes."},
    {"id": "d8", "title": "Warsaw", "text": "Warsaw is the capital of Poland, on the Vistula river."},
    {"id": "d9", "title": "Albert Einstein", "text": "Albert Einstein was a physicist born in Ulm, Germany."},
    {"id": "d10", "title": "Ulm", "text": "Ulm is a city on the Danube in Baden-Wuerttemberg."},
    {"id": "d11", "title": "Nobel Prize", "text": "The Nobel Prize is awarded in Stockholm each December."},
]
QUERIES = ["capital of France", "river through Vienna", "physicist born in Warsaw", "Nobel prize city",
           "Einstein birthplace", "capital of Poland river", "Spree", "Eternal City"]


class TantivyTestRetriever(Retriever):
    """A real BM25 retriever: a tantivy index over ``{"id", "title", "text"}`` documents."""

    name = "tantivy-test"

    def __init__(self, documents: Sequence[dict]) -> None:
        schema_builder = tantivy.SchemaBuilder()
        schema_builder.add_text_field("id", stored=True, tokenizer_name="raw")
        schema_builder.add_text_field("title", stored=True)
        schema_builder.add_text_field("text", stored=True)
        self._index = tantivy.Index(schema_builder.build())  # in memory: servers may close it freely
        writer = self._index.writer(heap_size=15_000_000, num_threads=1)
        for doc in documents:
            writer.add_document(tantivy.Document(id=doc["id"], title=doc["title"], text=doc["text"]))
        writer.commit()
        writer.wait_merging_threads()
        self._index.reload()
        self.num_documents = len(documents)

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        searcher = self._index.searcher()
        results = []
        for query in queries:
            parsed, _errors = self._index.parse_query_lenient(query, ["title", "text"])
            hits = []
            for score, address in searcher.search(parsed, k).hits:
                doc = searcher.doc(address)
                hits.append(Hit(doc["id"][0], doc["title"][0], doc["text"][0], float(score)))
            results.append(hits)
        return results


class CountingRetriever(Retriever):
    """Passes searches through to a real retriever and records the queries it was asked."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.name = inner.name
        self.asked: list[str] = []

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        self.asked.extend(queries)
        return self.inner.search(queries, k)


class FailsOnQuery(Retriever):
    """A real retriever that raises for one query: how a backend bug reaches the server."""

    def __init__(self, inner: Retriever, bad_query: str) -> None:
        self.inner = inner
        self.bad_query = bad_query
        self.name = inner.name

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        if self.bad_query in queries:
            raise RuntimeError(f"index shard unreadable while searching {self.bad_query!r}")
        return self.inner.search(queries, k)


def make_test_retriever() -> Retriever:
    """Factory used by subprocess servers (`serve('test_search_server:make_test_retriever')`)."""
    time.sleep(float(os.environ.get(LOAD_DELAY_ENV, "0")))
    path = Path(os.environ[CORPUS_ENV])
    return TantivyTestRetriever([json.loads(line) for line in path.read_text().splitlines() if line])


# -------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def retriever() -> Iterator[TantivyTestRetriever]:
    with TantivyTestRetriever(CORPUS) as built:
        yield built


@contextmanager
def thread_server(
    factory: Callable[[], Retriever] | None, app: object = None, **limits: int
) -> Iterator[str]:
    """Serve ``create_app(factory)`` (or ``app``) from a thread on a free 127.0.0.1 port; yield its URL."""
    import uvicorn

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app or create_app(factory, **limits), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 30 s"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@pytest.fixture
def server_url(retriever: TantivyTestRetriever) -> Iterator[str]:
    with thread_server(lambda: retriever) as url:
        wait_until_ready(url, timeout=30)
        yield url


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    return path


@contextmanager
def subprocess_server(corpus: Path, port: int, workers: int = 1, load_delay: float = 0.0) -> Iterator[
        subprocess.Popen]:
    """Run `serve()` in its own process group (so a kill also reaches uvicorn's workers)."""
    code = ("from agent_gym.retrieval_index.service.server import serve; "
            f"serve('test_search_server:make_test_retriever', port={port}, workers={workers}, "
            "log_level='warning')")
    env = {**os.environ, CORPUS_ENV: str(corpus), LOAD_DELAY_ENV: str(load_delay),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL)  # stderr inherited: pytest shows it on failure
    try:
        yield process
    finally:
        kill_group(process)


def kill_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=15)


# -------------------------------------------------------------------------------------------------------
# Server: endpoints and limits


def test_search_endpoint_returns_the_retrievers_hits_per_query(server_url: str, retriever: Retriever) -> None:
    response = httpx.post(f"{server_url}/search", json={"queries": QUERIES[:3], "k": 2})
    assert response.status_code == 200
    expected = [[{"id": h.id, "title": h.title, "text": h.text, "score": pytest.approx(h.score)}
                 for h in hits] for hits in retriever.search(QUERIES[:3], 2)]
    assert response.json()["results"] == expected


def test_search_uses_default_k_when_request_gives_none(retriever: Retriever) -> None:
    with thread_server(lambda: retriever, default_k=3) as url:
        wait_until_ready(url, timeout=30)
        results = httpx.post(f"{url}/search", json={"queries": ["capital"]}).json()["results"]
    assert len(results[0]) == 3


def test_health_reports_backend_documents_and_limits_when_ready(server_url: str) -> None:
    response = httpx.get(f"{server_url}/health")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["backend"], body["documents"]) == ("ok", "tantivy-test", len(CORPUS))
    assert {"max_queries", "max_query_chars", "max_k", "default_k"} <= body.keys()


def test_server_answers_503_until_the_index_has_loaded_and_warmed(retriever: Retriever) -> None:
    release = threading.Event()

    def slow_factory() -> Retriever:
        release.wait(timeout=30)
        return retriever

    with thread_server(slow_factory) as url:
        loading_health = httpx.get(f"{url}/health")
        loading_search = httpx.post(f"{url}/search", json={"queries": ["Paris"]})
        release.set()
        ready = wait_until_ready(url, timeout=30)
    assert (loading_health.status_code, loading_health.json()["status"]) == (503, "loading")
    assert loading_search.status_code == 503 and "not ready" in loading_search.json()["error"]
    assert ready["status"] == "ok"


def test_failed_index_load_is_reported_by_health_and_wait_until_ready() -> None:
    def broken_factory() -> Retriever:
        raise FileNotFoundError("no manifest.json in /nowhere")

    with thread_server(broken_factory) as url, pytest.raises(RetrievalError, match="no manifest.json"):
        wait_until_ready(url, timeout=30)


def test_retrieve_endpoint_answers_in_search_r1_shape_with_scores(
    server_url: str, retriever: Retriever
) -> None:
    request = {"queries": ["capital of France", "Danube"], "topk": 3, "return_scores": True}
    body = httpx.post(f"{server_url}/retrieve", json=request).json()
    expected = retriever.search(["capital of France", "Danube"], 3)
    assert len(body["result"]) == 2
    for row, hits in zip(body["result"], expected, strict=True):
        assert [item["document"]["contents"] for item in row] == [f'"{h.title}"\n{h.text}' for h in hits]
        assert [item["score"] for item in row] == pytest.approx([h.score for h in hits])
        assert [item["document"]["id"] for item in row] == [h.id for h in hits]


def test_retrieve_endpoint_without_scores_returns_bare_documents(server_url: str) -> None:
    body = httpx.post(f"{server_url}/retrieve", json={"queries": ["Seine"], "topk": 1}).json()
    assert body["result"] == [[{"id": "d6", "title": "Seine", "text": CORPUS[6]["text"],
                                "contents": f'"Seine"\n{CORPUS[6]["text"]}'}]]


def test_skyrl_gyms_own_search_tool_reads_our_retrieve_endpoint(server_url: str) -> None:
    search_tools = pytest.importorskip("skyrl_gym.tools.search", reason="skyrl-gym not installed")
    group = search_tools.SearchToolGroup(search_url=f"{server_url}/retrieve", topk=2, log_requests=False)
    result = json.loads(group.search("Seine"))["result"]  # SkyRL-Gym 0.4.0 posts {"query": "Seine", ...}
    assert result.startswith('Doc 1: "Seine"') and CORPUS[6]["text"] in result


def test_a_msgpack_retrieve_gets_msgpack_back_with_one_querys_hits(server_url: str) -> None:
    msgspec = pytest.importorskip("msgspec")
    body = msgspec.msgpack.encode({"query": "Seine", "topk": 1, "return_scores": True})
    answer = httpx.post(f"{server_url}/retrieve", content=body)  # GEM sends no content type
    result = msgspec.msgpack.decode(answer.content)["result"]
    assert answer.headers["content-type"] == "application/msgpack"
    assert [hit["document"]["title"] for hit in result] == ["Seine"] and result[0]["score"] > 0


def test_a_malformed_msgpack_body_gets_422(server_url: str) -> None:
    answer = httpx.post(f"{server_url}/retrieve", content=b"\x93\x01", headers={"content-type": "application/msgpack"})
    assert answer.status_code == 422 and "msgpack" in answer.json()["error"]


def test_retrieve_refuses_both_query_and_queries(server_url: str) -> None:
    answer = httpx.post(f"{server_url}/retrieve", json={"query": "Seine", "queries": ["Seine"]})
    assert answer.status_code == 422 and "not both or neither" in answer.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 422, "JSON"),
        (json.dumps({"queries": "Paris"}).encode(), 422, "queries"),
        (json.dumps({"queries": ["Paris", 7]}).encode(), 422, "queries.1"),
        (json.dumps({"k": 3}).encode(), 422, "queries"),
        (json.dumps({"queries": ["Paris"], "k": 0}).encode(), 422, "k must be between 1 and 20"),
        (json.dumps({"queries": ["Paris"], "k": 21}).encode(), 422, "k must be between 1 and 20"),
        (json.dumps({"queries": ["Paris"], "k": "5"}).encode(), 422, "k"),
        (json.dumps({"queries": ["Paris"], "topk": 5}).encode(), 422, "topk"),
        (json.dumps({"queries": ["q"] * 9}).encode(), 413, "max_queries=8"),
        (json.dumps({"queries": ["x" * 101]}).encode(), 413, "max_query_chars=100"),
        (json.dumps({"queries": ["x"] * 200_000}).encode(), 413, "exceeds the limit"),
    ],
)
def test_malformed_search_requests_get_4xx_with_a_message(
    retriever: Retriever, body: bytes, status: int, message: str
) -> None:
    with thread_server(lambda: retriever, max_queries=8, max_query_chars=100, max_k=20) as url:
        wait_until_ready(url, timeout=30)
        response = httpx.post(f"{url}/search", content=body, headers={"content-type": "application/json"})
        still_serving = httpx.post(f"{url}/search", json={"queries": ["Paris"]})
    assert response.status_code == status
    assert message in response.json()["error"]
    assert still_serving.status_code == 200


def test_a_chunked_body_over_the_limit_gets_413_before_the_client_has_sent_it(retriever: Retriever) -> None:
    # Transfer-Encoding: chunked carries no Content-Length: the limit must hold while the body is read.
    total_bytes, chunk = 64 << 20, b"x" * (64 << 10)
    with thread_server(lambda: retriever, max_queries=8, max_query_chars=100) as url:
        wait_until_ready(url, timeout=30)
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n")
            sent, answer = 0, b""
            while sent < total_bytes and not answer:
                try:
                    connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:  # the server closed the connection after answering
                    break
                sent += len(chunk)
                if select.select([connection], [], [], 0)[0]:
                    answer = connection.recv(65536)
            if not answer and sent == total_bytes:
                connection.sendall(b"0\r\n\r\n")  # the whole body went through: end it and read the answer
            connection.settimeout(60)
            while b"\r\n\r\n" not in answer:
                more = connection.recv(65536)
                if not more:
                    break
                answer += more
        still_serving = httpx.post(f"{url}/search", json={"queries": ["Paris"]})
    assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the limit" in answer
    assert sent < total_bytes // 4  # answered after the limit (about 70 kB here) plus socket buffers, not 64 MB
    assert still_serving.status_code == 200


def test_retriever_exception_gives_500_and_server_keeps_serving(retriever: Retriever) -> None:
    with thread_server(lambda: FailsOnQuery(retriever, "boom")) as url:
        wait_until_ready(url, timeout=30)
        failed = httpx.post(f"{url}/search", json={"queries": ["Paris", "boom"]})
        after = httpx.post(f"{url}/search", json={"queries": ["Paris"], "k": 1})
    assert failed.status_code == 500
    assert "RuntimeError: index shard unreadable" in failed.json()["error"]
    assert after.json()["results"][0][0]["title"] == "Paris"


def test_empty_and_punctuation_only_queries_are_answered(server_url: str) -> None:
    response = httpx.post(f"{server_url}/search", json={"queries": ["", "?!(){}[]:\"", "   "], "k": 3})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="relies on Linux copying TCP_NODELAY to accepted sockets")
def test_connections_accepted_on_the_server_socket_have_nagle_disabled() -> None:
    listener = bind_socket("127.0.0.1", 0)
    listener.listen(1)
    with socket.create_connection(listener.getsockname(), timeout=5):
        accepted, _ = listener.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        accepted.close()
    listener.close()


def test_bind_socket_names_the_port_when_it_is_taken() -> None:
    taken = bind_socket("127.0.0.1", 0)
    taken.listen(1)
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken.getsockname()[1]}.*--port"):
        bind_socket("127.0.0.1", taken.getsockname()[1])
    taken.close()


# -------------------------------------------------------------------------------------------------------
# Client


def test_remote_retriever_matches_the_served_retriever(server_url: str, retriever: Retriever) -> None:
    with RemoteRetriever(server_url) as remote:
        remote_hits = remote.search(QUERIES, 4)
    local_hits = retriever.search(QUERIES, 4)
    assert remote_hits == local_hits  # JSON round-trips floats exactly


def test_concurrent_clients_each_get_their_own_results(server_url: str, retriever: Retriever) -> None:
    expected = {query: [h.id for h in hits] for query, hits in zip(QUERIES, retriever.search(QUERIES, 3),
                                                                   strict=True)}
    remote = RemoteRetriever(server_url, timeout=20)
    mismatches: list[str] = []
    errors: list[BaseException] = []

    def client(worker: int) -> None:
        try:
            for round_ in range(20):
                # Each thread asks a different rotation, so a mixed-up response would show.
                batch = [QUERIES[(worker + round_ + i) % len(QUERIES)] for i in range(1 + worker % 3)]
                for query, hits in zip(batch, remote.search(batch, 3), strict=True):
                    if [h.id for h in hits] != expected[query]:
                        mismatches.append(query)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    remote.close()
    assert not any(thread.is_alive() for thread in threads)
    assert errors == [] and mismatches == []


def test_remote_retriever_splits_batches_larger_than_the_server_limit(retriever: Retriever) -> None:
    counting = CountingRetriever(retriever)
    queries = [QUERIES[i % len(QUERIES)] + f" {i}" for i in range(11)]
    with thread_server(lambda: counting, max_queries=4) as url, RemoteRetriever(url) as remote:
        wait_until_ready(url, timeout=30)
        results = remote.search(queries, 2)
    assert [[h.id for h in hits] for hits in results] == [[h.id for h in hits] for hits in
                                                          retriever.search(queries, 2)]
    assert counting.asked[1:] == queries  # after the warm-up query, all 11 in order, over 3 requests


def test_remote_retriever_truncates_queries_longer_than_the_server_allows(retriever: Retriever) -> None:
    counting = CountingRetriever(retriever)
    with thread_server(lambda: counting, max_query_chars=50) as url, RemoteRetriever(url) as remote:
        wait_until_ready(url, timeout=30)
        remote.search(["Paris " * 100], 2)
    assert counting.asked[-1] == ("Paris " * 100)[:50]


def test_remote_retriever_sends_queries_with_lone_surrogates(server_url: str) -> None:
    with RemoteRetriever(server_url) as remote:
        hits = remote.search(["capital of France \ud800", "\udfff"], 1)
    assert hits[0][0].title == "Paris" and len(hits) == 2


def test_remote_retriever_rejects_k_above_the_server_max(server_url: str) -> None:
    with RemoteRetriever(server_url) as remote, pytest.raises(ValueError, match="max_k=100"):
        remote.search(["Paris"], 1000)


def test_remote_retriever_survives_pickling(server_url: str) -> None:
    remote = RemoteRetriever(server_url)
    remote.search(["Paris"], 1)
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.search_one("Paris", 1)[0].title == "Paris"
    remote.close()
    copy.close()


def test_no_server_raises_retrieval_error_naming_url_and_start_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    remote = RemoteRetriever(url, timeout=2, retries=2, backoff=0.01)
    with pytest.raises(RetrievalError) as caught:
        remote.search(["Paris"])
    message = str(caught.value)
    assert url in message and "agent-gym index serve" in message and "3 attempt(s)" in message


def test_wait_until_ready_gives_up_after_its_timeout_when_no_server() -> None:
    with pytest.raises(RetrievalError, match="not ready after 0.5 s"):
        wait_until_ready(f"http://127.0.0.1:{free_port()}", timeout=0.5)


def test_server_killed_mid_run_gives_retrieval_error(corpus_file: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with subprocess_server(corpus_file, port) as process:
        wait_until_ready(url, timeout=60)
        remote = RemoteRetriever(url, timeout=3, retries=2, backoff=0.05)
        assert remote.search_one("capital of France", 1)[0].title == "Paris"
        kill_group(process)
        with pytest.raises(RetrievalError, match=f"{url}.*agent-gym index serve"):
            remote.search(["capital of Germany"])
    remote.close()


def test_hung_server_gives_retrieval_error_after_the_timeout(corpus_file: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with subprocess_server(corpus_file, port) as process:
        wait_until_ready(url, timeout=60)
        remote = RemoteRetriever(url, timeout=1, retries=1, backoff=0.05)
        remote.search(["Paris"], 1)
        os.killpg(process.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            with pytest.raises(RetrievalError, match="Timeout.*after 2 attempt"):
                remote.search(["capital of Germany"])
        finally:
            os.killpg(process.pid, signal.SIGCONT)
    remote.close()


def test_a_hung_server_fails_one_search_within_the_default_total_time_limit(hanging_search_server: str) -> None:
    # Before the limit, 4 attempts with a 30 s read timeout each kept one search waiting about two minutes.
    remote = RemoteRetriever(hanging_search_server)
    started = time.monotonic()
    with pytest.raises(RetrievalError, match=f"{hanging_search_server} did not answer within 5 s"):
        remote.search(["capital of Germany"])
    assert time.monotonic() - started < 15  # the limit plus slack for a loaded machine, far below 120 s
    remote.close()


def test_the_total_time_limit_of_a_search_is_configurable(hanging_search_server: str) -> None:
    remote = RemoteRetriever(hanging_search_server, total_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(RetrievalError, match="did not answer within 1 s"):
        remote.search(["capital of Germany"])
    assert time.monotonic() - started < 8
    remote.close()


def test_remote_retriever_refuses_a_non_positive_total_timeout() -> None:
    with pytest.raises(ValueError, match="total_timeout"):
        RemoteRetriever("http://127.0.0.1:8000", total_timeout=0)


def test_client_retries_until_a_restarted_server_answers(corpus_file: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with subprocess_server(corpus_file, port) as process:
        wait_until_ready(url, timeout=60)
        remote = RemoteRetriever(url, timeout=5, retries=10, backoff=0.2)
        remote.search(["Paris"], 1)
        kill_group(process)
    # The new server needs > 1 s to import and bind, then answers 503 while its index loads (1 s):
    # the search below starts while nothing listens and succeeds only by retrying.
    with subprocess_server(corpus_file, port, load_delay=1.0):
        hits = remote.search(["capital of Spain"], 1)
    remote.close()
    assert hits[0][0].title == "Madrid"


def test_server_with_two_worker_processes_answers_searches(corpus_file: Path, retriever: Retriever) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with subprocess_server(corpus_file, port, workers=2):
        wait_until_ready(url, timeout=90)
        with RemoteRetriever(url, timeout=10) as remote:
            hits = remote.search(QUERIES, 2)
    expected = retriever.search(QUERIES, 2)
    assert [[h.id for h in row] for row in hits] == [[h.id for h in row] for row in expected]


# -------------------------------------------------------------------------------------------------------
# Cache


def test_cache_answers_repeated_queries_without_searching_again(retriever: Retriever) -> None:
    counting = CountingRetriever(retriever)
    cache = CachedRetriever(counting, max_entries=100)
    first = cache.search(["Paris", "Danube", "Paris"], 2)
    second = cache.search(["Danube", "Paris"], 2)
    assert counting.asked == ["Paris", "Danube"]
    assert second == [first[1], first[0]]
    assert (cache.hits, cache.misses) == (3, 2)


def test_cache_keys_on_k(retriever: Retriever) -> None:
    cache = CachedRetriever(CountingRetriever(retriever), max_entries=100)
    assert len(cache.search_one("capital", 1)) == 1
    assert len(cache.search_one("capital", 3)) == 3


def test_cache_evicts_the_least_recently_used_entry(retriever: Retriever) -> None:
    counting = CountingRetriever(retriever)
    cache = CachedRetriever(counting, max_entries=2)
    cache.search(["a"], 1)
    cache.search(["b"], 1)
    cache.search(["a"], 1)  # "a" is now the most recent
    cache.search(["c"], 1)  # evicts "b"
    cache.search(["a", "b"], 1)
    assert counting.asked == ["a", "b", "c", "b"]
    assert len(cache) == 2


def test_cache_is_consistent_under_concurrent_searches(retriever: Retriever) -> None:
    cache = CachedRetriever(retriever, max_entries=4)
    expected = {query: retriever.search_one(query, 2) for query in QUERIES}
    wrong: list[str] = []

    def worker(offset: int) -> None:
        for i in range(50):
            query = QUERIES[(offset + i) % len(QUERIES)]
            if cache.search_one(query, 2) != expected[query]:
                wrong.append(query)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert wrong == [] and len(cache) <= 4


def test_app_from_env_serves_the_named_factory_with_limits_and_cache(
    corpus_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "tests"))
    monkeypatch.setenv(CORPUS_ENV, str(corpus_file))
    monkeypatch.delenv(INDEX_DIR_ENV, raising=False)
    monkeypatch.setenv(FACTORY_ENV, "test_search_server:make_test_retriever")
    monkeypatch.setenv(SERVER_OPTIONS_ENV, json.dumps({"max_queries": 3, "cache_entries": 10}))
    with thread_server(None, app=app_from_env()) as url:
        health = wait_until_ready(url, timeout=30)
        too_many = httpx.post(f"{url}/search", json={"queries": ["a", "b", "c", "d"]})
    assert (health["backend"], health["max_queries"]) == ("cached-tantivy-test", 3)
    assert too_many.status_code == 413


@pytest.mark.parametrize("cache_entries", [0, 10])
def test_health_of_a_served_index_directory_reports_its_manifests_document_count(
    corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_entries: int
) -> None:
    build = pytest.importorskip("agent_gym.retrieval_index.build", reason="index backends not present")
    build.build_index(corpus_file, tmp_path / "index", backend="bm25", show_progress=False)
    monkeypatch.setenv(INDEX_DIR_ENV, str(tmp_path / "index"))
    monkeypatch.delenv(FACTORY_ENV, raising=False)
    monkeypatch.setenv(SERVER_OPTIONS_ENV, json.dumps({"cache_entries": cache_entries}))
    with thread_server(None, app=app_from_env()) as url:
        health = wait_until_ready(url, timeout=30)
    assert health["documents"] == len(CORPUS)


def test_app_from_env_without_an_index_says_how_to_start_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INDEX_DIR_ENV, raising=False)
    monkeypatch.delenv(FACTORY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="agent-gym index serve"):
        app_from_env()


# -------------------------------------------------------------------------------------------------------
# CLI


def test_index_serve_cli_defaults_to_loopback_port_8000_one_worker() -> None:
    from agent_gym.cli.index import add_index_serve_arguments

    parser = argparse.ArgumentParser()
    add_index_serve_arguments(parser)
    namespace = parser.parse_args(["some/index"])
    assert (namespace.index, namespace.host, namespace.port, namespace.workers) == ("some/index", "127.0.0.1",
                                                                                   8000, 1)


def test_index_serve_cli_serves_a_built_index_directory(corpus_file: Path, tmp_path: Path) -> None:
    build = pytest.importorskip("agent_gym.retrieval_index.build", reason="index backends not present")
    build.build_index(corpus_file, tmp_path / "index", backend="bm25", show_progress=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    code = ("import argparse; from agent_gym.cli.index import add_index_serve_arguments, "
            "run_index_serve; parser = argparse.ArgumentParser(); add_index_serve_arguments(parser); "
            f"run_index_serve(parser.parse_args([{str(tmp_path / 'index')!r}, '--port', '{port}', "
            "'--workers', '2', '--log-level', 'warning']))")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        wait_until_ready(url, timeout=90)
        with RemoteRetriever(url, timeout=10) as remote:
            hits = remote.search(["capital of France", "physicist born in Warsaw"], 1)
    finally:
        kill_group(process)
    assert [row[0].title for row in hits] == ["Paris", "Marie Curie"]


def test_index_serve_cli_refuses_a_missing_index_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from agent_gym.cli.index import add_index_serve_arguments, run_index_serve

    parser = argparse.ArgumentParser()
    add_index_serve_arguments(parser)
    status = run_index_serve(parser.parse_args([str(tmp_path / "missing"), "--port", str(free_port())]))
    assert status == 2
    assert "agent-gym index build" in capsys.readouterr().out
