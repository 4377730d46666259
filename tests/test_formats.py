"""Wire formats: every turn parses into calls, an answer or errors meant for the agent; parsing never raises."""

from __future__ import annotations

import json

import pytest

from agent_gym.formats import FORMATS, ToolCall, get_format
from agent_gym.tools import tool


@tool
def search(query: str) -> str:
    """Search the corpus.

    Args:
        query: what to search for.
    """
    return query


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return str(a + b)


SCHEMAS = [search.schema(), add.schema()]
MAX_CALLS = 3


def parse(format_name: str, action: str, max_calls: int = MAX_CALLS):
    return get_format(format_name).parse(action, SCHEMAS, max_calls)


def hermes_call(name: str, arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def openai_calls(*calls: tuple[str, object]) -> str:
    tool_calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(calls)
    ]
    return json.dumps({"role": "assistant", "content": None, "tool_calls": tool_calls})


def _call_pairs(action) -> list[tuple[str, object]]:
    return [(call.name, call.arguments) for call in action.tool_calls]


# ---------------------------------------------------------------------------------------------- lookup


def test_get_format_knows_the_three_formats() -> None:
    assert sorted(FORMATS) == ["hermes", "openai", "xml"]


def test_get_format_passes_a_format_object_through() -> None:
    fmt = get_format("xml")
    assert get_format(fmt) is fmt


def test_get_format_rejects_unknown_name_listing_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown tool format 'yaml'; choose one of \['hermes'"):
        get_format("yaml")


# ---------------------------------------------------------------------------------------------- hermes


def test_hermes_parses_one_call() -> None:
    assert _call_pairs(parse("hermes", "I will search.\n" + hermes_call("search", {"query": "Paris"}))) == [
        ("search", {"query": "Paris"})
    ]


def test_hermes_single_call_is_well_formed() -> None:
    assert parse("hermes", hermes_call("search", {"query": "Paris"})).well_formed


def test_hermes_parses_several_calls_in_order() -> None:
    action = hermes_call("search", {"query": "a"}) + "\n" + hermes_call("add", {"a": 1, "b": 2})
    assert _call_pairs(parse("hermes", action)) == [("search", {"query": "a"}), ("add", {"a": 1, "b": 2})]


def test_hermes_accepts_parameters_key_for_arguments() -> None:
    action = '<tool_call>{"name": "search", "parameters": {"query": "x"}}</tool_call>'
    assert _call_pairs(parse("hermes", action)) == [("search", {"query": "x"})]


def test_hermes_accepts_arguments_as_json_string() -> None:
    action = '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>'
    assert _call_pairs(parse("hermes", action)) == [("search", {"query": "x"})]


def test_hermes_extracts_answer() -> None:
    assert parse("hermes", "<think>easy</think><answer> Paris </answer>").answer == "Paris"


def test_hermes_caps_calls_per_turn() -> None:
    action = "".join(hermes_call("search", {"query": str(i)}) for i in range(5))
    assert len(parse("hermes", action).tool_calls) == MAX_CALLS


def test_hermes_reports_calls_beyond_the_cap() -> None:
    action = "".join(hermes_call("search", {"query": str(i)}) for i in range(5))
    assert parse("hermes", action).errors == ["5 tool calls in one turn; at most 3 run."]


def test_hermes_no_call_and_no_answer_says_how_to_call() -> None:
    (error,) = parse("hermes", "I think the answer is Paris.").errors
    assert error.startswith("no tool call and no final answer found") and "<tool_call>" in error


def test_hermes_bad_json_is_a_call_error() -> None:
    (call,) = parse("hermes", '<tool_call>{"name": "search", "arguments": {query: x}}</tool_call>').tool_calls
    assert call.error.startswith("the tool call is not valid JSON")


def test_hermes_json_without_name_is_a_call_error() -> None:
    (call,) = parse("hermes", '<tool_call>{"arguments": {}}</tool_call>').tool_calls
    assert call.error == 'a tool call must be a JSON object with a string "name".'


def test_hermes_non_object_arguments_are_a_call_error() -> None:
    (call,) = parse("hermes", '<tool_call>{"name": "search", "arguments": [1]}</tool_call>').tool_calls
    assert call.error == "the arguments must be a JSON object, got list."


def test_hermes_unknown_tool_lists_available_tools() -> None:
    (call,) = parse("hermes", hermes_call("browse", {"url": "x"})).tool_calls
    assert call.error == "unknown tool 'browse'; available tools: add, search."


def test_hermes_unknown_tool_turn_is_not_well_formed() -> None:
    assert not parse("hermes", hermes_call("browse", {"url": "x"})).well_formed


def test_hermes_nested_call_tags_are_an_error() -> None:
    action = "<tool_call><tool_call>" + json.dumps({"name": "search", "arguments": {"query": "x"}}) + "</tool_call>"
    assert parse("hermes", action).errors == ["nested <tool_call> tags; write one call per <tool_call> block."]


def test_hermes_unclosed_call_tag_is_an_error() -> None:
    action = '<tool_call>{"name": "search", "arguments": {"query": "x"}}'
    assert parse("hermes", action).errors == ["a <tool_call> tag is not closed; end each call with </tool_call>."]


def test_hermes_stray_closing_tag_is_an_error() -> None:
    assert parse("hermes", "oops</tool_call>").errors == ["found </tool_call> without a matching <tool_call>."]


def test_hermes_deeply_nested_json_is_a_call_error_not_a_crash() -> None:
    (call,) = parse("hermes", "<tool_call>" + "[" * 50_000 + "</tool_call>").tool_calls
    assert call.error == "the tool call is not valid JSON (nested too deeply at position 0)."


# ---------------------------------------------------------------------------------------------- numbers (shared)

HUGE_INTEGER = "1" + "0" * 5_000  # past Python's 4,300-digit limit on int(str)


@pytest.mark.parametrize(
    ("format_name", "action"),
    [
        ("hermes", '<tool_call>{"name": "search", "arguments": {"query": ' + HUGE_INTEGER + "}}</tool_call>"),
        ("hermes", f"<tool_call>[{HUGE_INTEGER}]</tool_call>"),
        ("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": ' + HUGE_INTEGER + '}"}</tool_call>'),
        ("xml", '<add>{"a": ' + HUGE_INTEGER + ', "b": 1}</add>'),
        ("openai", '{"content": ' + HUGE_INTEGER + "}"),
        ("openai", json.dumps({"tool_calls": [{"function": {"name": "add",
                                                            "arguments": '{"a": ' + HUGE_INTEGER + "}"}}]})),
    ],
    ids=["hermes-argument", "hermes-bare", "hermes-argument-string", "xml-body", "openai-message",
         "openai-arguments"],
)
def test_integer_beyond_pythons_digit_limit_is_a_parse_error(format_name: str, action: str) -> None:
    parsed = parse(format_name, action)
    problems = parsed.errors + [call.error for call in parsed.tool_calls if call.error]
    assert any("5001 digits" in problem for problem in problems)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_non_finite_json_number_is_a_parse_error(format_name: str, number: str) -> None:
    body = '{"a": ' + number + ', "b": 1}'
    action = f'<tool_call>{{"name": "add", "arguments": {body}}}</tool_call>' if format_name == "hermes" else (
        f"<add>{body}</add>")
    (call,) = parse(format_name, action).tool_calls
    assert "not a finite number" in call.error


def test_openai_non_finite_number_in_arguments_is_a_call_error() -> None:
    action = json.dumps({"tool_calls": [{"function": {"name": "add", "arguments": '{"a": NaN, "b": 1}'}}]})
    (call,) = parse("openai", action).tool_calls
    assert "not a finite number" in call.error


def test_float_beyond_double_range_names_the_number() -> None:
    (call,) = parse("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1e400, "b": 1}}</tool_call>').tool_calls
    assert call.error == "the tool call is not valid JSON (1e400 is not a finite number)."


# ---------------------------------------------------------------------------------------------- answers (shared)


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_unclosed_answer_tag_is_an_error(format_name: str) -> None:
    assert parse(format_name, "<answer>Paris").errors == [
        "the <answer> tag is not closed; end your answer with </answer>."
    ]


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_empty_answer_is_an_error(format_name: str) -> None:
    assert parse(format_name, "<answer>  </answer>").errors == [
        "the answer is empty; put your answer between <answer> and </answer>."
    ]


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_nested_answer_tags_are_an_error(format_name: str) -> None:
    assert parse(format_name, "<answer><answer>Paris</answer></answer>").errors == [
        "nested <answer> tags; give one answer."
    ]


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_closing_answer_without_opening_is_an_error(format_name: str) -> None:
    assert "found </answer> without a matching <answer>." in parse(format_name, "Paris</answer>").errors


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_first_of_two_answers_counts(format_name: str) -> None:
    assert parse(format_name, "<answer>Paris</answer><answer>Lyon</answer>").answer == "Paris"


def test_hermes_answer_inside_a_call_is_not_an_answer() -> None:
    parsed = parse("hermes", hermes_call("search", {"query": "<answer>x</answer>"}))
    assert (parsed.answer, _call_pairs(parsed)) == (None, [("search", {"query": "<answer>x</answer>"})])


def test_xml_answer_inside_a_call_is_not_an_answer() -> None:
    parsed = parse("xml", "<search>a</information><answer>x</answer></search>")
    assert (parsed.answer, _call_pairs(parsed)) == (None, [("search", {"query": "a</information><answer>x</answer>"})])


def test_hermes_answer_inside_an_unclosed_call_is_not_an_answer() -> None:
    parsed = parse("hermes", '<tool_call>{"name": "search", "arguments": {"query": "<answer>x</answer>"}}')
    assert parsed.answer is None
    assert parsed.errors == ["a <tool_call> tag is not closed; end each call with </tool_call>."]


@pytest.mark.parametrize("format_name", ["hermes", "xml"])
def test_answer_outside_calls_is_found_next_to_a_call(format_name: str) -> None:
    call = get_format(format_name).render_call(ToolCall("search", {"query": "Paris"}))
    parsed = parse(format_name, f"{call}\n<answer>Paris</answer>")
    assert (parsed.answer, len(parsed.tool_calls)) == ("Paris", 1)


def test_openai_answer_in_content_is_found_next_to_tool_calls() -> None:
    message = json.loads(openai_calls(("search", {"query": "a"})))
    message["content"] = "<answer>Paris</answer>"
    parsed = parse("openai", json.dumps(message))
    assert (parsed.answer, len(parsed.tool_calls)) == ("Paris", 1)


def test_openai_answer_tag_in_arguments_is_not_an_answer() -> None:
    parsed = parse("openai", openai_calls(("search", {"query": "<answer>x</answer>"})))
    assert (parsed.answer, parsed.errors) == (None, [])


# ---------------------------------------------------------------------------------------------- xml


def test_xml_parses_tag_body_as_first_required_parameter() -> None:
    assert _call_pairs(parse("xml", "<search> Eiffel Tower </search>")) == [("search", {"query": "Eiffel Tower"})]


def test_xml_parses_json_body_as_all_arguments() -> None:
    assert _call_pairs(parse("xml", '<add>{"a": 1, "b": 2}</add>')) == [("add", {"a": 1, "b": 2})]


def test_xml_parses_several_calls() -> None:
    assert _call_pairs(parse("xml", "<search>a</search> then <search>b</search>")) == [
        ("search", {"query": "a"}),
        ("search", {"query": "b"}),
    ]


def test_xml_ignores_tags_that_are_not_tools() -> None:
    assert _call_pairs(parse("xml", "<think>plan</think><search>x</search>")) == [("search", {"query": "x"})]


def test_xml_extracts_answer() -> None:
    assert parse("xml", "<think>done</think><answer>Paris</answer>").answer == "Paris"


def test_xml_caps_calls_per_turn() -> None:
    assert len(parse("xml", "<search>q</search>" * 5, max_calls=2).tool_calls) == 2


def test_xml_no_call_and_no_answer_names_a_tool_tag() -> None:
    (error,) = parse("xml", "just prose").errors
    assert error.startswith("no tool call and no final answer found") and "<search>...</search>" in error


def test_xml_bad_json_body_is_a_call_error() -> None:
    (call,) = parse("xml", "<add>{a: 1}</add>").tool_calls
    assert call.error.startswith("the arguments are not valid JSON")


def test_xml_unclosed_tag_is_an_error() -> None:
    assert parse("xml", "<search>Eiffel Tower").errors == ["the <search> tag is not closed; end it with </search>."]


def test_xml_nested_tags_are_an_error() -> None:
    assert "nested <search> tags; write one call per tag." in parse("xml", "<search>a <search>b</search>").errors


def test_xml_unknown_tag_is_not_a_call() -> None:
    assert parse("xml", "<browse>x</browse>").tool_calls == []


def test_xml_stop_strings_close_every_tool_tag_and_the_answer() -> None:
    assert get_format("xml").stop_strings_for(SCHEMAS) == ("</search>", "</add>", "</answer>")


def test_hermes_stop_strings_do_not_depend_on_the_tools() -> None:
    assert get_format("hermes").stop_strings_for(SCHEMAS) == ("</tool_call>", "</answer>")


@pytest.mark.parametrize("name", ["answer", "information", "web search"])
def test_xml_refuses_a_tool_it_cannot_write_as_a_tag(name: str) -> None:
    schema = {"type": "function", "function": {"name": name, "description": "", "parameters": {}}}
    with pytest.raises(ValueError, match=f"the xml format cannot call a tool named '{name}'"):
        get_format("xml").check_tools([schema])


def test_xml_instructions_prompt_a_json_body_for_a_tool_with_several_arguments() -> None:
    assert '<add>{"a": ..., "b": ...}</add>' in get_format("xml").instructions(SCHEMAS)


def test_xml_instructions_name_the_optional_arguments() -> None:
    @tool
    def convert(value: float, unit: str = "celsius") -> str:
        """Convert a temperature.

        Args:
            value: degrees.
            unit: the unit to convert to.
        """
        return str(value)

    assert '- <convert>{"value": ...}</convert>: Convert a temperature. Optional arguments: unit.' in (
        get_format("xml").instructions([convert.schema()]))


def test_xml_instructions_prompt_a_plain_body_for_a_tool_with_one_string_argument() -> None:
    assert "<search>query</search>" in get_format("xml").instructions(SCHEMAS)


def test_xml_plain_body_for_a_tool_with_several_arguments_says_to_write_json() -> None:
    (call,) = parse("xml", "<add>1 2</add>").tool_calls
    assert call.error == '<add> takes its arguments as a JSON object, e.g. <add>{"a": ..., "b": ...}</add>.'


def test_xml_renders_a_string_that_looks_like_json_as_a_json_body() -> None:
    fmt = get_format("xml")
    call = ToolCall("search", {"query": "{not json"})
    assert _call_pairs(fmt.parse(fmt.render_call(call), SCHEMAS, MAX_CALLS)) == [("search", {"query": "{not json"})]


def test_xml_a_call_inside_another_call_is_part_of_its_body() -> None:
    assert _call_pairs(parse("xml", '<search>see <add>{"a": 1, "b": 2}</add> here</search>')) == [
        ("search", {"query": 'see <add>{"a": 1, "b": 2}</add> here'})
    ]


# ---------------------------------------------------------------------------------------------- openai


def test_openai_parses_structured_calls() -> None:
    action = openai_calls(("search", {"query": "a"}), ("add", {"a": 1, "b": 2}))
    assert _call_pairs(parse("openai", action)) == [("search", {"query": "a"}), ("add", {"a": 1, "b": 2})]


def test_openai_keeps_call_ids() -> None:
    assert [call.id for call in parse("openai", openai_calls(("search", {"query": "a"}))).tool_calls] == ["c0"]


def test_openai_accepts_arguments_as_object() -> None:
    action = json.dumps({"tool_calls": [{"function": {"name": "search", "arguments": {"query": "x"}}}]})
    assert _call_pairs(parse("openai", action)) == [("search", {"query": "x"})]


def test_openai_plain_text_with_answer_tags_is_the_answer() -> None:
    assert parse("openai", "It is <answer>Paris</answer>.").answer == "Paris"


def test_openai_plain_text_without_answer_tags_is_a_format_error() -> None:
    parsed = parse("openai", "I think it is 5280 but I'm not sure")
    (error,) = parsed.errors
    assert parsed.answer is None and error.startswith("the turn must be an assistant message as JSON")
    assert error.endswith("or text with the final answer within <answer></answer> tags.")


def test_openai_content_without_answer_tags_is_a_format_error() -> None:
    assert parse("openai", json.dumps({"content": "Paris"})).errors == [
        "the message has no tool_calls, and its content has no final answer within <answer></answer> tags."
    ]


def test_openai_content_answer_tags_are_extracted() -> None:
    assert parse("openai", json.dumps({"content": "It is <answer>Paris</answer>."})).answer == "Paris"


def test_openai_caps_calls_per_turn() -> None:
    action = openai_calls(*[("search", {"query": str(i)}) for i in range(4)])
    assert len(parse("openai", action, max_calls=2).tool_calls) == 2


def test_openai_no_call_and_no_answer_is_an_error() -> None:
    assert parse("openai", json.dumps({"content": None})).errors == [
        "the message has neither tool_calls nor content with a final answer."
    ]


def test_openai_broken_json_message_is_an_error() -> None:
    (error,) = parse("openai", '{"content": "x", "tool_calls": [').errors
    assert error.startswith("the turn must be an assistant message as JSON")


def test_openai_bad_argument_json_is_a_call_error() -> None:
    action = json.dumps({"tool_calls": [{"function": {"name": "search", "arguments": "{query"}}]})
    (call,) = parse("openai", action).tool_calls
    assert call.error.startswith("the arguments are not valid JSON")


def test_openai_unknown_tool_is_a_call_error() -> None:
    (call,) = parse("openai", openai_calls(("browse", {}))).tool_calls
    assert call.error.startswith("unknown tool 'browse'")


def test_openai_tool_calls_not_a_list_is_an_error() -> None:
    assert parse("openai", json.dumps({"tool_calls": {"name": "search"}})).errors == ['"tool_calls" must be a list.']


def test_openai_call_without_function_object_is_a_call_error() -> None:
    (call,) = parse("openai", json.dumps({"tool_calls": [5]})).tool_calls
    assert call.error == 'each tool call needs a "function" object.'


# ---------------------------------------------------------------------------------------------- robustness


_JUNK = [
    "",
    "\x00" * 100,
    bytes(range(256)).decode("utf-8", errors="surrogateescape"),
    (b"\xff\xfe<tool_call>\x00{\x80\x81}</tool_call>\xc3\x28").decode("utf-8", errors="surrogateescape"),
    "<tool_call>" * 1000,
    "</tool_call>" * 1000 + "<answer>",
    '<tool_call>{"name": "\\ud800", "arguments": {"query": "\\udfff"}}</tool_call>',
    "<search>" + "{" * 10_000 + "</search>",
    "{" + '"tool_calls": [' * 10_000,
    "x" * 1_000_000,
]


@pytest.mark.parametrize("format_name", sorted(FORMATS))
@pytest.mark.parametrize("junk", _JUNK, ids=range(len(_JUNK)))
def test_parse_never_raises_on_junk(format_name: str, junk: str) -> None:
    parsed = parse(format_name, junk)
    assert parsed.answer is not None or parsed.tool_calls or parsed.errors


# ---------------------------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("format_name", sorted(FORMATS))
@pytest.mark.parametrize(
    "call",
    [
        ToolCall("search", {"query": "Eiffel Tower"}, "call_0"),
        ToolCall("add", {"a": 2, "b": 40}, "call_0"),
        ToolCall("search", {"query": 'ünïcode 🙂 "quotes"'}, "call_0"),
    ],
)
def test_render_call_round_trips_through_parse(format_name: str, call: ToolCall) -> None:
    fmt = get_format(format_name)
    assert _call_pairs(fmt.parse(fmt.render_call(call), SCHEMAS, MAX_CALLS)) == [(call.name, call.arguments)]


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_render_answer_round_trips_through_parse(format_name: str) -> None:
    fmt = get_format(format_name)
    assert fmt.parse(fmt.render_answer("New York City"), SCHEMAS, MAX_CALLS).answer == "New York City"


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_instructions_mention_every_tool(format_name: str) -> None:
    text = get_format(format_name).instructions(SCHEMAS)
    assert "search" in text and "add" in text


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_stop_strings_end_calls_or_answers(format_name: str) -> None:
    fmt = get_format(format_name)
    assert all(stop.startswith("</") for stop in fmt.stop_strings)


def test_hermes_renders_tool_results_in_tool_response_tags() -> None:
    fmt = get_format("hermes")
    (message,) = fmt.result_messages([ToolCall("search", {"query": "x"}, "call_0")], [search.call({"query": "x"})])
    assert fmt.message_text(message) == "<tool_response>\nx\n</tool_response>"


def test_xml_renders_tool_results_in_information_tags() -> None:
    fmt = get_format("xml")
    (message,) = fmt.result_messages([ToolCall("search", {"query": "x"}, "call_0")], [search.call({"query": "x"})])
    assert fmt.message_text(message) == "<information>x</information>"


def test_openai_results_are_tool_messages_with_call_ids() -> None:
    fmt = get_format("openai")
    (message,) = fmt.result_messages([ToolCall("search", {"query": "x"}, "c7")], [search.call({"query": "x"})])
    assert message == {"role": "tool", "tool_call_id": "c7", "content": "x"}


# ---------------------------------------------------------------------------------------------- through the env


def _lookup_call(arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize(
    ("action", "named_problem"),
    [
        (_lookup_call({}), "Error: invalid arguments for lookup: missing required argument(s): title"),
        (_lookup_call({"title": 5}), "argument 'title' must be of type string, got int"),
        (_lookup_call({"title": "France", "lang": "fr"}), "unknown argument(s): lang"),
        (hermes_call("search", {"query": "France"}), "unknown tool 'search'; available tools: lookup."),
        ("<tool_call>{not json}</tool_call>", "the tool call is not valid JSON"),
        ("I would rather chat.", "no tool call and no final answer found"),
    ],
)
def test_env_observation_says_what_was_wrong(make_fact_env, action: str, named_problem: str) -> None:
    env = make_fact_env()
    env.reset(seed=0)
    observation, *_ = env.step(action)
    assert named_problem in observation


@pytest.mark.parametrize(
    "action",
    [
        _lookup_call({}),
        _lookup_call({"title": 5}),
        hermes_call("search", {"query": "France"}),
        "<tool_call>{not json}</tool_call>",
        "<tool_call>",
        "no call at all",
    ],
)
def test_env_malformed_turn_scores_zero_format(make_fact_env, action: str) -> None:
    env = make_fact_env()
    env.reset(seed=0)
    *_, info = env.step(action)
    assert info["reward_components"]["format"] == 0.0


def test_env_malformed_turn_pays_the_dense_format_penalty(make_fact_env) -> None:
    env = make_fact_env(reward="dense")
    env.reset(seed=0)
    _, reward, *_ = env.step(_lookup_call({}))
    assert reward == pytest.approx(-0.05)


def test_env_call_with_invalid_arguments_does_not_run(make_fact_env) -> None:
    env = make_fact_env()
    env.reset(seed=0)
    env.step(_lookup_call({"title": 5}))
    assert env.tools["lookup"].batches == []


def test_env_refuses_one_megabyte_turn_and_states_the_limit(make_fact_env) -> None:
    env = make_fact_env(max_action_chars=8_192)
    env.reset(seed=0)
    observation, *_ = env.step(_lookup_call({"title": "France"}) + "x" * 1_000_000)
    assert "the limit is 8192" in observation


def test_env_does_not_run_calls_of_an_oversized_turn(make_fact_env) -> None:
    env = make_fact_env(max_action_chars=8_192)
    env.reset(seed=0)
    env.step(_lookup_call({"title": "France"}) + "x" * 1_000_000)
    assert env.tools["lookup"].batches == []


def test_env_records_oversized_turn_clipped_to_the_limit(make_fact_env) -> None:
    env = make_fact_env(max_action_chars=8_192)
    env.reset(seed=0)
    *_, info = env.step("x" * 1_000_000)
    assert len(info["messages"][-2]["content"]) <= 8_192


def test_env_binary_junk_leaves_no_nul_or_lone_surrogate_in_context(make_fact_env) -> None:
    env = make_fact_env()
    env.reset(seed=0)
    junk = (b"\x00\xff\xfe" + bytes(range(256))).decode("utf-8", errors="surrogateescape")
    *_, info = env.step(junk)
    assert all(_is_clean_utf8(str(message["content"])) for message in info["messages"])


def _is_clean_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")  # fails on lone surrogates
    except UnicodeEncodeError:
        return False
    return "\x00" not in text
