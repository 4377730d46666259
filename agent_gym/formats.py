"""Tool-call wire formats: parse an agent's turn, render tool results (docs/DESIGN.md §3).

A format is independent of the tools, so every tool speaks every format:

- ``hermes`` (default; Qwen2.5's native): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  results in ``<tool_response>...</tool_response>``.
- ``xml`` (Search-R1 style): ``<search>query</search>``, results in ``<information>...</information>``.
- ``openai``: the turn is an assistant message as JSON with structured ``tool_calls``.

In every format the final answer goes in ``<answer>...</answer>``, written outside any tool call: an answer
tag inside a call's body is part of the call. Parsing never raises: whatever is wrong with a turn (bad JSON,
numbers Python cannot hold, NaN) is described in :attr:`ParsedAction.errors` (turn-level) or
:attr:`ToolCall.error` (call-level), in words meant for the agent.
"""

from __future__ import annotations

import json
import math
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gym.error import AgentGymError, InvalidValue
from agent_gym.tools import ToolResult
from agent_gym.utf8 import valid_utf8_json

__all__ = [
    "ToolCall",
    "ParsedAction",
    "ToolFormat",
    "HermesFormat",
    "XMLFormat",
    "OpenAIFormat",
    "get_format",
    "FORMATS",
]

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass
class ToolCall:
    """One call parsed from a turn. ``error`` is set when the call is unusable (bad JSON, unknown tool...)."""

    name: str
    arguments: Any
    id: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "error": self.error}


@dataclass
class ParsedAction:
    """What a turn contains: tool calls, a final answer, and turn-level format errors."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def well_formed(self) -> bool:
        """True when the turn follows the format and every call in it is usable."""
        return not self.errors and all(call.error is None for call in self.tool_calls)


def _schema_names(tool_schemas: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {schema["function"]["name"]: schema["function"] for schema in tool_schemas}


def _extract_answer(text: str, errors: list[str]) -> str | None:
    """The text of the first ``<answer>...</answer>``; records an error for unclosed or empty answers."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        if ANSWER_CLOSE in text:
            errors.append(f"found {ANSWER_CLOSE} without a matching {ANSWER_OPEN}.")
        return None
    end = text.find(ANSWER_CLOSE, start)
    if end < 0:
        errors.append(f"the {ANSWER_OPEN} tag is not closed; end your answer with {ANSWER_CLOSE}.")
        return None
    answer = text[start + len(ANSWER_OPEN) : end].strip()
    if not answer:
        errors.append("the answer is empty; put your answer between <answer> and </answer>.")
        return None
    if ANSWER_OPEN in answer:
        errors.append("nested <answer> tags; give one answer.")
        return None
    return answer


def _check_known_tool(call: ToolCall, known: dict[str, dict[str, Any]]) -> ToolCall:
    if call.error is None and call.name not in known:
        available = ", ".join(sorted(known)) or "none"
        call.error = f"unknown tool {call.name[:80]!r}; available tools: {available}."
    return call


class JSONProblem(AgentGymError, ValueError):
    """Why a JSON text was refused, in words meant for the agent."""


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e400 overflows to inf
        raise JSONProblem(f"{token[:40]} is not a finite number")
    return value


def _bounded_int(token: str) -> int:
    # Python refuses int(str) beyond sys.get_int_max_str_digits() (4,300 by default) with a ValueError
    digits = len(token.lstrip("-"))
    limit = sys.get_int_max_str_digits()
    if limit and digits > limit:
        raise JSONProblem(f"an integer of {digits} digits is longer than the {limit} allowed")
    return int(token)


def _no_constant(token: str) -> Any:
    raise JSONProblem(f"{token} is not a finite number")  # NaN, Infinity, -Infinity: not JSON (RFC 8259)


# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): alone, it decodes to a string UTF-8 cannot encode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _loads(text: str) -> Any:
    """Strict ``json.loads``: every refusal (bad syntax, too-deep nesting, NaN, 1e400, an integer of more digits
    than Python converts) raises :class:`JSONProblem`, never a RecursionError or a bare ValueError. Lone
    surrogates in its strings become "?" (valid UTF-8, see :mod:`agent_gym.utf8`)."""
    try:
        value = json.loads(text, parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_no_constant)
        return valid_utf8_json(value) if _SURROGATE_ESCAPE.search(text) else value
    except JSONProblem:
        raise
    except json.JSONDecodeError as exc:
        raise JSONProblem(f"{exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise JSONProblem("nested too deeply at position 0") from None
    except ValueError as exc:  # anything else the decoder refuses
        raise JSONProblem(str(exc)[:200]) from None


def _parse_arguments(raw: Any) -> tuple[Any, str | None]:
    """Arguments may arrive as an object or as a JSON string of one (OpenAI style); normalise to a dict."""
    if isinstance(raw, str):
        try:
            raw = _loads(raw) if raw.strip() else {}
        except JSONProblem as exc:
            return raw, f"the arguments are not valid JSON ({exc})."
    if not isinstance(raw, dict):
        return raw, f"the arguments must be a JSON object, got {type(raw).__name__}."
    return raw, None


def _answer_outside(parts: Sequence[str], errors: list[str]) -> str | None:
    """The final answer, looked for only in the text between tool calls (``parts``)."""
    return _extract_answer(" ".join(parts), errors)


def _cap_calls(parsed: ParsedAction, max_calls: int) -> None:
    if len(parsed.tool_calls) > max_calls:
        parsed.errors.append(f"{len(parsed.tool_calls)} tool calls in one turn; at most {max_calls} run.")
        del parsed.tool_calls[max_calls:]


def _no_action_error(example_call: str) -> str:
    return (
        "no tool call and no final answer found. "
        f"Call a tool like {example_call} or finish with <answer>your answer</answer>."
    )


@dataclass
class _CallScan:
    """What a scan of a turn for tag-delimited calls found."""

    outside: list[str] = field(default_factory=list)  # the text between calls, where an answer may be
    calls: list[tuple[str, str]] = field(default_factory=list)  # (opening tag as written, body)
    call_errors: list[str] = field(default_factory=list)
    unclosed: bool = False


def _scan_calls(
    action: str,
    next_call: Callable[[int], tuple[int, int, str] | None],
    unclosed: Callable[[str], str],
    nested: Callable[[str], str],
) -> _CallScan:
    """Split a turn into calls and the text outside them; the hermes and xml formats differ only in how the
    next opening tag is found (``next_call(position) -> (start, body_start, closing tag)``) and in their
    messages. Everything after an unclosed tag is inside it; a body holding its own opening tag is refused."""
    scan, position = _CallScan(), 0
    while True:
        found = next_call(position)
        if found is None:
            scan.outside.append(action[position:])
            return scan
        start, body_start, close = found
        scan.outside.append(action[position:start])
        end = action.find(close, body_start)
        if end < 0:
            scan.call_errors.append(unclosed(close))
            scan.unclosed = True
            return scan
        opening, body = action[start:body_start], action[body_start:end]
        position = end + len(close)
        if opening in body:
            scan.call_errors.append(nested(opening))
            continue
        scan.calls.append((opening, body))


def _finish_parse(parsed: ParsedAction, scan: _CallScan, max_calls: int, example_call: str) -> ParsedAction:
    """The answer outside the calls, the call errors after the turn's own, the call cap, and the hint for a turn
    that did nothing."""
    parsed.answer = _answer_outside(scan.outside, parsed.errors)
    parsed.errors.extend(scan.call_errors)
    _cap_calls(parsed, max_calls)
    if parsed.answer is None and not parsed.tool_calls and not parsed.errors:
        parsed.errors.append(_no_action_error(example_call))
    return parsed


class ToolFormat(ABC):
    """How tool calls, tool results and answers are written as text."""

    name: str = ""
    #: strings after which generation should stop (the end of a call or of an answer), whatever the tools
    stop_strings: tuple[str, ...] = ()

    def stop_strings_for(self, tool_schemas: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        """The stop strings of this format with these tools (xml adds each tool's closing tag)."""
        return self.stop_strings

    def check_tools(self, tool_schemas: Sequence[dict[str, Any]]) -> None:  # noqa: B027 (optional hook)
        """Raise ``ValueError`` if this format cannot express a call to one of these tools."""

    @abstractmethod
    def parse(self, action: str, tool_schemas: Sequence[dict[str, Any]], max_calls: int) -> ParsedAction:
        """Parse one turn. Never raises."""

    @abstractmethod
    def render_call(self, call: ToolCall) -> str:
        """Write a call the way an agent would (scripted policies and SFT data use this)."""

    @abstractmethod
    def instructions(self, tool_schemas: Sequence[dict[str, Any]]) -> str:
        """The protocol description put in the system prompt."""

    @abstractmethod
    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        """Chat messages that carry tool results into the context."""

    def render_answer(self, answer: str) -> str:
        return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def assistant_message(self, action: str) -> dict[str, Any]:
        """The chat message that records the agent's turn in the context."""
        return {"role": "assistant", "content": action}

    def feedback_message(self, text: str) -> dict[str, Any]:
        """A message telling the agent what was wrong with its turn (no tool ran)."""
        return {"role": "user", "content": text}

    def message_text(self, message: dict[str, Any]) -> str:
        """The text an observation shows for one appended message."""
        return str(message.get("content", ""))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class HermesFormat(ToolFormat):
    """Qwen2.5 / Hermes function calling: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    name = "hermes"
    stop_strings = ("</tool_call>", ANSWER_CLOSE)
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, action: str, tool_schemas: Sequence[dict[str, Any]], max_calls: int) -> ParsedAction:
        parsed = ParsedAction()
        known = _schema_names(tool_schemas)

        def next_call(position: int) -> tuple[int, int, str] | None:
            start = action.find(self._OPEN, position)
            return None if start < 0 else (start, start + len(self._OPEN), self._CLOSE)

        scan = _scan_calls(
            action, next_call,
            unclosed=lambda close: f"a {self._OPEN} tag is not closed; end each call with {close}.",
            nested=lambda opening: f"nested {opening} tags; write one call per {opening} block.",
        )
        if self._CLOSE in scan.outside[-1] and not scan.unclosed:
            scan.call_errors.append(f"found {self._CLOSE} without a matching {self._OPEN}.")
        for _opening, body in scan.calls:
            parsed.tool_calls.append(_check_known_tool(self._parse_body(body, len(parsed.tool_calls)), known))
        example = next(iter(known), "search")
        return _finish_parse(parsed, scan, max_calls,
                             f'<tool_call>{{"name": "{example}", "arguments": {{...}}}}</tool_call>')

    @staticmethod
    def _parse_body(body: str, index: int) -> ToolCall:
        call_id = f"call_{index}"
        try:
            payload = _loads(body)
        except JSONProblem as exc:
            return ToolCall("", None, call_id, f"the tool call is not valid JSON ({exc}).")
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return ToolCall("", None, call_id, 'a tool call must be a JSON object with a string "name".')
        arguments, problem = _parse_arguments(payload.get("arguments", payload.get("parameters", {})))
        return ToolCall(payload["name"], arguments, call_id, problem)

    def render_call(self, call: ToolCall) -> str:
        payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{self._OPEN}\n{payload}\n{self._CLOSE}"

    def instructions(self, tool_schemas: Sequence[dict[str, Any]]) -> str:
        signatures = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
        return (
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{signatures}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "Results come back within <tool_response></tool_response> tags. "
            "When you know the final answer, write it within <answer></answer> tags."
        )

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [
            {"role": "tool", "name": call.name, "tool_call_id": call.id, "content": result.text}
            for call, result in zip(calls, results, strict=True)
        ]

    def message_text(self, message: dict[str, Any]) -> str:
        if message.get("role") == "tool":
            return f"<tool_response>\n{message['content']}\n</tool_response>"
        return str(message.get("content", ""))


class XMLFormat(ToolFormat):
    """Search-R1 style: ``<search>query</search>``.

    A tool whose one parameter is a string takes it as the tag's plain body; any other tool takes a JSON object
    of its arguments (``<convert>{"value": 20, "unit": "fahrenheit"}</convert>``), and a JSON object works for
    every tool. Generation stops at any tool's closing tag or at ``</answer>``.
    """

    name = "xml"
    stop_strings = (ANSWER_CLOSE,)
    _TAG = re.compile(r"<([A-Za-z_][\w-]{0,63})>")
    #: tags the format itself uses, which a tool may not be named
    RESERVED_TAGS = ("answer", "information")

    def stop_strings_for(self, tool_schemas: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        return tuple(f"</{name}>" for name in _schema_names(tool_schemas)) + self.stop_strings

    def check_tools(self, tool_schemas: Sequence[dict[str, Any]]) -> None:
        for name in _schema_names(tool_schemas):
            if name in self.RESERVED_TAGS or not self._TAG.fullmatch(f"<{name}>"):
                raise InvalidValue(
                    f"the xml format cannot call a tool named {name!r}: a tool's name must be a tag name "
                    f"(letters, digits, _ and -, at most 64) other than {' or '.join(self.RESERVED_TAGS)}; "
                    "rename the tool or use tool_format='hermes'"
                )

    def parse(self, action: str, tool_schemas: Sequence[dict[str, Any]], max_calls: int) -> ParsedAction:
        parsed = ParsedAction()
        known = _schema_names(tool_schemas)

        def next_call(position: int) -> tuple[int, int, str] | None:
            # <answer>, <think> and prose tags are not calls
            match = next((m for m in self._TAG.finditer(action, position) if m.group(1) in known), None)
            return None if match is None else (match.start(), match.end(), f"</{match.group(1)}>")

        scan = _scan_calls(
            action, next_call,
            unclosed=lambda close: f"the <{close[2:-1]}> tag is not closed; end it with {close}.",
            nested=lambda opening: f"nested {opening} tags; write one call per tag.",
        )
        for opening, body in scan.calls:
            name = opening[1:-1]
            parsed.tool_calls.append(self._call_from_body(name, body.strip(), known[name], len(parsed.tool_calls)))
        first = next(iter(known), "search")
        return _finish_parse(parsed, scan, max_calls, f"<{first}>...</{first}>")

    @staticmethod
    def _plain_parameter(function: dict[str, Any]) -> str | None:
        """The parameter a plain tag body fills: the tool's one (required) parameter, when it is a string."""
        parameters = function.get("parameters", {})
        properties = parameters.get("properties", {})
        candidates = parameters.get("required") or list(properties)
        if len(candidates) != 1:
            return None
        kind = properties.get(candidates[0], {}).get("type", "string")
        return candidates[0] if kind == "string" else None

    @staticmethod
    def _json_example(function: dict[str, Any]) -> str:
        parameters = function.get("parameters", {})
        required = parameters.get("required") or list(parameters.get("properties", {}))
        return "{" + ", ".join(f'"{name}": ...' for name in required) + "}"

    def _call_from_body(self, name: str, body: str, function: dict[str, Any], index: int) -> ToolCall:
        call_id = f"call_{index}"
        if body.startswith("{"):  # a JSON object carries the arguments by name
            arguments, problem = _parse_arguments(body)
            return ToolCall(name, arguments, call_id, problem)
        if not function.get("parameters", {}).get("properties"):
            return ToolCall(name, {}, call_id)
        parameter = self._plain_parameter(function)
        if parameter is None:
            example = f"<{name}>{self._json_example(function)}</{name}>"
            return ToolCall(name, body, call_id, f"<{name}> takes its arguments as a JSON object, e.g. {example}.")
        return ToolCall(name, {parameter: body}, call_id)

    def render_call(self, call: ToolCall) -> str:
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        values = list(arguments.values())
        if len(values) == 1 and isinstance(values[0], str) and not values[0].strip().startswith("{"):
            body = values[0]
        else:
            body = json.dumps(arguments, ensure_ascii=False)
        return f"<{call.name}>{body}</{call.name}>"

    def instructions(self, tool_schemas: Sequence[dict[str, Any]]) -> str:
        lines = []
        any_json = False
        for schema in tool_schemas:
            function = schema["function"]
            name = function["name"]
            parameters = function.get("parameters", {})
            plain = self._plain_parameter(function)
            required = parameters.get("required") or []
            optional = [key for key in parameters.get("properties", {}) if key not in required and key != plain]
            if plain is None and parameters.get("properties"):
                any_json = True
                body = self._json_example(function)
                note = f" Optional arguments: {', '.join(optional)}." if optional else ""
            else:
                body = plain or ""
                note = f" Optional arguments, in a JSON body: {', '.join(optional)}." if optional and plain else ""
            lines.append(f"- <{name}>{body}</{name}>: {function['description']}{note}")
        json_rule = "Where a tag shows a JSON object, write the arguments as a JSON object inside the tag.\n"
        return (
            "You can use these tools by writing the tag with its input:\n" + "\n".join(lines) + "\n"
            + (json_rule if any_json else "")
            + "The results will be returned between <information> and </information>. "
            "When you know the final answer, write it between <answer> and </answer>."
        )

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        body = "\n".join(result.text for result in results)
        return [{"role": "user", "content": f"<information>{body}</information>"}]


class OpenAIFormat(ToolFormat):
    """Chat-completions style: the turn is an assistant message (JSON) with structured ``tool_calls``.

    As a string, a turn is either that message as JSON (``{"content": ..., "tool_calls": [...]}``) or plain text,
    read as the message's ``content``. The final answer is the text within ``<answer></answer>`` tags in the
    content, as the prompt asks; content without them is not an answer.
    """

    name = "openai"
    stop_strings = ()

    def parse(self, action: str, tool_schemas: Sequence[dict[str, Any]], max_calls: int) -> ParsedAction:
        parsed = ParsedAction()
        known = _schema_names(tool_schemas)
        message, problem = self._message(action)
        if message is None:
            example = next(iter(known), "search")
            parsed.errors.append(
                f"the turn must be an assistant message as JSON{problem}, "
                'e.g. {"content": null, "tool_calls": '
                f'[{{"id": "call_0", "type": "function", "function": {{"name": "{example}", "arguments": '
                '"{...}"}}]}, or text with the final answer within <answer></answer> tags.'
            )
            return parsed
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            parsed.errors.append('"tool_calls" must be a list.')
            raw_calls = []
        for index, raw in enumerate(raw_calls):
            parsed.tool_calls.append(_check_known_tool(self._parse_call(raw, index), known))
        _cap_calls(parsed, max_calls)
        content = message.get("content")
        has_text = isinstance(content, str) and bool(content.strip())
        if has_text and (ANSWER_OPEN in content or ANSWER_CLOSE in content):
            parsed.answer = _extract_answer(content, parsed.errors)
        if parsed.answer is None and not parsed.tool_calls and not parsed.errors:
            parsed.errors.append(
                "the message has no tool_calls, and its content has no final answer within <answer></answer> tags."
                if has_text else "the message has neither tool_calls nor content with a final answer."
            )
        return parsed

    @staticmethod
    def _message(action: str) -> tuple[dict[str, Any] | None, str]:
        """The assistant message a turn holds (its JSON, or plain text with an answer tag as its content), or
        None and what was wrong with the JSON (as ``" (...)"``, empty when the turn is not JSON)."""
        stripped = action.strip()
        if not stripped.startswith("{"):
            return ({"content": action} if ANSWER_OPEN in action or ANSWER_CLOSE in action else None), ""
        try:
            message = _loads(stripped)
        except JSONProblem as exc:
            return None, f" (not valid JSON: {exc})"
        return (message, "") if isinstance(message, dict) else (None, "")

    @staticmethod
    def _parse_call(raw: Any, index: int) -> ToolCall:
        if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
            return ToolCall("", None, f"call_{index}", 'each tool call needs a "function" object.')
        call_id = str(raw.get("id") or f"call_{index}")[:64]
        function = raw["function"]
        name = function.get("name")
        if not isinstance(name, str):
            return ToolCall("", None, call_id, 'a tool call\'s "function" needs a string "name".')
        arguments, problem = _parse_arguments(function.get("arguments", "{}"))
        return ToolCall(name, arguments, call_id, problem)

    def render_call(self, call: ToolCall) -> str:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        payload = {"id": call.id or "call_0", "type": "function",
                   "function": {"name": call.name, "arguments": arguments}}
        return json.dumps({"role": "assistant", "content": None, "tool_calls": [payload]}, ensure_ascii=False)

    def render_answer(self, answer: str) -> str:
        return json.dumps({"role": "assistant", "content": f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"})

    def assistant_message(self, action: str) -> dict[str, Any]:
        message, _ = self._message(action)
        if message is None:
            return {"role": "assistant", "content": action}
        content = message.get("content")
        if content is not None and not isinstance(content, str):  # keep the context a valid chat transcript
            content = json.dumps(content, ensure_ascii=False)
        recorded: dict[str, Any] = {"role": "assistant", "content": content}
        if isinstance(message.get("tool_calls"), list) and message["tool_calls"]:
            recorded["tool_calls"] = message["tool_calls"]
        return recorded

    def instructions(self, tool_schemas: Sequence[dict[str, Any]]) -> str:
        names = ", ".join(schema["function"]["name"] for schema in tool_schemas)
        return (
            f"Use the provided functions ({names}) through tool calls. "
            "When you know the final answer, reply with it within <answer></answer> tags."
        )

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [
            {"role": "tool", "tool_call_id": call.id, "content": result.text}
            for call, result in zip(calls, results, strict=True)
        ]


FORMATS: dict[str, type[ToolFormat]] = {"hermes": HermesFormat, "xml": XMLFormat, "openai": OpenAIFormat}


def get_format(name: str | ToolFormat) -> ToolFormat:
    """Return the wire format of this name (or the format object itself)."""
    if isinstance(name, ToolFormat):
        return name
    try:
        return FORMATS[name]()
    except KeyError:
        raise InvalidValue(f"unknown tool format {name!r}; choose one of {sorted(FORMATS)}") from None
