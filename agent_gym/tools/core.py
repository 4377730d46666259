"""Tools: named callables with an OpenAI function schema (docs/DESIGN.md §3).

Write a tool either as a typed function with a Google-style docstring::

    @tool
    def calculate(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. "(3 + 4) * 2".
        '''

or by subclassing :class:`Tool` and implementing :meth:`Tool.run` (and, for tools that gain from batching such
as search, :meth:`Tool.run_batch`). ``async def`` functions and ``run`` methods are awaited. Whatever a tool
does, :meth:`Tool.call` returns a :class:`ToolResult`: exceptions (``SystemExit`` included), time-outs and
invalid arguments become ``ok=False`` results that the agent reads. Only ``KeyboardInterrupt`` goes through,
so that Ctrl-C still stops the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import importlib
import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from agent_gym.error import InvalidType, InvalidValue

__all__ = ["Tool", "ToolResult", "FunctionTool", "tool", "validate_arguments", "DEFAULT_TIMEOUT_S"]

#: seconds one call of a tool may take before it becomes a failed result (``timeout_s=None`` turns it off)
DEFAULT_TIMEOUT_S = 30.0

# One shared pool runs tool calls that carry a timeout; a timed-out call keeps its thread until it returns,
# so the pool is sized to tolerate a few stuck calls without blocking the next ones.
_TIMEOUT_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="agent-gym-tool")


@dataclass
class ToolResult:
    """What a tool returns to the environment.

    Attributes:
        text: what the agent reads.
        ok: False when the call failed (bad arguments, exception, time-out).
        reward: an optional process reward the tool itself assigns to this call.
        metadata: machine-readable detail (e.g. retrieved titles) for rewards and logging.
    """

    text: str
    ok: bool = True
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def error(cls, message: str, **metadata: Any) -> ToolResult:
        return cls(text=f"Error: {message}", ok=False, metadata=dict(metadata))


class Tool:
    """Base class of every tool.

    Subclasses set ``name``, ``description`` and ``parameters`` (a JSON schema of type ``object``) and
    implement :meth:`run` (plain or ``async``). ``timeout_s`` bounds each call (:data:`DEFAULT_TIMEOUT_S`;
    ``None`` runs calls in the caller's thread with no limit); for a tool that overrides :meth:`run_batch`,
    it bounds each batch. Python cannot stop a thread, so a call that timed out keeps running in the
    background until it returns; its result is dropped. Tools are shared by all environments of a vector env,
    so keep per-episode state out of them.
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    timeout_s: float | None = DEFAULT_TIMEOUT_S

    def run(self, **arguments: Any) -> ToolResult | str:
        """Execute one call with validated arguments."""
        raise NotImplementedError(f"tool {self.name!r} does not implement run()")

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult | str]:
        """Execute several calls at once; override when batching is cheaper (e.g. one search for N queries)."""
        return [self.run(**arguments) for arguments in calls]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def call(self, arguments: Any) -> ToolResult:
        """Validate and execute one call; never raises."""
        return self.call_batch([arguments])[0]

    def call_batch(self, calls: Sequence[Any]) -> list[ToolResult]:
        """Validate and execute several calls; invalid ones fail alone, the rest run as one batch. Never raises."""
        results: list[ToolResult | None] = [None] * len(calls)
        valid_indices: list[int] = []
        valid_arguments: list[dict[str, Any]] = []
        for index, arguments in enumerate(calls):
            problem = validate_arguments(self.parameters, arguments)
            if problem is None:
                valid_indices.append(index)
                valid_arguments.append(arguments)
            else:
                results[index] = ToolResult.error(f"invalid arguments for {self.name}: {problem}")
        for index, result in zip(valid_indices, self.call_validated(valid_arguments), strict=True):
            results[index] = result
        return [result for result in results if result is not None]

    def call_validated(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        """Execute calls whose arguments already passed :func:`validate_arguments`, as one batch. Never raises.

        :class:`~agent_gym.env.ToolEnv` validates each call when it parses a turn, so it runs them through here.
        """
        if not calls:
            return []
        return self._execute([_with_defaults(self.parameters, arguments) for arguments in calls])

    def evidence(self, result: ToolResult) -> Sequence[str]:
        """Titles of the evidence a result shows the agent (e.g. the pages a search returned); none by default.

        The env matches them against the task's ``supporting_titles``: for the ``dense`` process reward and for
        ``info["evidence_recall"]``. A tool that retrieves documents overrides this.
        """
        return ()

    def _execute(self, calls: list[dict[str, Any]]) -> list[ToolResult]:
        if self.timeout_s is not None and len(calls) > 1 and type(self).run_batch is Tool.run_batch:
            return [result for call in calls for result in self._execute([call])]  # a time limit per call
        try:
            if self.timeout_s is None:
                raw = self._run_batch_awaited(calls)
            else:
                future = _TIMEOUT_POOL.submit(self._run_batch_awaited, calls)
                raw = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            return [ToolResult.error(f"{self.name} timed out after {self.timeout_s:g} s")] * len(calls)
        except (Exception, SystemExit) as exc:  # a tool's failure is the agent's observation, not the process's end
            if len(calls) > 1:  # one bad call must not fail its batch-mates: retry them one by one
                return [result for call in calls for result in self._execute([call])]
            return [ToolResult.error(f"{self.name} failed: {type(exc).__name__}: {exc}")]
        if not isinstance(raw, list | tuple):
            problem = f"{self.name} returned a {type(raw).__name__}, not a list of {len(calls)} results"
            return [ToolResult.error(problem)] * len(calls)
        if len(raw) != len(calls):
            return [ToolResult.error(f"{self.name} returned {len(raw)} results for {len(calls)} calls")] * len(calls)
        return [item if isinstance(item, ToolResult) else ToolResult(text=str(item)) for item in raw]

    def _run_batch_awaited(self, calls: list[dict[str, Any]]) -> Any:
        """``run_batch``, with any coroutine it returns (an ``async def`` tool's) run to its end."""
        raw = self.run_batch(calls)
        if inspect.isawaitable(raw):
            raw = _run_coroutine(_awaited(raw))
        if isinstance(raw, list) and any(inspect.isawaitable(item) for item in raw):
            raw = _run_coroutine(_gathered(raw))  # the calls of a batch run concurrently
        return raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A tool made from a plain function by :func:`tool`."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        summary, argument_docs = _parse_docstring(inspect.getdoc(function) or "")
        self.function = function
        self.name = name or function.__name__
        self.description = description or summary
        self.parameters = _schema_from_signature(function, argument_docs)
        self.timeout_s = _checked_timeout(timeout_s)
        self.__doc__ = function.__doc__

    def run(self, **arguments: Any) -> ToolResult | str:
        return self.function(**arguments)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the tool object calls the wrapped function, so it stays usable as plain Python."""
        return self.function(*args, **kwargs)

    def __reduce__(self):
        # `@tool` rebinds the function's module-level name to this object, so pickle the tool by that name
        # (AsyncVectorEnv ships env factories to worker processes by pickling them).
        module = sys.modules.get(self.function.__module__)
        if getattr(module, self.function.__qualname__, None) is self:
            return (_tool_by_reference, (self.function.__module__, self.function.__qualname__))
        return (FunctionTool, (self.function,), {"name": self.name, "description": self.description,
                                                  "timeout_s": self.timeout_s})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.description, self.timeout_s = state["name"], state["description"], state["timeout_s"]


def _tool_by_reference(module_name: str, qualname: str) -> FunctionTool:
    return getattr(importlib.import_module(module_name), qualname)


def _checked_timeout(timeout_s: float | None) -> float | None:
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
        raise InvalidValue(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    return float(timeout_s)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _gathered(items: list[Any]) -> list[Any]:
    """Await the awaitables of a list concurrently; an exception fails the batch (and so its retry per call)."""

    async def value_of(item: Any) -> Any:
        return await item if inspect.isawaitable(item) else item

    return list(await asyncio.gather(*(value_of(item) for item in items)))


def _run_coroutine(coroutine: Any) -> Any:
    """Run a coroutine to its end from synchronous code, even where an event loop already runs in this thread
    (a notebook, an async trainer): then it runs on a fresh loop in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-gym-async-tool") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Any:
    """Turn a typed function (plain or ``async def``) with a docstring into a :class:`Tool`.

    The schema comes from the signature (``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``Literal`` and
    ``Enum`` types; parameters without defaults are required) and the docstring's ``Args:`` section.
    Usable bare (``@tool``) or with options (``@tool(timeout_s=2)``); each call may take ``timeout_s`` seconds
    (30 by default; ``None`` for no limit) before it becomes a failed result.
    """

    def wrap(inner: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(inner, name=name, description=description, timeout_s=timeout_s)

    return wrap(function) if function is not None else wrap


# ---------------------------------------------------------------------------------------------- schemas

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def _type_schema(annotation: Any) -> dict[str, Any]:
    origin = get_origin(annotation)
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return {**_type_schema(type(values[0])), "enum": values} if values else {}
    if origin is Literal:
        values = list(get_args(annotation))
        return {**_type_schema(type(values[0])), "enum": values}
    if origin in (list, tuple, Sequence, typing.Sequence) or annotation in (list, tuple):
        args = get_args(annotation)
        item = _type_schema(args[0]) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            return _type_schema(options[0])
        return {"anyOf": [_type_schema(option) for option in options]}
    if origin is dict:
        return {"type": "object"}
    raise InvalidType(f"tool parameters cannot have type {annotation!r}; use str, int, float, bool, list, Literal")


def _schema_from_signature(function: Callable[..., Any], argument_docs: dict[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise InvalidType(f"tool {function.__name__}: *args/**kwargs cannot be described by a schema")
        prop = _type_schema(hints.get(parameter.name, inspect.Parameter.empty))
        if parameter.name in argument_docs:
            prop["description"] = argument_docs[parameter.name]
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
        else:
            default = parameter.default
            prop["default"] = default.value if isinstance(default, enum.Enum) else default
        properties[parameter.name] = prop
    return {"type": "object", "properties": properties, "required": required}


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and per-argument descriptions."""
    lines = doc.splitlines()
    summary_lines: list[str] = []
    argument_docs: dict[str, str] = {}
    index = 0
    while index < len(lines) and not _ARGS_HEADER.match(lines[index]) and not _SECTION_HEADER.match(lines[index]):
        summary_lines.append(lines[index].strip())
        index += 1
    current: str | None = None
    in_args = False
    args_indent: int | None = None  # indent of the argument lines; deeper lines continue the previous one
    for line in lines[index:]:
        if _ARGS_HEADER.match(line):
            in_args, current, args_indent = True, None, None
            continue
        if _SECTION_HEADER.match(line):
            in_args, current = False, None
            continue
        if not in_args or not line.strip():
            continue
        match = _ARG_LINE.match(line)
        if match and (args_indent is None or _indent(line) <= args_indent):
            args_indent = _indent(line)
            current = match.group(1)
            argument_docs[current] = match.group(3).strip()
        elif current:
            argument_docs[current] = f"{argument_docs[current]} {line.strip()}".strip()
    summary = " ".join(part for part in summary_lines if part).strip()
    return summary, argument_docs


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


# ---------------------------------------------------------------------------------------------- validation


def validate_arguments(schema: dict[str, Any], arguments: Any) -> str | None:
    """Check call arguments against a tool's object schema; return a message for the agent, or None if valid."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [name for name in arguments if name not in properties]
    if unknown and schema.get("additionalProperties", False) is False and properties:
        return f"unknown argument(s): {', '.join(map(str, unknown))}; expected {', '.join(properties)}"
    for name, value in arguments.items():
        if name in properties:
            problem = _check_value(properties[name], value)
            if problem:
                return f"argument {name!r} {problem}"
    return None


def _check_value(schema: dict[str, Any], value: Any) -> str | None:
    if "anyOf" in schema:
        if all(_check_value(option, value) for option in schema["anyOf"]):
            return f"has an unsupported value {_short_repr(value)}"
        return None
    expected = schema.get("type")
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if expected in checks and not checks[expected](value):
        return f"must be of type {expected}, got {type(value).__name__}"
    if expected == "number" and not _is_finite_float(value):
        return f"must be a finite number, got {_short_repr(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}, got {_short_repr(value)}"
    if expected == "array" and "items" in schema:
        for item in value:
            problem = _check_value(schema["items"], item)
            if problem:
                return f"item {problem}"
    return None


def _is_finite_float(value: int | float) -> bool:
    """NaN, infinities and integers beyond a double's range cannot reach a tool as a float."""
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    return math.isfinite(value)


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and abs(value) > sys.float_info.max:  # repr() of a huge int is long, or refused
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)[:80]


def _with_defaults(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    filled = dict(arguments)
    for name, prop in schema.get("properties", {}).items():
        if name not in filled and "default" in prop:
            filled[name] = prop["default"]
    # JSON has one number type: an integer the agent wrote for a "number" parameter reaches Python as float
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") == "number" and isinstance(filled.get(name), int):
            filled[name] = float(filled[name])
    return filled
