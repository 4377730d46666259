"""uvicorn's HTTP protocols with a deadline on request heads, so slow connections cannot pile up.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` seconds, but it sets no limit on a
connection that opens and sends nothing, or sends its request head a byte at a time (each byte resets the
keep-alive timer): measured, 2,000 such connections stayed open indefinitely. Here a connection must deliver a
whole request head within ``timeout_keep_alive`` seconds of opening or of its last response, else it is
closed. The body has a deadline of its own (``http_body_limit.BodySizeLimit``); a request in progress is never cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEADLINE_PROTOCOL"]


class _HeadDeadline:
    """Mixin for a uvicorn HTTP protocol class (it reads ``loop``, ``config``, ``cycle`` and ``transport``)."""

    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._arm_head_deadline()  # the next request's head gets a fresh deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        seconds = self.config.timeout_keep_alive  # type: ignore[attr-defined]
        self._head_deadline = self.loop.call_later(seconds, self._head_deadline_passed)  # type: ignore[attr-defined]

    def _head_deadline_passed(self) -> None:
        cycle = self.cycle  # type: ignore[attr-defined]
        waiting_for_a_head = cycle is None or cycle.response_complete
        if waiting_for_a_head and not self.transport.is_closing():  # type: ignore[attr-defined]
            self.transport.close()  # type: ignore[attr-defined]


class H11WithDeadline(_HeadDeadline, H11Protocol):
    """uvicorn's h11 protocol with the head deadline."""


DEADLINE_PROTOCOL: type = H11WithDeadline
try:  # uvicorn's "auto" prefers httptools when it is installed: keep that choice
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:
    pass
else:

    class HttpToolsWithDeadline(_HeadDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the head deadline."""

    DEADLINE_PROTOCOL = HttpToolsWithDeadline
