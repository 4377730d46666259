"""The ``summarize`` context policy's default summarizer (docs/DESIGN.md §2): an extractive summary of folded turns.

When a ``summarize`` env folds its older turns, each tool call they made becomes one line: the call, and the
lines of its result that share the most words with the call's arguments (at most two; the first line when none
shares a word). The reasoning text of those turns is dropped. The summary never exceeds its budget; when the
calls do not fit, the newest are kept. Extractive, so it needs no model and invents nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agent_gym.formats import ToolCall, ToolFormat

__all__ = ["extractive_summary", "SUMMARY_HEADER"]

#: the first line of the message that carries a summary into the context
SUMMARY_HEADER = "Summary of your earlier turns:"

_LINES_PER_CALL = 2
_MIN_ENTRY_CHARS = 80  # below this an entry says too little: keep fewer calls instead
_CALL_CHARS = 200
_WORD = re.compile(r"\w+")
# words too common to make a result line relevant
_STOPWORDS = frozenset("the and was for with who what where when which how that this from are his her its not "
                       "but has had have were doc title".split())
_WRAPPER = re.compile(r"^<(information)>(.*)</\1>$", re.DOTALL)


def extractive_summary(
    messages: Sequence[dict[str, Any]],
    tool_format: ToolFormat,
    tool_schemas: Sequence[dict[str, Any]],
    *,
    max_calls: int,
    max_chars: int,
) -> str:
    """Summarise folded turns (an assistant message, then what the env appended) in at most ``max_chars``."""
    entries = [_entry(call, lines) for call, lines in _calls_with_result_lines(messages, tool_format, tool_schemas,
                                                                               max_calls)]
    if not entries:
        return "- no tool ran in those turns."[:max_chars]
    left_out = 0
    while len(entries) > 1 and (max_chars - len(_left_out_line(left_out + 1))) // len(entries) < _MIN_ENTRY_CHARS:
        entries.pop(0)  # the oldest call goes first
        left_out += 1
    head = [_left_out_line(left_out)] if left_out else []
    share = max(1, (max_chars - sum(len(line) + 1 for line in head)) // len(entries) - 1)
    text = "\n".join(head + [_cut(entry, share) for entry in entries])
    return text[:max_chars]


def _left_out_line(count: int) -> str:
    return f"- ({count} earlier calls left out)"


def _entry(call: ToolCall, lines: list[str]) -> str:
    arguments = _cut(json.dumps(call.arguments, ensure_ascii=False), _CALL_CHARS)
    best = _relevant_lines(lines, _words(" ".join(_strings(call.arguments))))
    return f"- {call.name} {arguments} -> {' | '.join(best) if best else '(no result)'}"


def _relevant_lines(lines: list[str], query: set[str]) -> list[str]:
    scored = [(len(_words(line) & query), index, line) for index, line in enumerate(lines)]
    relevant = sorted((item for item in scored if item[0] > 0), key=lambda item: (-item[0], item[1]))
    chosen = relevant[:_LINES_PER_CALL] or scored[:1]
    return [line for _, _, line in chosen]


def _calls_with_result_lines(
    messages: Sequence[dict[str, Any]], tool_format: ToolFormat, tool_schemas: Sequence[dict[str, Any]],
    max_calls: int,
) -> list[tuple[ToolCall, list[str]]]:
    """Each usable call of the folded turns, with the lines of its result.

    A turn is an assistant message and the messages after it. Formats whose results are ``tool`` messages
    (hermes, openai) give one per parsed call, in order; xml gives one ``<information>`` message for the whole
    turn, whose lines every call of the turn shares. Feedback on malformed turns is not a result.
    """
    pairs: list[tuple[ToolCall, list[str]]] = []
    for assistant, appended in _turns(messages):
        calls = tool_format.parse(_action_text(assistant), tool_schemas, max_calls).tool_calls
        tool_results = [_lines(message) for message in appended if message.get("role") == "tool"]
        shared = [line for message in appended if _is_wrapped_result(message) for line in _lines(message)]
        for index, call in enumerate(calls):
            if call.error is not None:
                continue
            lines = tool_results[index] if len(tool_results) == len(calls) else shared
            pairs.append((call, lines))
    return pairs


def _turns(messages: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    turns: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for message in messages:
        if message.get("role") == "assistant":
            turns.append((message, []))
        elif turns:
            turns[-1][1].append(message)
    return turns


def _action_text(message: dict[str, Any]) -> str:
    """The turn as the agent wrote it: openai-format turns are recorded with structured ``tool_calls``."""
    if message.get("tool_calls"):
        return json.dumps({"content": message.get("content"), "tool_calls": message["tool_calls"]})
    return str(message.get("content") or "")


def _is_wrapped_result(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and bool(_WRAPPER.match(str(message.get("content") or "").strip()))


def _lines(message: dict[str, Any]) -> list[str]:
    text = str(message.get("content") or "").strip()
    wrapped = _WRAPPER.match(text)
    if wrapped:
        text = wrapped.group(2)
    return [line.strip() for line in text.splitlines() if line.strip()]


def _words(text: str) -> set[str]:
    return {word for word in _WORD.findall(text.lower()) if len(word) > 2 and word not in _STOPWORDS}


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return [str(value)]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"
