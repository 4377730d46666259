"""HTTP search server: put any `Retriever` behind FastAPI + uvicorn (docs/DESIGN.md §6).

Endpoints:
- ``POST /search``   ``{"queries": [...], "k": 5}`` ->
  ``{"results": [[{"id", "title", "text", "score"}, ...], ...]}``
- ``POST /retrieve`` Search-R1's shape, so envs written for Search-R1, SkyRL-Gym or GEM can use this server:
  ``{"queries": [...], "topk": 3, "return_scores": true}`` ->
  ``{"result": [[{"document": {"id", "title", "text", "contents"}, "score": s}, ...], ...]}``
  (without ``return_scores`` each hit is the bare document, as in Search-R1's ``retrieval_server.py``).
  SkyRL-Gym 0.4.0's search tool posts one ``"query": "..."`` instead of ``queries``; it is read as a batch of one.
  GEM's search tool (gem-llm 0.1.0) posts the same fields as msgpack and reads msgpack back: a msgpack request
  gets a msgpack answer, and for one ``query`` its ``result`` is that query's list of hits, as GEM's server sends.
- ``GET /health``   200 ``{"status": "ok", "backend", "documents", "pid", ...limits}`` once the index is loaded
  and a first search has run (``documents`` from the index's manifest); 503 while loading or after a failed load.

A request body larger than any valid request is refused with 413 as soon as it passes the limit, with or
without ``Content-Length``. Every error is ``{"error": message}`` (422 for a malformed body, JSON sent with any
Content-Type is read as JSON). Slow clients are cut: a request head must arrive within 30 s of connecting (or of
the last response, ``http_deadline.py``), a body within 30 s of its head (408).

In the foreground (``serve``, ``agent-gym index serve``) an index that fails to load ends the server with the
reason and a non-zero status; an app from ``create_app`` keeps answering 503 and reports it on ``/health``.

Design choices measured in ``shared/notes/retrieval.md``: batch queries per request (1 query/request tops
out near 2-3k q/s on loopback, 16/request reaches 7-10k); worker processes over a memory-mapped index rather
than threads (threads gave at most 1.3x); a large listen backlog (the default of 5 reset connections at 32
clients); ``TCP_NODELAY`` (Nagle cost 44 ms/request). uvicorn alone does not guarantee the last one: its
multi-worker socket has protocol 0, so asyncio leaves Nagle on for accepted connections (measured: 44-48 ms
per request with 2 h11 workers), hence :func:`bind_socket`. httpx's client sets ``TCP_NODELAY`` itself.
"""

# No `from __future__ import annotations`: FastAPI must resolve the request models, which are built on first use
# by _request_models (so importing this module for the CLI does not need fastapi).
import functools
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent_gym.error import AgentGymError, InvalidValue
from agent_gym.retrieval_index.base import Hit, Retriever
from agent_gym.retrieval_index.service.http_body_limit import BodySizeLimit

logger = logging.getLogger(__name__)

# Worker processes re-create the app from these environment variables (uvicorn needs an import string
# to start more than one worker, so the app cannot be handed over as an object).
INDEX_DIR_ENV = "AGENT_GYM_INDEX_DIR"
FACTORY_ENV = "AGENT_GYM_RETRIEVER_FACTORY"
SERVER_OPTIONS_ENV = "AGENT_GYM_SERVER_OPTIONS"
APP_FROM_ENV = "agent_gym.retrieval_index.service.server:app_from_env"

DEFAULT_MAX_QUERIES = 512
DEFAULT_MAX_QUERY_CHARS = 2048
DEFAULT_K = 5  # Agent-R1 retrieves the top 5 passages per search
DEFAULT_MAX_K = 100
WARMUP_QUERY = "warm up the index"
REQUEST_TIMEOUT_S = 30.0  # the longest a request head, or a request body, may take to arrive
STARTUP_FAILURE = 3  # uvicorn's exit status for a worker that failed to start: its supervisor then stops
SUPERVISOR_PID_ENV = "AGENT_GYM_SUPERVISOR_PID"  # set by `--replicas`: a replica stops when that process is gone


@dataclass(kw_only=True)
class ServeConfig:
    """How ``agent-gym index serve`` serves an index (its flags come from these fields): ``serve(config.index,
    host=config.host, port=config.port, workers=config.workers, ..., cache_entries=config.cache)``; ``replicas``
    runs that many supervised servers on consecutive ports (``replicas.ReplicaSupervisor``)."""

    index: str = field(metadata={"positional": True, "help": "index directory (from `agent-gym index build`), or "
                                                             "'module:function' naming a factory that returns a "
                                                             "Retriever"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "interface to listen on (default: loopback only; 0.0.0.0 exposes the index to the network, "
                "unauthenticated)"})
    port: int = field(default=8000, metadata={"help": "TCP port (default: 8000)"})
    workers: int = field(default=1, metadata={
        "help": "worker processes sharing the memory-mapped index (default: 1; threads scale at most 1.3x, "
                "processes scale with cores)"})
    max_queries: int = field(default=DEFAULT_MAX_QUERIES, metadata={
        "help": f"most queries per request (default: {DEFAULT_MAX_QUERIES})"})
    max_query_chars: int = field(default=DEFAULT_MAX_QUERY_CHARS, metadata={
        "help": f"longest query in characters (default: {DEFAULT_MAX_QUERY_CHARS})"})
    default_k: int = field(default=DEFAULT_K, metadata={
        "help": f"hits per query when a request gives no k (default: {DEFAULT_K})"})
    max_k: int = field(default=DEFAULT_MAX_K, metadata={
        "help": f"largest k a request may ask for (default: {DEFAULT_MAX_K})"})
    cache: int = field(default=0, metadata={
        "metavar": "ENTRIES", "help": "LRU cache entries per worker; GRPO groups repeat queries (default: 0 = off)"})
    log_level: Literal["critical", "error", "warning", "info", "debug"] = field(default="info", metadata={
        "help": "uvicorn's log level (default: info)"})
    replicas: int | None = field(default=None, metadata={
        "metavar": "N",
        "help": "run N servers of the index on ports PORT .. PORT+N-1 and restart any that exits; clients list them "
                "all: RemoteRetriever('http://HOST:PORT,http://HOST:PORT+1,...') balances the load and fails over "
                "(default: one server, not supervised)"})


class IndexLoadError(AgentGymError, RuntimeError):
    """The server's retriever could not be loaded (raised by ``serve`` once the server has stopped)."""


class _HTTPProblem(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(payload: Any, status: int = 200) -> Any:
    from fastapi import Response

    # Serialising by hand skips FastAPI's jsonable_encoder pass over every hit.
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Response(content=body, status_code=status, media_type="application/json")


def _unpack(raw: bytes) -> Any:
    import msgspec

    try:
        return msgspec.msgpack.decode(raw)
    except msgspec.DecodeError as error:
        raise InvalidValue(str(error)) from error


def _pack(payload: Any) -> bytes:
    import msgspec

    return msgspec.msgpack.encode(payload)


def _error(status: int, message: str) -> Any:
    return _json({"error": message, "detail": message}, status)


def _decode_body(raw: bytes, packed: bool, content_type: str) -> Any:
    """A request body as a Python value; every malformed body is a 422 that says what is wrong."""
    kind = "msgpack" if packed else "JSON"
    try:
        return _unpack(raw) if packed else json.loads(raw)
    except RecursionError:  # json and msgspec both recurse per nesting level
        raise _HTTPProblem(422, f"invalid request: the {kind} body is nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, msgspec's DecodeError
        hint = "" if packed or "json" in content_type else "; send a JSON body with Content-Type: application/json"
        raise _HTTPProblem(422, f"invalid request: the body is not {kind} ({error}){hint}") from None


def _validation_problems(error: Any) -> str:
    """A pydantic ValidationError's problems, one ``where: what`` each."""
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body") or "body"
        problems.append(f"{where}: {item.get('msg', 'invalid')}")
    return "; ".join(problems)


class _RetrieverHolder:
    """Loads the retriever in a background thread so /health can answer 503 while it loads."""

    def __init__(self, factory: Callable[[], Retriever], on_failure: Callable[[str], None] | None = None) -> None:
        self._factory = factory
        self._on_failure = on_failure
        self.retriever: Retriever | None = None
        self.error: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self.load, name="retriever-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def load(self) -> None:
        """Load the retriever and run one warm-up search, here (``start`` runs this in a thread)."""
        try:
            retriever = self._factory()
            # Ready means warm: the first search pays JVM start / JIT compile / page-in (see the note).
            retriever.search([WARMUP_QUERY], 1)
        except Exception as exc:  # noqa: BLE001 - reported through /health, the server keeps answering
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("search server: loading the retriever failed: %s", self.error)
            if self._on_failure is not None:
                self._on_failure(self.error)
            return
        if self._closed:  # the server stopped while the index was loading
            retriever.close()
            return
        self.retriever = retriever
        logger.info("search server: retriever %r ready", getattr(retriever, "name", type(retriever).__name__))

    def close(self) -> None:
        self._closed = True
        retriever, self.retriever = self.retriever, None
        if retriever is not None:
            retriever.close()


def _document_count(retriever: Retriever) -> int | None:
    if hasattr(retriever, "num_documents"):
        count = retriever.num_documents  # type: ignore[attr-defined]
    else:  # a plain retriever may be a sequence of its documents (a CachedRetriever's len is its cache's)
        count = len(retriever) if hasattr(retriever, "__len__") else None  # type: ignore[arg-type]
    return int(count) if isinstance(count, int) else None


def _manifest_document_count(index_dir: str) -> int | None:
    """The document count an index directory's manifest records (None when it has no readable manifest:
    loading the index then fails and /health reports why)."""
    from agent_gym.retrieval_index.manifest import Manifest

    try:
        return Manifest.read(index_dir).doc_count
    except (OSError, ValueError):
        return None


def _check_limits(max_queries: int, max_query_chars: int, default_k: int, max_k: int) -> None:
    if not 1 <= default_k <= max_k:
        raise InvalidValue(f"need 1 <= default_k ({default_k}) <= max_k ({max_k})")
    if max_queries < 1 or max_query_chars < 1:
        raise InvalidValue(f"max_queries ({max_queries}) and max_query_chars ({max_query_chars}) must be >= 1")


def _finite(score: float) -> float | None:
    score = float(score)
    return score if math.isfinite(score) else None  # JSON has no NaN / inf


@functools.cache
def _request_models() -> tuple[type, type]:
    """The pydantic models of a ``/search`` and a ``/retrieve`` body, built on first use (so importing this
    module for the CLI does not need pydantic)."""
    from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        queries: list[StrictStr]
        k: StrictInt | None = None

    class RetrieveRequest(BaseModel):  # Search-R1's QueryRequest, extra fields tolerated as there
        queries: list[StrictStr] | None = None
        query: StrictStr | None = None  # SkyRL-Gym's SearchToolGroup sends one query under this key
        topk: StrictInt | None = None
        return_scores: StrictBool = False

        def batch(self) -> list[str]:
            if (self.queries is None) == (self.query is None):
                raise _HTTPProblem(422, 'invalid request: give "queries": [str, ...] (Search-R1) or "query": str '
                                        '(SkyRL-Gym), not both or neither')
            return self.queries if self.queries is not None else [self.query]

    return SearchRequest, RetrieveRequest


SEARCH_SHAPE = '{"queries": [str, ...], "k": int}'
RETRIEVE_SHAPE = '{"queries": [str, ...] or "query": str, "topk": int, "return_scores": bool}'


class SearchService:
    """The search server without HTTP: its limits, its retriever (through a holder that loads it) and one
    method per route, each taking a decoded body and returning the answer's payload.

    A refused request raises ``_HTTPProblem(status, message)``, which the app turns into ``{"error": message}``
    with that status. :func:`create_app` routes HTTP requests to these methods; tests call them directly.
    """

    def __init__(self, holder: "_RetrieverHolder", *, max_queries: int = DEFAULT_MAX_QUERIES,
                 max_query_chars: int = DEFAULT_MAX_QUERY_CHARS, default_k: int = DEFAULT_K,
                 max_k: int = DEFAULT_MAX_K, documents: int | None = None) -> None:
        _check_limits(max_queries, max_query_chars, default_k, max_k)
        self.holder = holder
        self.max_queries, self.max_query_chars = max_queries, max_query_chars
        self.default_k, self.max_k = default_k, max_k
        self.documents = documents

    @property
    def limits(self) -> dict[str, int]:
        """The limits ``/health`` reports."""
        return {"max_queries": self.max_queries, "max_query_chars": self.max_query_chars,
                "default_k": self.default_k, "max_k": self.max_k}

    @property
    def max_body_bytes(self) -> int:
        """The largest body a valid request can have: ``max_queries * max_query_chars`` characters, JSON escapes
        costing up to 6 bytes a character."""
        return self.max_queries * (6 * self.max_query_chars + 8) + 65536

    def search_hits(self, queries: list[str], k: int | None) -> list[list[Hit]]:
        """``k`` hits for each query, after checking the request against the limits and the index is loaded."""
        k = self.default_k if k is None else k
        if not 1 <= k <= self.max_k:
            raise _HTTPProblem(422, f"k must be between 1 and {self.max_k}, got {k}")
        if len(queries) > self.max_queries:
            raise _HTTPProblem(413, f"{len(queries)} queries in one request exceed "
                                    f"max_queries={self.max_queries}; split the batch")
        for index, query in enumerate(queries):
            if len(query) > self.max_query_chars:
                raise _HTTPProblem(413, f"query {index} has {len(query)} characters, more than "
                                       f"max_query_chars={self.max_query_chars}; shorten it")
        retriever = self.holder.retriever
        if retriever is None:
            error = self.holder.error
            raise _HTTPProblem(503, "search index not ready" + (f": {error}" if error else
                                                                 " (still loading); retry shortly"))
        if not queries:
            return []
        try:
            return retriever.search(queries, k)
        except Exception as exc:  # noqa: BLE001 - one bad search must not take the server down
            logger.exception("search server: retriever failed")
            raise _HTTPProblem(500, f"retriever failed: {type(exc).__name__}: {exc}") from exc

    def parse_search(self, data: Any) -> Any:
        """A decoded ``/search`` body as a validated ``SearchRequest``."""
        from pydantic import ValidationError

        try:
            return _request_models()[0].model_validate(data)
        except ValidationError as error:
            raise _HTTPProblem(422, f"invalid request ({_validation_problems(error)}); expected JSON "
                                    f"{SEARCH_SHAPE}") from None

    def search(self, body: Any) -> dict[str, Any]:
        """The answer to a ``/search`` request (from :meth:`parse_search`): ``{"results": [[hit, ...], ...]}``."""
        results = self.search_hits(body.queries, body.k)
        return {"results": [[{"id": hit.id, "title": hit.title, "text": hit.text, "score": _finite(hit.score)}
                             for hit in hits] for hits in results]}

    def parse_retrieve(self, data: Any, packed: bool = False) -> Any:
        """A decoded ``/retrieve`` body (msgpack when ``packed``) as a validated ``RetrieveRequest``."""
        from pydantic import ValidationError

        try:
            return _request_models()[1].model_validate(data)
        except ValidationError as error:
            raise _HTTPProblem(422, f"invalid request ({_validation_problems(error)}); expected "
                                    f"{'msgpack' if packed else 'JSON'} {RETRIEVE_SHAPE}") from error

    def retrieve(self, body: Any, packed: bool = False) -> dict[str, Any]:
        """The answer to a ``/retrieve`` request in Search-R1's shape; ``packed`` (GEM's msgpack dialect): one
        ``query`` in, that query's hits out, as GEM's retrieval server does."""
        queries = body.batch()
        # Search-R1 falls back to its default top-k when topk is missing or 0.
        results = self.search_hits(queries, body.topk or None)
        payload = []
        for hits in results:
            documents = [{"id": hit.id, "title": hit.title, "text": hit.text,
                          "contents": f'"{hit.title}"\n{hit.text}'} for hit in hits]  # wiki-18's layout
            if body.return_scores:
                payload.append([{"document": document, "score": _finite(hit.score)}
                                for document, hit in zip(documents, hits, strict=True)])
            else:
                payload.append(documents)
        return {"result": payload[0] if packed and body.query is not None else payload}

    def health(self) -> tuple[int, dict[str, Any]]:
        """``/health``'s status and payload: 200 once the index is loaded, 503 while it loads or after it failed."""
        retriever = self.holder.retriever
        if retriever is None:
            error = self.holder.error
            return 503, {"status": "error" if error else "loading", "error": error, **self.limits}
        documents = self.documents if self.documents is not None else _document_count(retriever)
        return 200, {"status": "ok", "backend": getattr(retriever, "name", type(retriever).__name__),
                     "documents": documents, "pid": os.getpid(), **self.limits}


def _is_packed(raw: bytes, content_type: str) -> bool:
    """Whether a ``/retrieve`` body is msgpack: GEM's search tool posts it with no content type, and JSON bodies
    start with "{" (or whitespace)."""
    return "msgpack" in content_type or raw[:1] not in (b"", b"{", b"[", b" ", b"\n", b"\r", b"\t")


def _routes(app: Any, service: SearchService) -> None:
    """The HTTP routes and error handlers of ``app``, each a thin call of ``service``."""
    from fastapi import Request, Response
    from fastapi.exceptions import RequestValidationError
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> Any:
        expected = SEARCH_SHAPE if request.url.path == "/search" else RETRIEVE_SHAPE
        return _error(422, f"invalid request ({_validation_problems(exc)}); expected JSON {expected}")

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Any:  # 404, 405: the same error shape
        response = _error(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(_HTTPProblem)
    async def _bad_request(request: Request, exc: _HTTPProblem) -> Any:
        return _error(exc.status, exc.message)

    @app.post("/search")
    async def search(request: Request) -> Any:
        # Read by hand, not as a FastAPI body parameter: FastAPI answers a body it cannot parse (too deep, not
        # UTF-8) with 400 {"detail"}, and one without a JSON Content-Type (curl's default) with a puzzling 422.
        data = _decode_body(await request.body(), False, request.headers.get("content-type", ""))
        body = service.parse_search(data)
        return _json(await run_in_threadpool(service.search, body))

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Any:
        raw = await request.body()
        content_type = request.headers.get("content-type", "")
        packed = _is_packed(raw, content_type)
        body = service.parse_retrieve(_decode_body(raw or b"null", packed, content_type), packed)
        answer = await run_in_threadpool(service.retrieve, body, packed)
        if not packed:
            return _json(answer)
        return Response(content=_pack(answer), media_type="application/msgpack")

    @app.get("/health")
    def health() -> Any:
        status, payload = service.health()
        return _json(payload, status)


def create_app(
    retriever_factory: Callable[[], Retriever],
    *,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
    default_k: int = DEFAULT_K,
    max_k: int = DEFAULT_MAX_K,
    documents: int | None = None,
    body_timeout: float = REQUEST_TIMEOUT_S,
    on_load_failure: Callable[[str], None] | None = None,
) -> Any:
    """Build the ASGI app (FastAPI) serving the retriever that ``retriever_factory`` returns.

    The factory runs in a background thread at startup (then one warm-up search), so the server accepts
    connections at once and ``/health`` answers 503 until it is ready. The app owns the retriever and
    closes it at shutdown. ``documents`` is the count ``/health`` reports (an index directory's manifest
    knows it); by default the retriever's own ``num_documents``. ``body_timeout``: seconds a request body may
    take to arrive (then 408). ``on_load_failure(reason)`` runs when the factory or the warm-up search fails.
    The app's parts: a :class:`SearchService` (``app.state.service``) answers, ``_routes`` routes to it, and
    ``BodySizeLimit`` refuses bodies larger than any valid request.
    """
    from fastapi import FastAPI

    holder = _RetrieverHolder(retriever_factory, on_load_failure)
    service = SearchService(holder, max_queries=max_queries, max_query_chars=max_query_chars,
                            default_k=default_k, max_k=max_k, documents=documents)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202 - FastAPI's lifespan protocol
        holder.start()
        yield
        holder.close()

    app = FastAPI(title="agent-gym search server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.holder = holder
    app.state.service = service
    _routes(app, service)
    return BodySizeLimit(app, max_body_bytes=service.max_body_bytes, body_timeout=body_timeout,
                         hint="send fewer or shorter queries")


# ----------------------------------------------------------------------------------------------------------
# Starting the server


def _import_object(spec: str) -> Any:
    import importlib

    module_name, _, attribute = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def _open_index_dir(index_dir: str) -> Retriever:
    # Imported here so this module works (and is testable) without the index backends.
    from agent_gym.retrieval_index.build import open_index

    return open_index(index_dir)


def _factory_from_env() -> Callable[[], Retriever]:
    index_dir = os.environ.get(INDEX_DIR_ENV)
    factory_spec = os.environ.get(FACTORY_ENV)
    if index_dir:
        base: Callable[[], Retriever] = lambda: _open_index_dir(index_dir)  # noqa: E731
    elif factory_spec:
        base = _import_object(factory_spec)
    else:
        raise RuntimeError(f"set {INDEX_DIR_ENV} (an index directory) or {FACTORY_ENV} ('module:function') "
                           "to start the search server, or run `agent-gym index serve DIR`")
    options = json.loads(os.environ.get(SERVER_OPTIONS_ENV) or "{}")
    cache_entries = int(options.get("cache_entries", 0))
    if not cache_entries:
        return base

    def cached() -> Retriever:
        from agent_gym.retrieval_index.service.search_cache import CachedRetriever

        return CachedRetriever(base(), max_entries=cache_entries)

    return cached


def app_from_env() -> Any:
    """uvicorn app factory for worker processes: reads the index and the limits from the environment."""
    options = json.loads(os.environ.get(SERVER_OPTIONS_ENV) or "{}")
    limits = {key: int(options[key]) for key in ("max_queries", "max_query_chars", "default_k", "max_k")
              if key in options}
    index_dir = os.environ.get(INDEX_DIR_ENV)
    documents = _manifest_document_count(index_dir) if index_dir else None
    on_failure = _stop_serving if options.get("exit_on_load_failure") else None
    return create_app(_factory_from_env(), documents=documents, on_load_failure=on_failure, **limits)


class _Foreground:
    """The uvicorn server ``run_uvicorn`` runs in this process (none in uvicorn's worker processes)."""

    server: Any = None
    load_error: str | None = None


def _stop_serving(reason: str) -> None:
    """A foreground server's index failed to load: stop serving, so the failure is seen (not 503s forever)."""
    server = _Foreground.server
    if server is None:  # a worker of uvicorn's supervisor: this status makes the supervisor stop every worker
        print(f"agent-gym index serve: error: cannot load the index: {reason}", file=sys.stderr, flush=True)
        os._exit(STARTUP_FAILURE)
    _Foreground.load_error = reason
    server.should_exit = True


def _watch_supervisor() -> None:
    """Stop this replica when its ``--replicas`` supervisor is gone (Linux also ties them by PR_SET_PDEATHSIG;
    this watch covers other systems)."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    if not supervisor.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(supervisor):
            time.sleep(1.0)
        logger.warning("search replica: its supervisor (pid %s) is gone; stopping", supervisor)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    index_dir_or_factory: str | Path | Callable[[], Retriever],
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    *,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
    default_k: int = DEFAULT_K,
    max_k: int = DEFAULT_MAX_K,
    cache_entries: int = 0,
    log_level: str = "info",
) -> None:
    """Run the search server until interrupted; raise :class:`IndexLoadError` once it stops when the index
    could not be loaded. Prints the URL it listens on.

    ``index_dir_or_factory`` is an index directory (opened with ``build.open_index`` in each worker), a
    ``"module:function"`` string naming a retriever factory, or a factory callable (one worker only: uvicorn
    starts extra workers from an import string). ``workers`` processes share the memory-mapped index and one
    listening socket. ``cache_entries > 0`` puts an LRU cache per worker in front of the retriever.
    """
    if workers < 1:
        raise InvalidValue(f"workers must be >= 1, got {workers}")
    _check_limits(max_queries, max_query_chars, default_k, max_k)
    options = {"max_queries": max_queries, "max_query_chars": max_query_chars, "default_k": default_k,
               "max_k": max_k, "cache_entries": cache_entries, "exit_on_load_failure": True}

    if callable(index_dir_or_factory):
        if workers != 1:
            raise InvalidValue("a factory callable serves with one worker; for several workers pass an index "
                             "directory or a 'module:function' string")
        factory = index_dir_or_factory
        if cache_entries:
            from agent_gym.retrieval_index.service.search_cache import CachedRetriever

            factory = lambda: CachedRetriever(index_dir_or_factory(), max_entries=cache_entries)  # noqa: E731
        app: Any = create_app(factory, max_queries=max_queries, max_query_chars=max_query_chars,
                              default_k=default_k, max_k=max_k, on_load_failure=_stop_serving)
    else:
        target = str(index_dir_or_factory)
        os.environ.pop(INDEX_DIR_ENV, None)
        os.environ.pop(FACTORY_ENV, None)
        if Path(target).is_dir():
            os.environ[INDEX_DIR_ENV] = str(Path(target).resolve())
        elif ":" in target and not Path(target).exists():
            os.environ[FACTORY_ENV] = target
        else:
            raise FileNotFoundError(f"no index directory at {target!r}; build one with "
                                    f"`agent-gym index build --corpus FILE --out {target}`")
        os.environ[SERVER_OPTIONS_ENV] = json.dumps(options)
        app = APP_FROM_ENV
    if not _is_loopback(host):
        logger.warning("search server listens on %s: reachable from other machines, with no authentication",
                       host)
    sock = bind_socket(host, port)
    url = _url(host, sock.getsockname()[1])
    print(f"search server: {url} (GET {url}/health answers 200 once the index is loaded)", flush=True)
    _watch_supervisor()
    run_uvicorn(app, sock, workers=workers, log_level=log_level)


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A bound TCP socket with ``TCP_NODELAY`` set, ready for uvicorn (port 0 picks a free port).

    uvicorn binds ``socket.socket(family)`` (protocol 0) for several workers, and asyncio enables
    ``TCP_NODELAY`` only on sockets whose protocol is ``IPPROTO_TCP``: measured here, uvicorn's own
    2-worker h11 server answered every request in 44 ms (Nagle + delayed ACK) against 2-5 ms with this
    socket. Linux copies ``TCP_NODELAY`` from the listening socket to each accepted one.
    """
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  proto=socket.IPPROTO_TCP)[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}; is another server "
                                 "running there? pick another --port") from exc
    sock.set_inheritable(True)  # worker processes accept on it too
    return sock


def uvicorn_config(
    app: Any, *, workers: int = 1, log_level: str = "info", timeout_keep_alive: float = REQUEST_TIMEOUT_S
) -> Any:
    """The uvicorn settings of the search server (``app``: an ASGI app, or an import string of an app factory).

    ``timeout_keep_alive`` also bounds how long a request head may take to arrive (``http_deadline.py``).
    """
    import inspect

    import uvicorn

    from agent_gym.retrieval_index.service.http_deadline import DEADLINE_PROTOCOL

    # access_log off: a log line per request costs more than a BM25 search. backlog 2048: the default of
    # 5 reset connections at 32 clients (shared/notes/retrieval.md).
    settings: dict[str, Any] = {}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
        # uvicorn kills a worker that misses a 5 s ping as hung: on a starved machine a worker still starting can
        # miss it, and is restarted instead of left to start (or to report that the index cannot load).
        settings["timeout_worker_healthcheck"] = 60
    return uvicorn.Config(app, factory=isinstance(app, str), workers=workers, backlog=2048, http=DEADLINE_PROTOCOL,
                          log_level=log_level, access_log=False, timeout_keep_alive=timeout_keep_alive, **settings)


def run_uvicorn(app: Any, sock: socket.socket, *, workers: int = 1, log_level: str = "info") -> None:
    """Serve ``app`` (an ASGI app, or an import string of an app factory) on ``sock`` until interrupted.

    Raises :class:`IndexLoadError` when the server stopped because its index could not be loaded.
    """
    import inspect

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn_config(app, workers=workers, log_level=log_level)
    server = uvicorn.Server(config)
    supervisor = None
    _Foreground.server, _Foreground.load_error = (server if workers == 1 else None), None
    try:
        if workers == 1:
            server.run(sockets=[sock])
        elif "target" in inspect.signature(Multiprocess).parameters:  # older uvicorn
            supervisor = Multiprocess(config, target=server.run, sockets=[sock])
            supervisor.run()
        else:
            supervisor = Multiprocess(config, sockets=[sock])
            supervisor.run()
    except KeyboardInterrupt:
        pass
    finally:
        _Foreground.server = None
        sock.close()
    if _Foreground.load_error is not None:
        raise IndexLoadError(f"cannot load the index: {_Foreground.load_error}")
    failed = [process for process in getattr(supervisor, "processes", ()) if process.exitcode == STARTUP_FAILURE]
    if failed:
        raise IndexLoadError("cannot load the index: a worker failed to start (its error is above)")


__all__ = ["IndexLoadError", "SearchService", "ServeConfig", "app_from_env", "bind_socket", "create_app",
           "run_uvicorn", "serve", "uvicorn_config"]
