"""Tools: @tool builds an OpenAI function schema; Tool.call never raises, whatever the tool or its arguments do."""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import math
import pickle
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import pytest

from agent_gym.tools import DEFAULT_TIMEOUT_S, FunctionTool, Tool, ToolResult, tool, validate_arguments
from agent_gym.tools import core as tool_core


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@tool
def convert(value: float, unit: Unit = Unit.CELSIUS, precision: int = 1) -> str:
    """Convert a temperature.

    Args:
        value: the temperature to convert.
        unit: the unit to convert to.
        precision: digits after the point.
    """
    degrees = value * 9 / 5 + 32 if unit == Unit.FAHRENHEIT.value else value
    return f"{degrees:.{precision}f}"


@tool
def lookup(
    query: str, mode: Literal["exact", "fuzzy"] = "exact", tags: list[str] | None = None, verbose: bool = False
) -> str:
    """Look something up.

    A second paragraph of the summary.

    Args:
        query: what to look for; this description
            continues on a second, deeper-indented line.
        mode: how to match.
        tags: optional filters.
        verbose: show more detail.

    Returns:
        The matching entry.
    """
    return f"{query}|{mode}|{tags}|{verbose}"


@tool(name="explode", timeout_s=5)
def explode_tool(message: str) -> str:
    """Raise an error with this message.

    Args:
        message: the error message.
    """
    raise RuntimeError(message)


def _properties(item: Tool) -> dict[str, Any]:
    return item.schema()["function"]["parameters"]["properties"]


# ---------------------------------------------------------------------------------------------- schema


def test_schema_is_an_openai_function() -> None:
    schema = lookup.schema()
    assert (schema["type"], schema["function"]["name"], schema["function"]["parameters"]["type"]) == (
        "function",
        "lookup",
        "object",
    )


def test_schema_description_is_the_docstring_summary() -> None:
    assert lookup.description == "Look something up. A second paragraph of the summary."


def test_schema_maps_python_types_to_json_types() -> None:
    properties = _properties(lookup)
    assert (properties["query"]["type"], properties["verbose"]["type"], properties["tags"]["type"]) == (
        "string",
        "boolean",
        "array",
    )


def test_schema_maps_float_to_number_and_int_to_integer() -> None:
    properties = _properties(convert)
    assert (properties["value"]["type"], properties["precision"]["type"]) == ("number", "integer")


def test_schema_list_of_str_has_string_items() -> None:
    assert _properties(lookup)["tags"]["items"] == {"type": "string"}


def test_schema_requires_only_parameters_without_defaults() -> None:
    assert lookup.parameters["required"] == ["query"]


def test_schema_records_defaults() -> None:
    properties = _properties(lookup)
    assert (properties["mode"]["default"], properties["verbose"]["default"]) == ("exact", False)


def test_schema_literal_becomes_enum() -> None:
    assert _properties(lookup)["mode"] == {
        "type": "string",
        "enum": ["exact", "fuzzy"],
        "description": "how to match.",
        "default": "exact",
    }


def test_schema_enum_class_becomes_enum_of_values_with_value_default() -> None:
    assert _properties(convert)["unit"] == {
        "type": "string",
        "enum": ["celsius", "fahrenheit"],
        "description": "the unit to convert to.",
        "default": "celsius",
    }


def test_schema_takes_argument_descriptions_from_docstring() -> None:
    assert _properties(lookup)["tags"]["description"] == "optional filters."


def test_schema_joins_multi_line_argument_descriptions() -> None:
    assert _properties(lookup)["query"]["description"] == (
        "what to look for; this description continues on a second, deeper-indented line."
    )


def test_schema_ignores_returns_section() -> None:
    assert "Returns" not in str(lookup.schema()) and "matching entry" not in str(lookup.schema())


def test_tool_options_set_name_and_timeout() -> None:
    @tool(name="nap", timeout_s=0.2)
    def sleep_long(text: str) -> str:
        """Sleep past the time limit.

        Args:
            text: ignored.
        """
        time.sleep(1.0)
        return text

    result = sleep_long.call({"text": "x"})
    assert sleep_long.schema()["function"]["name"] == "nap"
    assert (result.ok, result.text) == (False, "Error: nap timed out after 0.2 s")


def test_decorated_function_stays_callable() -> None:
    assert convert(100.0, precision=0) == "100"


def test_var_kwargs_cannot_be_a_tool() -> None:
    def anything(**kwargs: Any) -> str:
        """Anything."""
        return ""

    with pytest.raises(TypeError, match="kwargs"):
        tool(anything)


def test_unsupported_parameter_type_names_the_type() -> None:
    def bad(value: complex) -> str:
        """Bad."""
        return ""

    with pytest.raises(TypeError, match="complex"):
        tool(bad)


# ---------------------------------------------------------------------------------------------- calls


def test_call_runs_the_function_and_wraps_str_in_a_result() -> None:
    assert lookup.call({"query": "x"}) == ToolResult(text="x|exact|None|False")


def test_call_fills_defaults() -> None:
    assert convert.call({"value": 20.5}).text == "20.5"


def test_call_turns_json_integer_into_float_for_number_parameters() -> None:
    assert convert.call({"value": 20, "precision": 2}).text == "20.00"


def test_call_passes_enum_values() -> None:
    assert convert.call({"value": 100, "unit": "fahrenheit", "precision": 0}).text == "212"


@pytest.mark.parametrize(
    ("arguments", "named_problem"),
    [
        ({}, "missing required argument(s): query"),
        ({"query": 3}, "'query' must be of type string, got int"),
        ({"query": "x", "mode": "regex"}, "'mode' must be one of ['exact', 'fuzzy']"),
        ({"query": "x", "colour": "red"}, "unknown argument(s): colour"),
        ({"query": "x", "tags": ["a", 1]}, "'tags' item must be of type string"),
        ({"query": "x", "verbose": 1}, "'verbose' must be of type boolean"),
        (["x"], "arguments must be a JSON object, got list"),
        ("x", "arguments must be a JSON object, got str"),
    ],
)
def test_invalid_arguments_give_a_failed_result_naming_the_problem(arguments: Any, named_problem: str) -> None:
    result = lookup.call(arguments)
    assert not result.ok and named_problem in result.text


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400], ids=["nan", "inf", "-inf", "10**400"])
def test_number_argument_python_cannot_use_as_a_float_is_invalid(value: Any) -> None:
    result = convert.call({"value": value})
    assert not result.ok and "argument 'value' must be a finite number" in result.text


def test_bool_is_not_accepted_as_integer() -> None:
    assert "must be of type integer" in validate_arguments(convert.parameters, {"value": 1.0, "precision": True})


def test_exception_becomes_failed_result_with_its_message() -> None:
    result = explode_tool.call({"message": "kaboom"})
    assert (result.ok, result.text) == (False, "Error: explode failed: RuntimeError: kaboom")


def test_call_batch_keeps_order_and_reports_each_call() -> None:
    results = lookup.call_batch([{"query": "a"}, {"query": 1}, {"query": "c"}])
    assert [result.ok for result in results] == [True, False, True]


def test_call_batch_of_nothing_returns_nothing() -> None:
    assert lookup.call_batch([]) == []


# ---------------------------------------------------------------------------------------------- subclasses


class CountingEcho(Tool):
    """Echoes its text; counts how often run_batch ran, and fails on the text "fail"."""

    name = "echo"
    description = "Echo the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def run(self, text: str) -> ToolResult:
        if text == "fail":
            raise ValueError("asked to fail")
        return ToolResult(text=text, reward=0.5, metadata={"length": len(text)})

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        self.batch_sizes.append(len(calls))
        return [self.run(**arguments) for arguments in calls]


def test_subclass_schema_uses_class_attributes() -> None:
    assert CountingEcho().schema()["function"] == {
        "name": "echo",
        "description": "Echo the text.",
        "parameters": CountingEcho.parameters,
    }


def test_subclass_result_keeps_reward_and_metadata() -> None:
    result = CountingEcho().call({"text": "hi"})
    assert (result.reward, result.metadata) == (0.5, {"length": 2})


def test_call_batch_runs_valid_calls_as_one_run_batch() -> None:
    echo = CountingEcho()
    echo.call_batch([{"text": "a"}, {"text": "b"}, {"wrong": 1}, {"text": "c"}])
    assert echo.batch_sizes == [3]


def test_failing_call_does_not_fail_its_batch_mates() -> None:
    results = CountingEcho().call_batch([{"text": "a"}, {"text": "fail"}, {"text": "c"}])
    assert [(result.ok, result.text) for result in results] == [
        (True, "a"),
        (False, "Error: echo failed: ValueError: asked to fail"),
        (True, "c"),
    ]


def test_tool_without_run_gives_failed_result() -> None:
    class Unfinished(Tool):
        name = "unfinished"

    result = Unfinished().call({})
    assert not result.ok and "does not implement run()" in result.text


def test_run_batch_returning_wrong_count_fails_every_call() -> None:
    class Lossy(CountingEcho):
        def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
            return []

    results = Lossy().call_batch([{"text": "a"}, {"text": "b"}])
    assert [result.ok for result in results] == [False, False]


def test_run_batch_returning_no_list_fails_every_call() -> None:
    class Silent(CountingEcho):
        def run_batch(self, calls: Sequence[dict[str, Any]]) -> None:
            return None

    results = Silent().call_batch([{"text": "a"}, {"text": "b"}])
    assert [result.text for result in results] == ["Error: echo returned a NoneType, not a list of 2 results"] * 2


def test_slow_tool_times_out_as_failed_result() -> None:
    class Sleepy(Tool):
        name = "sleepy"
        timeout_s = 0.2

        def run(self) -> str:
            time.sleep(1.0)
            return "woke up"

    result = Sleepy().call({})
    assert (result.ok, result.text) == (False, "Error: sleepy timed out after 0.2 s")


class _NeverDone:
    """Stands in for the tool pool's future: records the time limit it is waited with, then times out."""

    waited: list[float] = []

    def result(self, timeout: float) -> None:
        self.waited.append(timeout)
        raise concurrent.futures.TimeoutError


def test_function_tool_has_a_default_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # a call of a tool given no timeout_s is waited for 30 s (the documented default), then fails
    monkeypatch.setattr(_NeverDone, "waited", [])
    monkeypatch.setattr(tool_core._TIMEOUT_POOL, "submit", lambda *args: _NeverDone())
    result = lookup.call({"query": "x"})
    assert _NeverDone.waited == [DEFAULT_TIMEOUT_S] == [30.0]
    assert (result.ok, result.text) == (False, "Error: lookup timed out after 30 s")


def test_timeout_none_turns_the_limit_off() -> None:
    # without a limit the call runs in the caller's thread: nothing waits on it, so nothing can cut it off
    ran_in: list[threading.Thread] = []

    def where(text: str) -> str:
        ran_in.append(threading.current_thread())
        return text

    FunctionTool(where, name="where", timeout_s=None).call({"text": "a"})
    FunctionTool(where, name="where", timeout_s=5).call({"text": "b"})
    assert ran_in[0] is threading.current_thread() and ran_in[1] is not threading.current_thread()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive number of seconds or None, got 0"):
        FunctionTool(lambda text: text, name="echo", timeout_s=0)


def test_each_call_of_a_batch_gets_its_own_timeout() -> None:
    def nap(text: str) -> str:
        time.sleep(0.3)
        return text

    results = FunctionTool(nap, name="nap", timeout_s=1.0).call_batch([{"text": str(i)} for i in range(5)])
    assert [result.text for result in results] == ["0", "1", "2", "3", "4"]


def test_fast_tool_with_timeout_returns_its_result() -> None:
    result = FunctionTool(lambda text: text.upper(), name="upper", timeout_s=5).call({"text": "ok"})
    assert result == ToolResult(text="OK")


def test_tool_raising_system_exit_gives_a_failed_result() -> None:
    def quit_now(text: str) -> str:
        sys.exit(3)

    result = FunctionTool(quit_now, name="quit_now").call({"text": "x"})
    assert (result.ok, result.text) == (False, "Error: quit_now failed: SystemExit: 3")


def test_tool_raising_system_exit_without_a_timeout_gives_a_failed_result() -> None:
    def quit_now(text: str) -> str:
        raise SystemExit("bye")

    result = FunctionTool(quit_now, name="quit_now", timeout_s=None).call({"text": "x"})
    assert (result.ok, result.text) == (False, "Error: quit_now failed: SystemExit: bye")


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_keyboard_interrupt_in_a_tool_still_stops_the_process(timeout_s: float | None) -> None:
    def interrupted(text: str) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        FunctionTool(interrupted, name="interrupted", timeout_s=timeout_s).call({"text": "x"})


# ---------------------------------------------------------------------------------------------- async tools


@tool
async def shout(text: str) -> str:
    """Shout the text back.

    Args:
        text: what to shout.
    """
    await asyncio.sleep(0)
    return text.upper()


def test_async_function_tool_is_awaited() -> None:
    assert shout.call({"text": "hi"}) == ToolResult(text="HI")


def test_async_function_tool_without_timeout_is_awaited() -> None:
    assert FunctionTool(shout.function, name="shout", timeout_s=None).call({"text": "hi"}).text == "HI"


def test_async_tool_runs_when_an_event_loop_is_already_running() -> None:
    async def inside_a_loop() -> ToolResult:
        return FunctionTool(shout.function, name="shout", timeout_s=None).call({"text": "hi"})

    assert asyncio.run(inside_a_loop()).text == "HI"


def test_async_subclass_run_is_awaited_for_every_call_of_a_batch() -> None:
    class AsyncEcho(Tool):
        name = "echo"
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        async def run(self, text: str) -> ToolResult:
            await asyncio.sleep(0)
            return ToolResult(text=text)

    assert [result.text for result in AsyncEcho().call_batch([{"text": "a"}, {"text": "b"}])] == ["a", "b"]


def test_slow_async_tool_times_out_as_failed_result() -> None:
    async def dawdle(text: str) -> str:
        await asyncio.sleep(1.0)
        return text

    result = FunctionTool(dawdle, name="dawdle", timeout_s=0.2).call({"text": "x"})
    assert (result.ok, result.text) == (False, "Error: dawdle timed out after 0.2 s")


def test_async_tool_exception_becomes_failed_result() -> None:
    async def broken(text: str) -> str:
        raise RuntimeError("no")

    result = FunctionTool(broken, name="broken").call({"text": "x"})
    assert (result.ok, result.text) == (False, "Error: broken failed: RuntimeError: no")


# ---------------------------------------------------------------------------------------------- pickling


def test_module_level_tool_pickles_by_reference() -> None:
    assert pickle.loads(pickle.dumps(lookup)) is lookup


def test_unpickled_tool_still_runs() -> None:
    assert pickle.loads(pickle.dumps(convert)).call({"value": 1.5}).text == "1.5"
