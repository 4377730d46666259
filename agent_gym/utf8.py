"""Valid UTF-8 for text that leaves the env: lone surrogates ("\ud800", which a JSON escape or undecodable
program output can produce) cannot be written to a UTF-8 file or sent over a WebSocket, so they become "?"."""

from __future__ import annotations

from typing import Any

__all__ = ["valid_utf8", "valid_utf8_json"]


def valid_utf8(text: str) -> str:
    """``text`` with every lone surrogate replaced by "?" (``text`` itself when it has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def valid_utf8_json(value: Any) -> Any:
    """A parsed JSON value with :func:`valid_utf8` applied to every string in it, keys included.

    Lists and dicts are edited in place, without recursion: JSON nested as deep as the parser allows must not
    raise RecursionError here.
    """
    if isinstance(value, str):
        return valid_utf8(value)
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = valid_utf8(item)
                elif isinstance(item, list | dict):
                    stack.append(item)
        elif isinstance(node, dict):
            items = list(node.items())
            node.clear()
            for key, item in items:
                if isinstance(item, str):
                    item = valid_utf8(item)
                elif isinstance(item, list | dict):
                    stack.append(item)
                node[valid_utf8(key) if isinstance(key, str) else key] = item
    return value
