"""A search fleet: `RemoteRetriever` over several replicas (balance, failover, probe back), and
`agent-gym index serve --replicas N` restarting a killed replica."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from test_search_server import (
    CORPUS,
    CORPUS_ENV,
    QUERIES,
    REPO_ROOT,
    CountingRetriever,
    TantivyTestRetriever,
    free_port,
    thread_server,
)

from agent_gym.retrieval_index.base import RetrievalError
from agent_gym.retrieval_index.service.client import RemoteRetriever, wait_until_ready
from agent_gym.retrieval_index.service.server import bind_socket, create_app


@pytest.fixture(scope="module")
def backend() -> TantivyTestRetriever:
    return TantivyTestRetriever(CORPUS)


@contextmanager
def server_on_port(factory, port: int) -> Iterator[str]:
    """`thread_server` on a chosen port (a replica restarted where it was)."""
    import uvicorn

    sock = bind_socket("127.0.0.1", port)
    server = uvicorn.Server(uvicorn.Config(create_app(factory), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, timeout=30)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def _wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_comma_separated_urls_are_one_fleet() -> None:
    remote = RemoteRetriever("127.0.0.1:8001, http://127.0.0.1:8002/search")
    assert remote.urls == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_searches_are_spread_over_the_replicas(backend) -> None:
    first, second = CountingRetriever(backend), CountingRetriever(backend)
    with thread_server(lambda: first) as url_a, thread_server(lambda: second) as url_b:
        wait_until_ready(url_a, timeout=30)
        wait_until_ready(url_b, timeout=30)
        with RemoteRetriever([url_a, url_b]) as remote:
            for query in QUERIES * 2:
                remote.search([query], 2)
    # One at a time, both replicas idle: round-robin sends 8 of the 16 searches to each (after each warm-up).
    assert (len(first.asked) - 1, len(second.asked) - 1) == (8, 8)


def test_a_dead_replica_leaves_the_rotation_and_no_search_fails(backend) -> None:
    with thread_server(lambda: backend) as alive:
        wait_until_ready(alive, timeout=30)
        dead = f"http://127.0.0.1:{free_port()}"
        with RemoteRetriever([dead, alive], retries=0) as remote:
            results = [remote.search([query], 1) for query in QUERIES]
            assert remote.replicas_up() == [alive]
    assert all(len(hits[0]) == 1 for hits in results)


def test_a_hung_replica_fails_over_within_the_time_limit(backend, hanging_search_server: str) -> None:
    with thread_server(lambda: backend) as alive:
        wait_until_ready(alive, timeout=30)
        with RemoteRetriever([hanging_search_server, alive], total_timeout=4.0) as remote:
            remote._health = {"max_k": 100}  # /health of the hung server answers; start with the searches
            hits = [remote.search_one(query, 1) for query in QUERIES[:2]]
            assert remote.replicas_up() == [alive]
    assert hits[0][0].title == "Paris"


def test_a_replica_that_comes_back_is_probed_back_into_rotation(backend) -> None:
    port = free_port()
    with thread_server(lambda: backend) as alive:
        wait_until_ready(alive, timeout=30)
        with RemoteRetriever([f"http://127.0.0.1:{port}", alive], probe_interval=0.1) as remote:
            remote.search(QUERIES, 1)  # the first replica is not up yet: out of rotation
            assert remote.replicas_up() == [alive]
            counting = CountingRetriever(backend)
            with server_on_port(lambda: counting, port):
                assert _wait_for(lambda: len(remote.replicas_up()) == 2)
                for query in QUERIES:
                    remote.search([query], 1)
    assert len(counting.asked) > 1  # beyond its warm-up query, it served searches again


def test_with_every_replica_down_a_search_raises_naming_them() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    remote = RemoteRetriever(urls, retries=1, backoff=0.01)
    with pytest.raises(RetrievalError, match="none of the 2 search servers .*agent-gym index serve"):
        remote.search(["Paris"])
    remote.close()


@pytest.mark.slow
def test_index_serve_with_replicas_restarts_a_killed_replica(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    port = free_port()
    while True:  # two consecutive free ports
        try:
            bind_socket("127.0.0.1", port + 1).close()
            break
        except OSError:
            port = free_port()
    env = {**os.environ, CORPUS_ENV: str(corpus),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "agent_gym.cli", "index", "serve", "test_search_server:make_test_retriever",
         "--replicas", "2", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, text=True)
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    try:
        assert supervisor.stdout.readline().strip() == f"search replicas: {','.join(urls)}"
        pids = [wait_until_ready(url, timeout=60)["pid"] for url in urls]
        os.kill(pids[1], signal.SIGKILL)
        with RemoteRetriever(",".join(urls), retries=0) as remote:
            assert remote.search_one("capital of France", 1)[0].title == "Paris"  # the other replica answers

        def restarted() -> bool:
            try:
                return httpx.get(f"{urls[1]}/health", timeout=1).json().get("pid") not in (None, pids[1])
            except (httpx.HTTPError, ValueError):
                return False

        assert _wait_for(restarted, timeout=60)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)
    assert not any(_answers(url) for url in urls)  # the supervisor took its replicas down with it


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return True


def _fleet_env(tmp_path: Path) -> dict[str, str]:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    return {**os.environ, CORPUS_ENV: str(corpus),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}


def test_index_serve_with_replicas_on_a_taken_port_gives_up_at_once(tmp_path: Path) -> None:
    # It used to print URLs naming the other program's port, then log "restarting it in 1 s" and
    # "Address already in use" every second until killed.
    taken = bind_socket("127.0.0.1", 0)
    taken.listen()
    port = taken.getsockname()[1] - 1
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agent_gym.cli", "index", "serve", "test_search_server:make_test_retriever",
             "--replicas", "2", "--port", str(port)],
            env=_fleet_env(tmp_path), capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert done.returncode == 2
    assert done.stdout == ""  # no URLs printed
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"agent-gym index serve: error: cannot listen on 127.0.0.1:{port + 1}: ")
    assert f"ports {port}..{port + 1}" in done.stderr


def test_a_replica_that_cannot_bind_stops_the_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The port is free when the supervisor checks it and taken when the replica starts (another program won
    # the race, or took the port of a killed replica): the supervisor stops the others instead of restarting
    # that replica forever.
    from agent_gym.retrieval_index.service.replicas import ReplicaFailedError, ReplicaSupervisor, serve_command

    for name, value in _fleet_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    taken = bind_socket("127.0.0.1", 0)
    taken.listen()
    ports = [free_port(), taken.getsockname()[1]]
    supervisor = ReplicaSupervisor(
        lambda port: serve_command("test_search_server:make_test_retriever", "127.0.0.1", port,
                                   ["--log-level", "warning"]), ports, restart_delay=0.1)
    started = time.monotonic()
    try:
        with pytest.raises(ReplicaFailedError, match=f"replica on port {ports[1]} exited with a usage error"):
            supervisor.run(poll_interval=0.1)
    finally:
        taken.close()
    assert time.monotonic() - started < 60
    assert [child.restarts for child in supervisor.children] == [0, 0]
    assert all(child.process.poll() is not None for child in supervisor.children)  # the other one stopped too
