"""``RemoteEnv``: a ``gymnasium.Env`` whose episodes run on an OpenEnv server (ours, or any that speaks text).

It speaks the protocol that :mod:`agent_gym.adapters.openenv_server` serves (``agent-gym env serve ID``): one
WebSocket session per ``RemoteEnv``, opened at the first ``reset``. ``reset`` and ``step`` return what the env on
the server returned (the observation text and its info, ``messages`` included), so ``check_env`` passes over the
wire and the trainer's ``RolloutCollector`` trains against it like a local env. ``truncate()`` ends an episode
through the server env's own ``truncate()`` (our protocol extension), so a trainer's turn cap pays what the env
pays.

Every info is held to the env contract as it arrives (`agent_gym.contract`): an answer that breaks it raises
:class:`RemoteEnvError` saying which rule. A server whose env gives no ``new_messages`` (an older agent-gym, or
another text server) gets them derived from its ``messages``, so a ``RemoteEnv`` always hands out the whole
contract.

Every wait is bounded: a server that is gone, stopped or silent for ``timeout_s`` raises :class:`RemoteEnvError`
saying so; nothing hangs. The spaces are ``UnicodeText`` of the lengths the server's ``/metadata`` reports.

A turn too large for the server's message limit (``max_message_bytes`` in ``/metadata``, 4 MiB when a server
does not say) would close the session. It is cut instead, to the env's action limit and a note, so the env
still sees a turn over its limit and answers it as a local env answers any over-long turn: with a format error.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import gymnasium as gym

from agent_gym.contract import MESSAGES, NEW_MESSAGES, ContractError, check_reset_info, check_step_info, new_messages
from agent_gym.error import AgentGymError, InvalidValue
from agent_gym.spaces import UnicodeText

__all__ = ["RemoteEnv", "RemoteEnvError"]

_UNBOUNDED_TEXT = 1_000_000  # when a server reports no length
_DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # `agent-gym env serve`'s default, for a server that does not say


class RemoteEnvError(AgentGymError, RuntimeError):
    """The env server could not be reached, closed the session, timed out, or answered with an error."""


def _ws_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http):]
    if not url.startswith(("ws://", "wss://")):
        raise InvalidValue(f"base_url must start with http://, https://, ws:// or wss://, got {base_url!r}")
    return url.removesuffix("/ws") + "/ws"


def _http_url(base_url: str) -> str:
    return _ws_url(base_url).removesuffix("/ws").replace("ws://", "http://", 1).replace("wss://", "https://", 1)


class RemoteEnv(gym.Env[str, str]):
    """An env served over the OpenEnv protocol, as a local ``gymnasium.Env``.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8001`` (``agent-gym env serve ID --port 8001``).
        timeout_s: the longest wait for one answer (a slow tool call included).
        connect_timeout_s: the longest wait to reach the server.
    """

    metadata = {"render_modes": []}

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, connect_timeout_s: float = 10.0) -> None:
        import httpx

        self.base_url = base_url
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._ws_url = _ws_url(base_url)
        try:
            answer = httpx.get(f"{_http_url(base_url)}/metadata", timeout=connect_timeout_s)
            answer.raise_for_status()
            server = answer.json()
        except (httpx.HTTPError, ValueError) as error:
            raise RemoteEnvError(f"cannot read {_http_url(base_url)}/metadata ({error}); is "
                                 "`agent-gym env serve ID --port P` running there?") from error
        self.server_metadata = server
        self.observation_space = UnicodeText(max_length=int(server.get("observation_max_length") or _UNBOUNDED_TEXT))
        self.action_space = UnicodeText(max_length=int(server.get("action_max_length") or _UNBOUNDED_TEXT))
        self.max_message_bytes = int(server.get("max_message_bytes") or _DEFAULT_MAX_MESSAGE_BYTES)
        self._socket: Any = None
        self._session = ExitStack()
        self._messages: list[dict[str, Any]] | None = None  # the context of the last answer, to check the next

    def _checked_info(self, info: Any, step: bool) -> dict[str, Any]:
        """``info`` with ``new_messages`` (derived where the server gave none), held to the env contract."""
        try:
            if isinstance(info, dict) and NEW_MESSAGES not in info and MESSAGES in info:
                info = {**info, NEW_MESSAGES: new_messages(info)}
            if step:
                check_step_info(info, self._messages)
            else:
                check_reset_info(info)
        except ContractError as error:
            raise RemoteEnvError(f"the env server at {self._ws_url} broke the env contract: {error}") from error
        self._messages = list(info[MESSAGES])
        return info

    # ------------------------------------------------------------------------------------------ protocol

    def _connect(self) -> Any:
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        if self._socket is None:
            try:
                self._socket = self._session.enter_context(
                    connect(self._ws_url, open_timeout=self.connect_timeout_s, max_size=None, close_timeout=1))
            except (OSError, TimeoutError, WebSocketException) as error:
                raise RemoteEnvError(f"cannot open a session at {self._ws_url} ({error}); is the env server "
                                     "running?") from error
        return self._socket

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed, WebSocketException

        text = json.dumps(message)  # ASCII (a lone surrogate escaped), so its length is its size in bytes
        if len(text) > self.max_message_bytes:
            raise RemoteEnvError(f"a {message['type']} message of {len(text)} bytes exceeds the env server's limit "
                                 f"of {self.max_message_bytes} bytes (its --max-message-bytes)")
        socket = self._connect()
        try:
            socket.send(text)
            raw = socket.recv(timeout=self.timeout_s)
        except TimeoutError as error:
            self._drop()
            raise RemoteEnvError(f"the env server at {self._ws_url} sent no answer to {message['type']} within "
                                 f"{self.timeout_s:g} s (timeout_s)") from error
        except ConnectionClosed as error:
            self._drop()
            raise RemoteEnvError(f"the env server at {self._ws_url} closed the session ({error}); was it stopped? "
                                 "Call reset() to open a new session once it is back") from error
        except (OSError, WebSocketException) as error:
            self._drop()
            raise RemoteEnvError(f"lost the env server at {self._ws_url}: {error}") from error
        try:
            answer = json.loads(raw)
        except (TypeError, ValueError) as error:  # a binary frame, or not JSON
            raise RemoteEnvError(f"the env server at {self._ws_url} answered {message['type']} with something "
                                 f"that is not an OpenEnv message: {error}") from error
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
            raise RemoteEnvError(f"the env server at {self._ws_url} answered {message['type']} with something "
                                 f"that is not an OpenEnv message: expected an object with a \"data\" object, "
                                 f"got {raw[:200]!r}")
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            if data.get("code") in ("IDLE_TIMEOUT", "CAPACITY_REACHED", "SESSION_ERROR"):
                self._drop()
            raise RemoteEnvError(f"the env server refused {message['type']}: {data.get('message')} "
                                 f"({data.get('code')})")
        return answer["data"]

    def _drop(self) -> None:
        self._socket = None
        try:
            self._session.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail in many ways
            pass

    # ------------------------------------------------------------------------------------------ gym API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        data = self._request({"type": "reset", "data": {"seed": seed, "options": options}})
        observation = data["observation"]
        return observation["text"], self._checked_info(observation["info"], step=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action if isinstance(action, str) else str(action)
        if len(json.dumps(text)) + 64 > self.max_message_bytes:  # 64: the message's own fields
            text = self._cut_turn(text)
        data = self._request({"type": "step", "data": {"text": text}})
        observation = data["observation"]
        return (observation["text"], float(data.get("reward") or 0.0), bool(observation["terminated"]),
                bool(observation["truncated"]), self._checked_info(observation["info"], step=True))

    def _cut_turn(self, text: str) -> str:
        """``text`` cut to fit the server's message limit while still longer than the env's action limit, so the
        env refuses it as too long (a format error) as it refuses the whole turn locally."""
        limit = self.action_space.max_length
        text = text.replace("\x00", "")  # the env drops NULs before it reads a turn
        if len(json.dumps(text)) + 64 <= self.max_message_bytes:  # what is left is what the env would read
            return text
        note = (f"\n[... {len(text) - limit} more characters cut by RemoteEnv: the turn exceeds the env server's "
                f"{self.max_message_bytes}-byte message limit]")
        cut = text[:limit] + note
        if len(text) <= limit or len(json.dumps(cut)) + 64 > self.max_message_bytes:
            raise RemoteEnvError(f"a turn of {len(text)} characters cannot be sent within the env server's "
                                 f"{self.max_message_bytes}-byte message limit, and the env's action limit of "
                                 f"{limit} characters does not fit in it either; raise the server's "
                                 "--max-message-bytes")
        return cut

    def truncate(self) -> tuple[float, dict[str, Any]]:
        """End the episode through the server env's ``truncate()``; returns ``(reward, info)``."""
        data = self._request({"type": "truncate"})
        return float(data.get("reward") or 0.0), data["observation"]["info"]

    def close(self) -> None:
        """End the session (idempotent)."""
        if self._socket is not None:
            try:
                self._socket.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
        self._drop()
