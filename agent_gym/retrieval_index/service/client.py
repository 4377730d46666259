"""`RemoteRetriever`: the client of the search server (``agent-gym index serve``), docs/DESIGN.md §6."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent_gym.error import InvalidType, InvalidValue
from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever

# 5xx are retried: 503 while the index loads, 502/504 from a proxy, 500 from a failed search.
_RETRIABLE_STATUS = frozenset({500, 502, 503, 504})
_MAX_BACKOFF_S = 8.0
# One search call waits at most this long by default: a step of an env must not hang on a stopped server
# (measured before this bound: 123.6 s, four attempts of a 30 s read timeout), while a busy server still has
# time for a large batch and a fleet for a failover (the slowest search of the fleet load test, a replica
# killed under 64 clients with one replica: 3.7 s; benchmarks/README.md).
DEFAULT_TOTAL_TIMEOUT_S = 5.0
# Bodies are read in chunks so that the deadline also holds against a server that trickles its answer.
_READ_CHUNK_BYTES = 1 << 16


def _normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    for suffix in ("/search", "/retrieve", "/health"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def _start_hint(url: str) -> str:
    port = urlsplit(url).port or 8000
    return f"start one with `agent-gym index serve INDEX_DIR --port {port}`, or check the URL"


def _sendable(query: str, max_chars: int | None) -> str:
    # Lone surrogates ("\ud800", which LLM output can hold) cannot be encoded as UTF-8 JSON: replace them.
    return str(query)[:max_chars].encode("utf-8", "replace").decode("utf-8")


def _error_message(body: bytes) -> str:
    try:
        decoded = json.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", "replace")
    if isinstance(decoded, dict):
        return str(decoded.get("error") or decoded.get("detail") or decoded)[:500]
    return str(decoded)[:500]


@dataclass
class _Replica:
    """One server of the fleet, as this process sees it."""

    url: str
    pending: int = 0  # requests in flight to it
    down: bool = False  # failed or timed out: out of rotation until a /health probe answers 200
    problem: str = ""  # why it went down


class RemoteRetriever(Retriever):
    """A `Retriever` answered by one search server, or by a fleet of replicas of it, over HTTP (keep-alive,
    batched ``POST /search``).

    - ``url``: one server, several (a sequence, or one string of comma-separated URLs): replicas serving the
      same index, e.g. from ``agent-gym index serve --replicas N``. Each request goes to the healthy replica with
      the fewest requests in flight from this process (round-robin among equals). A replica that fails
      (connection error, timeout, 5xx) leaves the rotation at once and the request moves on to another; a
      background probe (``GET /health`` every ``probe_interval`` seconds) puts it back once it answers 200.
      Only when every replica is down does a search retry with backoff, and it raises when none answered.
    - Batches larger than the server's ``max_queries`` are split; queries longer than its
      ``max_query_chars`` are truncated (a retriever must accept any string), as /health reports.
    - With every replica down, connection errors, timeouts and 5xx are retried ``retries`` times with
      exponential backoff (``backoff``, ``2 * backoff``, ... seconds, at most 8 s); then a `RetrievalError` names
      the URL(s) and how to start a server. 4xx are not retried.
    - ``timeout`` bounds each attempt (with several replicas, also half of ``total_timeout``, so a hung replica
      leaves time to ask another); ``total_timeout`` bounds one whole :meth:`search` call, attempts, pauses and
      split batches included. A server that stops answering but keeps its connections open (stopped,
      deadlocked) costs the caller at most ``total_timeout`` seconds, then a `RetrievalError`.
    - One instance is safe to share between threads, and can be pickled (to subprocess vector envs, Ray
      actors): each process opens its own connection pool and keeps its own view of the replicas.
    """

    def __init__(self, url: str | Sequence[str], timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 total_timeout: float = DEFAULT_TOTAL_TIMEOUT_S, probe_interval: float = 1.0) -> None:
        if timeout <= 0 or retries < 0 or backoff < 0 or total_timeout <= 0 or probe_interval <= 0:
            raise InvalidValue(f"need timeout > 0, retries >= 0, backoff >= 0, total_timeout > 0, probe_interval > 0; "
                             f"got {timeout}, {retries}, {backoff}, {total_timeout}, {probe_interval}")
        urls = url.split(",") if isinstance(url, str) else list(url)
        urls = [_normalise_url(one) for one in urls if one.strip()]
        if not urls:
            raise InvalidValue("RemoteRetriever needs at least one server URL")
        self.urls = urls
        self.url = ",".join(urls)
        self.timeout = timeout
        self.total_timeout = total_timeout
        self.retries = retries
        self.backoff = backoff
        self.probe_interval = probe_interval
        self.name = f"remote:{self.url}"
        self._health: dict[str, Any] | None = None
        self._client: httpx.Client | None = None
        self._client_pid = -1
        self._lock = threading.Lock()
        self._reset_fleet_state()

    def _reset_fleet_state(self) -> None:
        self._replicas = [_Replica(url) for url in self.urls]
        self._turn = 0  # round-robin position among equally loaded replicas
        self._fleet_lock = threading.Lock()
        self._probe_thread: threading.Thread | None = None
        self._closed = threading.Event()

    # -- connection management ---------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        with self._lock:
            # A forked child must not reuse the parent's sockets.
            if self._client is None or self._client_pid != os.getpid():
                self._client = httpx.Client(timeout=self.timeout, trust_env=False)
                self._client_pid = os.getpid()
            return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"], state["_client_pid"], state["_lock"] = None, -1, None
        for key in ("_replicas", "_turn", "_fleet_lock", "_probe_thread", "_closed"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._reset_fleet_state()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._client is not None and self._client_pid == os.getpid():
                self._client.close()
            self._client = None

    # -- the fleet -----------------------------------------------------------------------------------------

    def replicas_up(self) -> list[str]:
        """The URLs in rotation now (as this process sees them)."""
        with self._fleet_lock:
            return [replica.url for replica in self._replicas if not replica.down]

    def _acquire(self) -> tuple[_Replica, bool]:
        """The replica for the next attempt, counted as pending: the least-loaded one in rotation (round-robin
        among equals), or, with none in rotation, the one that went down first; and whether it was in rotation."""
        with self._fleet_lock:
            count = len(self._replicas)
            order = [self._replicas[(self._turn + offset) % count] for offset in range(count)]
            self._turn = (self._turn + 1) % count
            healthy = [replica for replica in order if not replica.down]
            replica = min(healthy, key=lambda one: one.pending) if healthy else order[0]
            replica.pending += 1
            return replica, bool(healthy)

    def _release(self, replica: _Replica, problem: str | None) -> None:
        """End an attempt: a problem takes the replica out of rotation (and starts the probe), success puts it
        back."""
        with self._fleet_lock:
            replica.pending -= 1
            if problem is None:
                replica.down = False
                return
            replica.down, replica.problem = True, problem
            if len(self._replicas) > 1 and (self._probe_thread is None or not self._probe_thread.is_alive()):
                self._probe_thread = threading.Thread(target=self._probe_down_replicas, name="search-probe",
                                                      daemon=True)
                self._probe_thread.start()

    def _probe_down_replicas(self) -> None:
        """Ask each replica out of rotation for /health until every one is back (or the retriever closes)."""
        while not self._closed.wait(self.probe_interval):
            with self._fleet_lock:
                down = [replica for replica in self._replicas if replica.down]
            if not down:
                return
            for replica in down:
                try:
                    answer = self._http().get(f"{replica.url}/health", timeout=min(self.timeout, 2.0))
                except httpx.HTTPError:
                    continue
                if answer.status_code == 200:
                    with self._fleet_lock:
                        replica.down = False

    # -- requests ------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: dict | None = None, deadline: float | None = None) -> Any:
        """Send one request, failing over between replicas and retrying when all are down, all before
        ``deadline`` (``time.monotonic()``; default: now + ``total_timeout``); return the decoded JSON body of a
        2xx answer."""
        deadline = time.monotonic() + self.total_timeout if deadline is None else deadline
        # With replicas, one hung replica must leave time to ask another.
        attempt_timeout = self.timeout if len(self._replicas) == 1 else min(self.timeout, self.total_timeout / 2)
        problem, tried, retried = "", 0, 0
        url = self.urls[0]
        while True:
            replica, in_rotation = self._acquire()
            if not in_rotation and tried:  # every replica is down: a retry, after a pause
                if retried >= self.retries:
                    self._release(replica, problem)
                    break
                retried += 1
                pause = min(self.backoff * 2 ** (retried - 1), _MAX_BACKOFF_S)
                # Keep room for one last attempt rather than sleeping through the deadline.
                time.sleep(max(0.0, min(pause, deadline - time.monotonic() - 0.5)))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._release(replica, None if in_rotation else problem)
                break
            tried += 1
            url = replica.url
            try:
                status, body = self._send(method, f"{url}{path}", payload, min(attempt_timeout, remaining),
                                          deadline)
            except httpx.TransportError as exc:
                problem = f"unreachable ({type(exc).__name__}: {exc or 'no detail'})"
                self._release(replica, problem)
                continue
            except TimeoutError:
                problem = "sent no complete answer in time"
                self._release(replica, problem)
                continue
            if status in _RETRIABLE_STATUS:
                problem = f"answered HTTP {status}: {_error_message(body)}"
                self._release(replica, problem)
                continue
            self._release(replica, None)
            if status >= 400:
                raise RetrievalError(f"search server at {url} rejected {method} {path} with HTTP "
                                     f"{status}: {_error_message(body)}")
            try:
                return json.loads(body)
            except ValueError as exc:
                raise RetrievalError(f"search server at {url} sent a body that is not JSON: "
                                     f"{body[:200]!r}") from exc
        where = f"search server at {url}" if len(self.urls) == 1 else \
            f"none of the {len(self.urls)} search servers {self.url}; last, {url},"
        if time.monotonic() >= deadline:
            raise RetrievalError(f"{where} did not answer within {self.total_timeout:g} s "
                                 f"(total_timeout; {tried} attempt(s), last: {problem or 'no answer'}); "
                                 f"{_start_hint(url)}")
        raise RetrievalError(f"{where} {problem} after {tried} attempt(s); {_start_hint(url)}")

    def _send(self, method: str, url: str, payload: dict | None, timeout: float,
              deadline: float) -> tuple[int, bytes]:
        """One attempt: (status, body). Raises ``TimeoutError`` when the body is still arriving at ``deadline``."""
        with self._http().stream(method, url, json=payload, timeout=timeout) as response:
            chunks = []
            for chunk in response.iter_bytes(_READ_CHUNK_BYTES):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError
            return response.status_code, b"".join(chunks)

    def health(self, deadline: float | None = None) -> dict[str, Any]:
        """The server's /health answer (backend, document count, limits); cached after the first call."""
        if self._health is None:
            self._health = self._request("GET", "/health", deadline=deadline)
        return self._health

    @property
    def num_documents(self) -> int | None:
        """Documents in the served index, as the server reports."""
        return self.health().get("documents")

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise InvalidType("search takes a sequence of queries; use search_one for a single string")
        queries = list(queries)
        if not queries:
            return []
        deadline = time.monotonic() + self.total_timeout
        limits = self.health(deadline)
        max_k = int(limits.get("max_k", k))
        if not 1 <= k <= max_k:
            raise InvalidValue(f"k must be between 1 and the server's max_k={max_k}, got {k}")
        max_chars = int(limits.get("max_query_chars", 0)) or None
        chunk = max(1, int(limits.get("max_queries", len(queries))))
        results: list[list[Hit]] = []
        for start in range(0, len(queries), chunk):
            batch = [_sendable(query, max_chars) for query in queries[start : start + chunk]]
            body = self._request("POST", "/search", {"queries": batch, "k": k}, deadline)
            try:
                rows = body["results"]
                results.extend([Hit(str(hit["id"]), hit["title"], hit["text"], float(hit["score"] or 0.0))
                                for hit in row] for row in rows)
            except (KeyError, TypeError, ValueError) as exc:
                raise RetrievalError(f"search server at {self.url} sent an unexpected /search answer "
                                     f"({type(exc).__name__}: {exc})") from exc
            if len(rows) != len(batch):
                raise RetrievalError(f"search server at {self.url} answered {len(rows)} result lists for "
                                     f"{len(batch)} queries")
        return results


def wait_until_ready(url: str, timeout: float = 60.0, poll_interval: float = 0.2) -> dict[str, Any]:
    """Poll ``GET /health`` until the server at ``url`` is warm; return its health report.

    Raises `RetrievalError` when ``timeout`` seconds pass first, or at once when the server reports
    that loading its index failed.
    """
    base = _normalise_url(url)
    deadline = time.monotonic() + timeout
    problem = "no answer"
    with httpx.Client(timeout=min(5.0, max(timeout, 0.1)), trust_env=False) as http:
        while True:
            try:
                response = http.get(f"{base}/health")
                body = response.json() if response.headers.get("content-type", "").startswith(
                    "application/json") else {}
                if response.status_code == 200:
                    return body
                if body.get("status") == "error":
                    raise RetrievalError(f"search server at {base} failed to load its index: "
                                         f"{body.get('error')}")
                problem = f"HTTP {response.status_code} ({body.get('status', response.text[:100])})"
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc or 'no detail'}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RetrievalError(f"search server at {base} not ready after {timeout:g} s "
                                     f"(last: {problem}); {_start_hint(base)}")
            time.sleep(min(poll_interval, remaining))
