"""Serve any registered env over the OpenEnv protocol (``agent-gym env serve ID --port P``).

OpenEnv (``openenv-core``, the protocol TRL and torchforge speak to remote envs) keeps an episode on a WebSocket:
each connection to ``/ws`` is one session with its own env, and the client sends JSON messages
``{"type": "reset", "data": {"seed": ..., "options": ...}}``, ``{"type": "step", "data": {"text": "..."}}``,
``{"type": "state"}`` and ``{"type": "close"}``. Every answer is ``{"type": "observation", "data": {"observation":
{...}, "reward": r, "done": d}}`` (``state`` answers ``{"type": "state", "data": {...}}``), or ``{"type": "error",
"data": {"message", "code"}}``. Our observation object is ``{"text", "info", "terminated", "truncated"}``: the
env's new text, its info made JSON-safe (``messages`` included), and the two flags that OpenEnv's single
``done`` folds together. ``{"type": "truncate"}`` is our one extension: it ends the episode through the env's
``truncate()`` (what a trainer's own turn cap pays), for :class:`~agent_gym.adapters.openenv.RemoteEnv`.

HTTP endpoints, as in OpenEnv: ``GET /health``, ``GET /metadata`` (name, description, the text spaces' lengths and
the server's limits), ``GET /schema`` (JSON schemas of action, observation and state), and the stateless
``POST /reset`` (a fresh env, reset and closed). ``POST /step`` has no session over HTTP, so it answers 409 naming
``/ws``.

Limits: at most ``max_sessions`` live sessions (a further connection gets ``CAPACITY_REACHED`` and is closed); a
session idle for ``idle_timeout_s`` gets ``IDLE_TIMEOUT`` and is closed, and its env with it; a message over
``max_message_bytes`` closes the connection (WebSocket code 1009; ``RemoteEnv`` cuts a longer turn so that the env
answers it as an over-long turn). A malformed message (not JSON, nested too deeply, a binary frame, a bad seed) is
answered with an error and the session goes on. Over HTTP every refusal is a 4xx ``{"error": message}``: a body
over ``max_body_bytes`` gets 413 before it is read (``Content-Length``) or as soon as it passes the limit
(chunked). Slow or idle clients cannot pile up (run the app with :func:`env_server_config`, as ``env serve``
does): a request head must arrive within ``request_timeout_s`` of connecting or of the last response, and a body
within ``request_timeout_s`` of its head (408); past ``max_idle_connections`` connections waiting for a request
head, the oldest is closed, so a flood of idle sockets cannot use up the process's file descriptors and starve
``/health`` (measured before: 1,100 idle sockets under a 1,024-descriptor limit failed every health check). The
server binds to 127.0.0.1 by default.
"""

# No `from __future__ import annotations`: FastAPI resolves the route signatures defined in _routes.
import asyncio
import json
import logging
import math
import reprlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from agent_gym.contract import TASK_ID, TURN
from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.service.http_body_limit import BodySizeLimit

logger = logging.getLogger(__name__)

__all__ = ["EnvServeConfig", "EnvService", "answer_message", "create_env_app", "env_server_config", "jsonable"]

DEFAULT_MAX_SESSIONS = 16
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 64 * 1024  # a reset body is a seed and a few options
DEFAULT_REQUEST_TIMEOUT_S = 30.0  # the longest a request head, or a request body, may take to arrive
MAX_IDLE_CONNECTIONS = 256  # the default cap on connections waiting for a request head, on a generous fd limit


@dataclass(kw_only=True)
class EnvServeConfig:
    """How ``agent-gym env serve`` serves an env (its flags come from these fields, beside the env kwargs):
    ``create_env_app(factory, name=config.env_id, max_sessions=config.max_sessions,
    idle_timeout_s=config.idle_timeout, max_message_bytes=config.max_message_bytes)`` on ``config.host:port``."""

    env_id: str = field(metadata={"positional": True, "help": "environment id, e.g. AgentR1-SynthHop-v0"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to bind (default: loopback only; 0.0.0.0 exposes every env to the network)"})
    port: int = field(default=8001, metadata={"help": "TCP port, 0 for any free one (default: 8001)"})
    max_sessions: int = field(default=DEFAULT_MAX_SESSIONS, metadata={
        "help": "live WebSocket sessions (each holds its own env); more are refused"})
    idle_timeout: float = field(default=DEFAULT_IDLE_TIMEOUT_S, metadata={
        "help": "seconds a session may stay silent before it and its env are closed"})
    max_message_bytes: int = field(default=DEFAULT_MAX_MESSAGE_BYTES, metadata={
        "help": "largest WebSocket message accepted (RemoteEnv cuts a longer turn, which the env then refuses as "
                "over its action limit)"})

_short = reprlib.Repr()  # bounded depth and length: a value echoed in an error cannot recurse or flood
_short.maxstring = _short.maxother = 80


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars as numbers, non-finite floats as None and anything else unknown as text."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _space_length(space: Any) -> int | None:
    return getattr(space, "max_length", None)


class _Error(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _parse_json(raw: str | bytes) -> Any:
    """``raw`` parsed; anything that is not JSON, or JSON nested too deeply to parse, is an ``INVALID_JSON``."""
    try:
        return json.loads(raw)
    except RecursionError:  # json recurses per nesting level
        raise _Error("INVALID_JSON", "invalid JSON: nested too deeply") from None
    except ValueError as problem:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise _Error("INVALID_JSON", f"invalid JSON: {problem}") from None


def _dumps(payload: Any) -> str:
    """``payload`` as JSON text: UTF-8 where it can be, escaped where a string holds a lone surrogate (which
    UTF-8 cannot carry, so a text frame of it could not be sent)."""
    text = json.dumps(payload, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload)
    return text


def _default_max_idle_connections() -> int:
    """A quarter of the soft file-descriptor limit (at most ``MAX_IDLE_CONNECTIONS``): idle sockets can never
    take the descriptors that sessions, envs and a health check need."""
    try:
        import resource
    except ImportError:  # not a Unix
        return MAX_IDLE_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_IDLE_CONNECTIONS if soft == resource.RLIM_INFINITY else max(4, min(MAX_IDLE_CONNECTIONS, soft // 4))


def _protocol_class(max_idle_connections: int) -> type:
    """uvicorn's HTTP protocol with the search server's request-head deadline (``http_deadline.py``), kept off
    WebSocket sessions, and a cap on the connections waiting for a request head: past it, the oldest is closed."""
    from agent_gym.retrieval_index.service.http_deadline import DEADLINE_PROTOCOL

    waiting: dict[Any, None] = {}  # connections waiting for a request head (or idle between requests), oldest first

    class EnvServerProtocol(DEADLINE_PROTOCOL):  # type: ignore[misc, valid-type]
        def _arm_head_deadline(self) -> None:
            super()._arm_head_deadline()
            waiting.pop(self, None)
            waiting[self] = None  # now the newest
            while len(waiting) > max_idle_connections:
                oldest = next(iter(waiting))
                del waiting[oldest]
                cycle = oldest.cycle
                # one that has begun a request since is left alone: it rejoins when its response is complete
                if (cycle is None or cycle.response_complete) and not oldest.transport.is_closing():
                    oldest.transport.close()

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # The connection becomes a WebSocket session, held to idle_timeout_s instead: without this the head
            # deadline would close the session's transport request_timeout_s after its handshake.
            waiting.pop(self, None)
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            waiting.pop(self, None)
            super().connection_lost(exc)

    return EnvServerProtocol


def env_server_config(app: Any, *, log_level: str = "warning") -> Any:
    """The ``uvicorn.Config`` that serves ``app`` (from :func:`create_env_app`) with its limits: the WebSocket
    message size, the request-head and keep-alive deadline, and the cap on idle connections."""
    import uvicorn

    limits = app.state.server_limits
    # access_log off: a line per request; backlog 2048: a burst of clients is queued, not reset
    return uvicorn.Config(app, http=_protocol_class(limits["max_idle_connections"]),
                          ws_max_size=limits["max_message_bytes"], timeout_keep_alive=limits["request_timeout_s"],
                          backlog=2048, log_level=log_level, access_log=False)


def _observation_payload(text: Any, reward: float | None, terminated: bool, truncated: bool,
                         info: dict[str, Any]) -> dict[str, Any]:
    return {"observation": {"text": text, "info": jsonable(info), "terminated": bool(terminated),
                            "truncated": bool(truncated)},
            "reward": None if reward is None else float(reward), "done": bool(terminated or truncated)}


class _Session:
    """One WebSocket session: its own env, stepped in a worker thread so other sessions go on."""

    def __init__(self, env: gym.Env, session_id: int) -> None:
        self.env, self.session_id = env, session_id
        self.episode_id: str | None = None
        self.step_count = 0
        self.last_info: dict[str, Any] = {}

    def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        unknown = set(data) - {"seed", "options", "episode_id"}
        if unknown:
            raise _Error("VALIDATION_ERROR", f"unknown reset field(s) {sorted(unknown)}; send seed, options, "
                                             "episode_id")
        seed, options = data.get("seed"), data.get("options")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise _Error("VALIDATION_ERROR", f"seed must be a non-negative integer, got {_short.repr(seed)}")
        if options is not None and not isinstance(options, dict):
            raise _Error("VALIDATION_ERROR", f"options must be an object such as {{\"task_index\": 0}}, got "
                                             f"{_short.repr(options)}")
        try:
            text, info = self.env.reset(seed=seed, options=options)
        except Exception as error:  # noqa: BLE001 - a task id the env lacks, an unknown option: the session goes on
            raise _Error("EXECUTION_ERROR", f"reset failed: {type(error).__name__}: {error}") from error
        self.episode_id = str(data.get("episode_id") or f"{self.session_id}-{info.get(TASK_ID, '')}")
        self.step_count = 0
        self.last_info = info
        return _observation_payload(text, None, False, False, info)

    def step(self, data: dict[str, Any]) -> dict[str, Any]:
        unknown = set(data) - {"text", "metadata"}
        if not isinstance(data.get("text"), str) or unknown:
            raise _Error("VALIDATION_ERROR", 'a step action is {"text": "<the agent\'s turn>"}; got fields '
                                             f"{sorted(data)}")
        if self.episode_id is None:
            raise _Error("EXECUTION_ERROR", "step before reset: send {\"type\": \"reset\"} first")
        try:
            text, reward, terminated, truncated, info = self.env.step(data["text"])
        except gym.error.ResetNeeded as error:
            raise _Error("EXECUTION_ERROR", f"{error}") from error
        self.step_count += 1
        self.last_info = info
        return _observation_payload(text, reward, terminated, truncated, info)

    def truncate(self) -> dict[str, Any]:
        truncate = getattr(self.env.unwrapped, "truncate", None)
        if not callable(truncate):
            raise _Error("EXECUTION_ERROR", f"{type(self.env.unwrapped).__name__} has no truncate()")
        try:
            reward, info = truncate()
        except gym.error.ResetNeeded as error:
            raise _Error("EXECUTION_ERROR", f"{error}") from error
        self.last_info = info
        return _observation_payload("", reward, False, True, info)

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count,
                "task_id": self.last_info.get(TASK_ID), "turn": self.last_info.get(TURN)}


class _SessionTable:
    """The live WebSocket sessions, at most ``max_sessions``; a seat is reserved before its env is built."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session | None] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def reserve(self) -> int | None:
        """A new session id, or None when ``max_sessions`` sessions are live."""
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                return None
            self._counter += 1
            self._sessions[self._counter] = None  # reserved while the env is built
            return self._counter

    def attach(self, session_id: int, session: _Session) -> None:
        self._sessions[session_id] = session

    def release(self, session_id: int) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)


def answer_message(session: _Session, text: str | None) -> dict[str, Any] | None:
    """The answer to one WebSocket message (``text``: its text frame; None for a binary frame), or None for
    ``close``. A malformed message or a refused action raises ``_Error``, which the session sends back and goes
    on; an env's own failure propagates and ends the session."""
    if text is None:
        raise _Error("INVALID_JSON", "a binary frame: send each message as JSON in a text frame")
    message = _parse_json(text)
    kind = message.get("type") if isinstance(message, dict) else None
    data = message.get("data", {}) if isinstance(message, dict) else {}
    if kind == "close":
        return None
    if not isinstance(data, dict):
        raise _Error("VALIDATION_ERROR", "\"data\" must be a JSON object")
    if kind == "reset":
        return {"type": "observation", "data": session.reset(data)}
    if kind == "step":
        return {"type": "observation", "data": session.step(data)}
    if kind == "truncate":
        return {"type": "observation", "data": session.truncate()}
    if kind == "state":
        return {"type": "state", "data": session.state()}
    raise _Error("UNKNOWN_TYPE", f"unknown message type {kind!r}; send reset, step, state or close")


class EnvService:
    """The env server without HTTP: its settings, its sessions and one method per HTTP route, each returning
    ``(status, payload)``. :func:`create_env_app` routes requests (and WebSocket messages, through
    :func:`answer_message`) to it; tests call it directly.

    Building one makes and closes one env, so a factory that fails does so at start, not in the first session.
    """

    def __init__(self, env_factory: Callable[[], gym.Env], *, name: str = "agent-gym env", description: str = "",
                 max_sessions: int = DEFAULT_MAX_SESSIONS, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_idle_connections: int | None = None) -> None:
        if max_idle_connections is None:
            max_idle_connections = _default_max_idle_connections()
        if max_sessions < 1:
            raise InvalidValue(f"max_sessions must be at least 1, got {max_sessions}")
        if not idle_timeout_s > 0 or not request_timeout_s > 0:
            raise InvalidValue(f"idle_timeout_s ({idle_timeout_s}) and request_timeout_s ({request_timeout_s}) must "
                               "be positive")
        if max_message_bytes < 1024 or max_body_bytes < 1024 or max_idle_connections < 1:
            raise InvalidValue(f"need max_message_bytes ({max_message_bytes}) and max_body_bytes ({max_body_bytes}) "
                               f">= 1024, and max_idle_connections ({max_idle_connections}) >= 1")
        self.env_factory, self.name, self.description = env_factory, name, description
        self.idle_timeout_s = idle_timeout_s
        self.limits: dict[str, Any] = {"max_message_bytes": max_message_bytes, "max_body_bytes": max_body_bytes,
                                       "request_timeout_s": request_timeout_s,
                                       "max_idle_connections": max_idle_connections}
        self.sessions = _SessionTable(max_sessions)
        probe = env_factory()  # fail at start, not in the first session, and read the spaces
        self.action_length = _space_length(probe.action_space)
        self.observation_length = _space_length(probe.observation_space)
        probe.close()

    @property
    def max_sessions(self) -> int:
        return self.sessions.max_sessions

    def health(self) -> dict[str, Any]:
        return {"status": "healthy", "active_sessions": len(self.sessions), "max_sessions": self.max_sessions}

    def metadata(self) -> dict[str, Any]:
        import agent_gym

        return {"name": self.name, "description": self.description, "version": agent_gym.__version__,
                "action_max_length": self.action_length, "observation_max_length": self.observation_length,
                "idle_timeout_s": self.idle_timeout_s, "max_sessions": self.max_sessions, **self.limits}

    def schema(self) -> dict[str, Any]:
        length = self.action_length
        text = {"type": "string", **({"maxLength": length} if length is not None else {})}
        return {
            "action": {"type": "object", "properties": {"text": text, "metadata": {"type": "object"}},
                       "required": ["text"], "additionalProperties": False},
            "observation": {"type": "object", "properties": {
                "text": {"type": "string"}, "info": {"type": "object"}, "terminated": {"type": "boolean"},
                "truncated": {"type": "boolean"}}},
            "state": {"type": "object", "properties": {
                "episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer"},
                "task_id": {"type": ["string", "null"]}, "turn": {"type": ["integer", "null"]}}},
        }

    def reset(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Stateless ``POST /reset``: a fresh env, reset with the body's seed and options, and closed."""
        try:
            body = _parse_json(raw) if raw.strip() else {}
        except _Error as problem:
            return 422, {"error": f"the body is not JSON ({problem.message}); send {{\"seed\": int, \"options\": "
                                  "{...}} or nothing"}
        if not isinstance(body, dict):
            return 422, {"error": "the body must be a JSON object such as {\"seed\": 0}"}
        env = self.env_factory()
        try:
            return 200, _Session(env, -1).reset(body)
        except _Error as problem:
            return (422 if problem.code == "VALIDATION_ERROR" else 400), {"error": problem.message}
        finally:
            env.close()

    @staticmethod
    def step() -> tuple[int, dict[str, Any]]:
        """``POST /step``: refused, since a step needs a session."""
        return 409, {"error": "POST /step has no session in the OpenEnv protocol: open a WebSocket at /ws, send "
                              "{\"type\": \"reset\"}, then {\"type\": \"step\", \"data\": {\"text\": ...}}"}


async def _send_error(websocket: Any, code: str, message: str) -> None:
    await websocket.send_text(json.dumps({"type": "error", "data": {"message": message, "code": code}}))


async def _run_session(service: EnvService, websocket: Any) -> None:
    """One WebSocket session: a seat in the table, its own env, its messages answered until close, idle timeout or
    disconnect; the env is closed however it ends."""
    from fastapi import WebSocketDisconnect

    await websocket.accept()
    session_id = service.sessions.reserve()
    if session_id is None:
        await _send_error(websocket, "CAPACITY_REACHED", f"the server holds {service.max_sessions} sessions "
                                                         "(--max-sessions); retry later")
        await websocket.close(code=1013, reason="CAPACITY_REACHED: too many sessions")  # 1013: try again later
        return
    current: _Session | None = None
    close_reason = ""
    try:
        current = _Session(await asyncio.to_thread(service.env_factory), session_id)
        service.sessions.attach(session_id, current)
        while True:
            try:
                received = await asyncio.wait_for(websocket.receive(), timeout=service.idle_timeout_s)
            except TimeoutError:
                await _send_error(websocket, "IDLE_TIMEOUT", f"no message for {service.idle_timeout_s:g} s; the "
                                                             "session and its env are closed")
                close_reason = "IDLE_TIMEOUT: session closed"
                break
            if received["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(received.get("code", 1000))
            try:  # in a worker thread, so other sessions go on while this env steps
                answer = await asyncio.to_thread(answer_message, current, received.get("text"))
            except _Error as problem:
                await _send_error(websocket, problem.code, problem.message)
                continue
            if answer is None:  # close
                break
            await websocket.send_text(_dumps(answer))
    except WebSocketDisconnect:
        pass
    except Exception as problem:  # noqa: BLE001 - an env that breaks its contract ends its session only
        logger.exception("env server: session %s failed", session_id)
        try:
            await _send_error(websocket, "SESSION_ERROR", f"{type(problem).__name__}: {problem}")
        except Exception:  # noqa: BLE001 - the client may be gone already
            pass
    finally:
        service.sessions.release(session_id)
        if current is not None:
            await asyncio.to_thread(current.env.close)
        try:
            await websocket.close(reason=close_reason)
        except (RuntimeError, WebSocketDisconnect):  # already closed
            pass


def _routes(app: Any, service: EnvService) -> None:
    """The HTTP routes, the WebSocket route and the error handlers of ``app``, each a thin call of ``service``."""
    from fastapi import Request, WebSocket
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    def answer(status: int, payload: dict[str, Any]) -> Any:
        return JSONResponse(payload, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: "
                             f"{e.get('msg', 'invalid')}" for e in exc.errors())
        return answer(422, {"error": f"invalid request ({problems}); reset takes {{\"seed\": int, \"options\": "
                                     "{...}}"})

    @app.exception_handler(Exception)
    async def _failed(request: Request, exc: Exception) -> Any:  # a JSON answer even for a server bug
        return answer(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    app.get("/health")(service.health)
    app.get("/metadata")(service.metadata)
    app.get("/schema")(service.schema)

    @app.post("/reset")
    async def reset(request: Request) -> Any:
        return answer(*await asyncio.to_thread(service.reset, await request.body()))

    @app.post("/step")
    def step() -> Any:
        return answer(*service.step())

    @app.websocket("/ws")
    async def session(websocket: WebSocket) -> None:
        await _run_session(service, websocket)


def create_env_app(
    env_factory: Callable[[], gym.Env],
    *,
    name: str = "agent-gym env",
    description: str = "",
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    max_idle_connections: int | None = None,
) -> Any:
    """The FastAPI app serving envs that ``env_factory`` makes, one per WebSocket session.

    The HTTP body limit is the app's own; the other limits hold when it runs under :func:`env_server_config`.
    ``max_idle_connections`` defaults to a quarter of the process's file-descriptor limit, at most 256.
    The app's parts: an :class:`EnvService` (``app.state.service``) answers, ``_routes`` routes to it, and
    ``BodySizeLimit`` refuses large or slow bodies.
    """
    from fastapi import FastAPI

    service = EnvService(env_factory, name=name, description=description, max_sessions=max_sessions,
                         idle_timeout_s=idle_timeout_s, max_message_bytes=max_message_bytes,
                         max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s,
                         max_idle_connections=max_idle_connections)
    app = FastAPI(title=f"{name} (OpenEnv protocol)", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_body_bytes=max_body_bytes, body_timeout=request_timeout_s,
                       hint='a reset body is {"seed": int, "options": {...}}')
    app.state.server_limits = service.limits  # read by env_server_config
    app.state.service = service
    _routes(app, service)
    return app
