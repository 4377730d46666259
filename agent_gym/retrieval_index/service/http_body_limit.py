"""A pure-ASGI guard on request bodies, shared by the search server and the env server.

A ``Content-Length`` over the limit is refused (413) before any byte is read. Other bodies (``Transfer-Encoding:
chunked`` has no length) are counted as they arrive and refused as soon as they pass the limit; a body that takes
longer than its deadline to arrive gets 408. A body within the limit is handed to the app from memory. Measured
before this guard: a 60 MB chunked body was read and parsed in full by the search server (RSS 86 -> 184 MB), and a
600 MiB ``POST /reset`` took the env server from 85 to 1,284 MiB.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

__all__ = ["BodySizeLimit", "send_json_error"]


async def send_json_error(send: Any, status: int, message: str) -> None:
    """Answer ``{"error": message, "detail": message}`` from ASGI middleware, closing the connection (its body is
    left unread)."""
    body = json.dumps({"error": message, "detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """413 for a body over ``max_body_bytes`` (read no further than that), 408 for one slower than ``body_timeout``
    seconds; ``hint`` ends the 413's message (what a well-formed request holds)."""

    def __init__(self, app: Any, max_body_bytes: int, body_timeout: float, hint: str = "") -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.hint = hint

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                await self._refuse(send, f"the request body ({int(value)} bytes)")
                return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout):  # a body trickled in forever would hold a connection
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client went away
                        return
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.max_body_bytes:
                        await self._refuse(send, "the request body")
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await send_json_error(send, 408, f"the request body did not arrive within {self.body_timeout:g} s")
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:  # the app waits for a disconnect after the body: pass the real one on
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, what: str) -> None:
        hint = f"; {self.hint}" if self.hint else ""
        await send_json_error(send, 413, f"{what} exceeds the limit of {self.max_body_bytes} bytes{hint}")
