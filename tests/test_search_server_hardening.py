"""The search server under careless and hostile clients: a failed load ends `index serve`, replicas die with their
supervisor, malformed bodies get a 4xx in the documented shape, slow connections are cut. Loopback only."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("tantivy")

from test_search_server import (  # noqa: E402
    CORPUS,
    CORPUS_ENV,
    REPO_ROOT,
    TantivyTestRetriever,
    free_port,
    kill_group,
    thread_server,
)

from agent_gym.retrieval_index.service.client import wait_until_ready  # noqa: E402
from agent_gym.retrieval_index.service.server import bind_socket, create_app, uvicorn_config  # noqa: E402

DEEP = b"[" * 100_000 + b"]" * 100_000
# Generous bounds: on a loaded shared machine a process start or a request can take far longer than usual.
PROCESS_S, REQUEST_S = 300, 60


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with TantivyTestRetriever(CORPUS) as retriever, thread_server(lambda: retriever) as base:
        wait_until_ready(base, timeout=30)
        yield base


def _cli(*args: str, corpus: Path | None = None, **popen) -> subprocess.Popen:
    """``agent-gym index serve ARGS`` in its own process group, with the test retriever importable."""
    path = os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, **({CORPUS_ENV: str(corpus)} if corpus else {})}
    return subprocess.Popen([sys.executable, "-m", "agent_gym.cli", "index", "serve", *args], env=env,
                            start_new_session=True, text=True, **popen)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    return path


# -------------------------------------------------------------------------------------------------------
# index serve in the foreground


@pytest.mark.parametrize("how", [["--workers", "1"], ["--workers", "2"], ["--replicas", "1"]],
                         ids=["one-worker", "two-workers", "replicas"])
def test_index_serve_exits_non_zero_with_the_reason_when_the_index_cannot_load(tmp_path: Path, how: list) -> None:
    (tmp_path / "not-an-index").mkdir()
    process = _cli(str(tmp_path / "not-an-index"), "--port", str(free_port()), *how,
                   "--log-level", "warning", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=PROCESS_S)
    finally:
        kill_group(process)
    assert process.returncode not in (0, None)
    assert "manifest" in err and "cannot load the index" in err


def test_index_serve_prints_the_url_it_listens_on(corpus: Path) -> None:
    port = free_port()
    process = _cli("test_search_server:make_test_retriever", "--port", str(port), "--log-level", "warning",
                   corpus=corpus, stdout=subprocess.PIPE)
    try:
        line = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line
        wait_until_ready(f"http://127.0.0.1:{port}", timeout=PROCESS_S)
    finally:
        kill_group(process)


@pytest.mark.slow
def test_replicas_die_with_a_killed_supervisor(corpus: Path) -> None:
    port = free_port()
    supervisor = _cli("test_search_server:make_test_retriever", "--replicas", "1", "--port", str(port),
                      "--log-level", "warning", corpus=corpus, stdout=subprocess.DEVNULL)
    pid = 0
    try:
        pid = wait_until_ready(f"http://127.0.0.1:{port}", timeout=PROCESS_S)["pid"]
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=REQUEST_S)
        deadline = time.monotonic() + REQUEST_S
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        assert not _alive(pid), "the replica outlived its supervisor"
        bind_socket("127.0.0.1", port).close()  # its port is free again
    finally:
        kill_group(supervisor)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


# -------------------------------------------------------------------------------------------------------
# Malformed bodies: always a 4xx whose body is {"error": ...}


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/retrieve", DEEP, {"content-type": "application/json"}, 422, "nested too deeply"),
        ("/retrieve", b'{"queries": ' + DEEP + b"}", {"content-type": "application/json"}, 422, "nested too deeply"),
        ("/retrieve", b"\x91" * 100_000 + b"\xc0", {"content-type": "application/msgpack"}, 422, "nested too deeply"),
        ("/search", DEEP, {"content-type": "application/json"}, 422, "nested too deeply"),
        ("/search", b'{"queries": ["\xff"]}', {"content-type": "application/json"}, 422, "not JSON"),
        ("/search", b"", {"content-type": "application/json"}, 422, "not JSON"),
        ("/search", b"not json", {}, 422, "Content-Type: application/json"),
    ],
    ids=["retrieve-deep", "retrieve-deep-field", "retrieve-deep-msgpack", "search-deep", "search-bad-utf8",
         "search-empty", "search-no-content-type-not-json"],
)
def test_malformed_bodies_get_a_4xx_with_an_error_message(
    url: str, path: str, body: bytes, headers: dict, status: int, message: str
) -> None:
    response = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=REQUEST_S)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert httpx.post(f"{url}/search", json={"queries": ["Paris"]}, timeout=REQUEST_S).status_code == 200


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_json_search_without_a_json_content_type_is_answered(url: str, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{url}/search", content=b'{"queries": ["Seine"], "k": 1}', headers=headers,
                          timeout=REQUEST_S)
    assert response.status_code == 200 and response.json()["results"][0][0]["title"] == "Seine"


def test_unknown_paths_and_methods_answer_in_the_error_shape(url: str) -> None:
    missing, wrong_method = httpx.get(f"{url}/nowhere", timeout=REQUEST_S), httpx.get(f"{url}/search",
                                                                                     timeout=REQUEST_S)
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert missing.json()["error"] and wrong_method.json()["error"]


# -------------------------------------------------------------------------------------------------------
# Slow connections


@contextmanager
def _deadline_server(seconds: float) -> Iterator[int]:
    """A server whose header and body deadlines are ``seconds``; yields its port."""
    import uvicorn

    with TantivyTestRetriever(CORPUS) as retriever:
        app = create_app(lambda: retriever, body_timeout=seconds)
        sock = bind_socket("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn_config(app, log_level="warning", timeout_keep_alive=seconds))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            wait_until_ready(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=REQUEST_S)
            yield sock.getsockname()[1]
        finally:
            server.should_exit = True
            thread.join(timeout=15)
            sock.close()


def _closed_within(connection: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``connection`` within ``seconds``, and what it sent before."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_connections_that_never_finish_their_headers_are_closed() -> None:
    with _deadline_server(1.0) as port:
        connections = [socket.create_connection(("127.0.0.1", port), timeout=REQUEST_S) for _ in range(20)]
        try:
            for index, connection in enumerate(connections):
                if index % 2:
                    connection.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\n")  # then nothing more
            closed = [_closed_within(connection, REQUEST_S)[0] for connection in connections]
        finally:
            for connection in connections:
                connection.close()
        assert all(closed)  # without the deadline none is ever closed


def test_a_trickled_header_does_not_keep_a_connection_open() -> None:
    with _deadline_server(1.0) as port, socket.create_connection(("127.0.0.1", port), timeout=REQUEST_S) as connection:
        closed = False
        for byte in b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.25)
        closed = closed or _closed_within(connection, REQUEST_S)[0]
        assert closed


def test_a_body_that_stops_arriving_gets_408() -> None:
    with _deadline_server(1.0) as port, socket.create_connection(("127.0.0.1", port), timeout=REQUEST_S) as connection:
        connection.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"queries\": ")
        closed, received = _closed_within(connection, REQUEST_S)
    assert received.startswith(b"HTTP/1.1 408")
    assert b"error" in received


def test_a_keep_alive_connection_serves_requests_within_the_deadline() -> None:
    with _deadline_server(5.0) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_S) as client:
        for _ in range(3):
            assert client.post("/search", json={"queries": ["Paris"]}).status_code == 200
            time.sleep(0.5)
