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

HTTP endpoints, as in OpenEnv: ``GET /health``, ``GET /metadata`` (name, description and the text spaces'
lengths), ``GET /schema`` (JSON schemas of action, observation and state), and the stateless ``POST /reset``
(a fresh env, reset and closed). ``POST /step`` has no session over HTTP, so it answers 409 naming ``/ws``.

Limits: at most ``max_sessions`` live sessions (a further connection gets ``CAPACITY_REACHED`` and is closed); a
session idle for ``idle_timeout_s`` gets ``IDLE_TIMEOUT`` and is closed, and its env with it; a message over
``max_message_bytes`` closes the connection (WebSocket code 1009). The server binds to 127.0.0.1 by default.
"""

# No `from __future__ import annotations`: FastAPI resolves the request models defined in create_env_app.
import asyncio
import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agent_gym.error import InvalidValue

logger = logging.getLogger(__name__)

__all__ = ["create_env_app", "jsonable"]

DEFAULT_MAX_SESSIONS = 16
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


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
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _Error("VALIDATION_ERROR", f"seed must be an integer, got {seed!r:.80}")
        if options is not None and not isinstance(options, dict):
            raise _Error("VALIDATION_ERROR", f"options must be an object such as {{\"task_index\": 0}}, got "
                                             f"{options!r:.80}")
        try:
            text, info = self.env.reset(seed=seed, options=options)
        except (KeyError, ValueError, TypeError) as error:  # a task id the env lacks, an unknown option
            raise _Error("EXECUTION_ERROR", f"reset failed: {error}") from error
        self.episode_id = str(data.get("episode_id") or f"{self.session_id}-{info.get('task_id', '')}")
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
                "task_id": self.last_info.get("task_id"), "turn": self.last_info.get("turn")}


def create_env_app(
    env_factory: Callable[[], gym.Env],
    *,
    name: str = "agent-gym env",
    description: str = "",
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> Any:
    """The FastAPI app serving envs that ``env_factory`` makes, one per WebSocket session."""
    from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    if max_sessions < 1:
        raise InvalidValue(f"max_sessions must be at least 1, got {max_sessions}")
    if not idle_timeout_s > 0:
        raise InvalidValue(f"idle_timeout_s must be positive, got {idle_timeout_s}")
    probe = env_factory()  # fail at start, not in the first session, and read the spaces
    action_length, observation_length = _space_length(probe.action_space), _space_length(probe.observation_space)
    probe.close()
    app = FastAPI(title=f"{name} (OpenEnv protocol)", docs_url=None, redoc_url=None)
    lock = threading.Lock()
    sessions: dict[int, _Session] = {}
    counter = [0]

    def error(status: int, message: str) -> Any:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: "
                             f"{e.get('msg', 'invalid')}" for e in exc.errors())
        return error(422, f"invalid request ({problems}); reset takes {{\"seed\": int, \"options\": {{...}}}}")

    @app.get("/health")
    def health() -> Any:
        return {"status": "healthy", "active_sessions": len(sessions), "max_sessions": max_sessions}

    @app.get("/metadata")
    def metadata() -> Any:
        import agent_gym

        return {"name": name, "description": description, "version": agent_gym.__version__,
                "action_max_length": action_length, "observation_max_length": observation_length,
                "idle_timeout_s": idle_timeout_s}

    @app.get("/schema")
    def schema() -> Any:
        text = {"type": "string", **({"maxLength": action_length} if action_length is not None else {})}
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

    @app.post("/reset")
    async def reset(request: Request) -> Any:
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return error(422, "the body is not JSON; send {\"seed\": int, \"options\": {...}} or nothing")
        if not isinstance(body, dict):
            return error(422, "the body must be a JSON object such as {\"seed\": 0}")
        env = await asyncio.to_thread(env_factory)
        try:
            return await asyncio.to_thread(_Session(env, -1).reset, body)
        except _Error as problem:
            return error(422 if problem.code == "VALIDATION_ERROR" else 400, problem.message)
        finally:
            env.close()

    @app.post("/step")
    def step() -> Any:
        return error(409, "POST /step has no session in the OpenEnv protocol: open a WebSocket at /ws, send "
                          "{\"type\": \"reset\"}, then {\"type\": \"step\", \"data\": {\"text\": ...}}")

    async def send_error(websocket: WebSocket, code: str, message: str) -> None:
        await websocket.send_text(json.dumps({"type": "error", "data": {"message": message, "code": code}}))

    @app.websocket("/ws")
    async def session(websocket: WebSocket) -> None:
        await websocket.accept()
        with lock:
            full = len(sessions) >= max_sessions
            if not full:
                counter[0] += 1
                session_id = counter[0]
                sessions[session_id] = None  # type: ignore[assignment] - reserved while the env is built
        if full:
            await send_error(websocket, "CAPACITY_REACHED", f"the server holds {max_sessions} sessions "
                                                            "(--max-sessions); retry later")
            await websocket.close(code=1013, reason="CAPACITY_REACHED: too many sessions")  # 1013: try again later
            return
        current: _Session | None = None
        close_reason = ""
        try:
            current = _Session(await asyncio.to_thread(env_factory), session_id)
            sessions[session_id] = current
            while True:
                try:
                    raw = await asyncio.wait_for(websocket.receive_text(), timeout=idle_timeout_s)
                except TimeoutError:
                    await send_error(websocket, "IDLE_TIMEOUT", f"no message for {idle_timeout_s:g} s; the "
                                                                "session and its env are closed")
                    close_reason = "IDLE_TIMEOUT: session closed"
                    break
                try:
                    message = json.loads(raw)
                except ValueError as problem:
                    await send_error(websocket, "INVALID_JSON", f"invalid JSON: {problem}")
                    continue
                kind = message.get("type") if isinstance(message, dict) else None
                data = message.get("data", {}) if isinstance(message, dict) else {}
                if kind == "close":
                    break
                try:
                    if not isinstance(data, dict):
                        raise _Error("VALIDATION_ERROR", "\"data\" must be a JSON object")
                    if kind == "reset":
                        answer = {"type": "observation", "data": await asyncio.to_thread(current.reset, data)}
                    elif kind == "step":
                        answer = {"type": "observation", "data": await asyncio.to_thread(current.step, data)}
                    elif kind == "truncate":
                        answer = {"type": "observation", "data": await asyncio.to_thread(current.truncate)}
                    elif kind == "state":
                        answer = {"type": "state", "data": current.state()}
                    else:
                        raise _Error("UNKNOWN_TYPE", f"unknown message type {kind!r}; send reset, step, state "
                                                     "or close")
                except _Error as problem:
                    await send_error(websocket, problem.code, problem.message)
                    continue
                await websocket.send_text(json.dumps(answer, ensure_ascii=False))
        except WebSocketDisconnect:
            pass
        except Exception as problem:  # noqa: BLE001 - an env that breaks its contract ends its session only
            logger.exception("env server: session %s failed", session_id)
            try:
                await send_error(websocket, "SESSION_ERROR", f"{type(problem).__name__}: {problem}")
            except Exception:  # noqa: BLE001 - the client may be gone already
                pass
        finally:
            with lock:
                sessions.pop(session_id, None)
            if current is not None:
                await asyncio.to_thread(current.env.close)
            try:
                await websocket.close(reason=close_reason)
            except (RuntimeError, WebSocketDisconnect):  # already closed
                pass

    return app
