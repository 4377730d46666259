"""Fuzzing: thousands of random and adversarial turns never make an env raise or return a malformed step.

Every step must return ``(str observation within observation_space, finite float reward, bool, bool, dict info
with the contract keys)``. The envs are SynthHop over a small world (a real BM25 index behind the search tool),
one per wire format.
"""

from __future__ import annotations

import functools
import json
import math

import gymnasium as gym
import pytest
from conftest import SMALL_SYNTHHOP
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_gym.env import ToolEnv
from agent_gym.tasks import Task
from agent_gym.tools import tool

FORMATS = ("hermes", "xml", "openai")
STEP_INFO_KEYS = {"messages", "reward_components", "tool_calls", "task_id", "turn"}


@functools.cache
def fuzz_env(tool_format: str) -> ToolEnv:
    """One env per format, reused across examples (reset() starts each example afresh)."""
    return gym.make("AgentR1-SynthHop-v0", tool_format=tool_format, max_turns=4, max_action_chars=4_096,
                    **SMALL_SYNTHHOP).unwrapped


# ---------------------------------------------------------------------------------------------- strategies

_CHARACTERS = st.one_of(
    st.characters(),
    st.characters(categories=["Cs"]),  # lone surrogates, which str allows and UTF-8 does not
    st.sampled_from("<>{}[]\":,/\\\x00\n"),
)
_FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<search>", "</search>", "<information>",
    "<tool_response>", "{", "}", "[", "]", '"name"', '"arguments"', '"parameters"', '"tool_calls"',
    '"function"', '"content"', ":", ",", '"search"', '"query"', '"x"', "null", "true", "-1e999", "\x00",
    "\ud800", "\udfff", '{"name": "search", "arguments": {"query": "', '"}}', "\\u0000", "\\ud800",
    "NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 4_301,
])
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(_CHARACTERS, max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _hermes_call(name: str, arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _openai_message(name: str, arguments: object, content: object) -> str:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return json.dumps({"role": "assistant", "content": content, "tool_calls": [call]})


_NAMES = st.sampled_from(["search", "lookup", "", "SEARCH", "search "])
_ARGUMENTS = st.one_of(_JSON_VALUES, st.fixed_dictionaries({"query": _JSON_VALUES}),
                       st.fixed_dictionaries({"query": st.text(_CHARACTERS, max_size=40)}))

# JSON nested past Python's recursion limit, inside each format's call syntax
_DEEP_NESTING = st.builds(
    lambda template, depth: template.format("[" * depth),
    st.sampled_from(["<tool_call>{}</tool_call>", '{{"content": {}}}', "<search>{{\"q\": {}}}</search>",
                     '<tool_call>{{"name": "search", "arguments": "{}"}}</tool_call>']),
    st.integers(900, 3_000),
)

# numbers Python's json reads as inf/nan, or refuses with a bare ValueError (more than 4,300 digits)
HUGE_NUMBERS = ["1" + "0" * 5_000, "-" + "9" * 4_301, "1e400", "-1e400", "NaN", "Infinity", "-Infinity"]
NUMBER_TEMPLATES = {
    "hermes": ['<tool_call>{{"name": "search", "arguments": {{"query": {}}}}}</tool_call>',
               "<tool_call>[{}]</tool_call>",
               '<tool_call>{{"name": "search", "arguments": "{{\\"query\\": {}}}"}}</tool_call>'],
    "xml": ['<search>{{"query": {}}}</search>'],
    "openai": ['{{"content": {}}}',
               '{{"tool_calls": [{{"function": {{"name": "search", "arguments": {{"query": {}}}}}}}]}}',
               '{{"tool_calls": [{{"function": {{"name": "search", "arguments": "{{\\"query\\": {}}}"}}}}]}}'],
}
_HUGE_NUMBER_ACTIONS = st.builds(
    lambda template, number: template.format(number),
    st.sampled_from([template for templates in NUMBER_TEMPLATES.values() for template in templates]
                    + ["<search>{}</search>", "[{}]"]),
    st.sampled_from(HUGE_NUMBERS),
)

ACTIONS = st.one_of(
    _DEEP_NESTING,
    _HUGE_NUMBER_ACTIONS,
    st.text(),
    st.text(_CHARACTERS, max_size=200),
    st.lists(st.one_of(_FRAGMENTS, st.text(_CHARACTERS, max_size=6)), max_size=40).map("".join),
    st.builds(_hermes_call, _NAMES, _ARGUMENTS),
    st.builds(_openai_message, _NAMES, _ARGUMENTS, _JSON_VALUES),
    st.builds(lambda value: json.dumps(value), _JSON_VALUES),
    st.builds(lambda query: f"<search>{query}</search>", st.text(_CHARACTERS, max_size=60)),
    st.builds(lambda answer: f"<answer>{answer}</answer>", st.text(_CHARACTERS, max_size=30)),
    st.binary(max_size=200).map(lambda data: data.decode("utf-8", errors="surrogateescape")),
    st.sampled_from([4_097, 65_536, 1_048_576]).flatmap(
        lambda size: st.sampled_from(["{", "[", "<tool_call>", "\x00", "a"]).map(lambda unit: unit * size)),
)


# ---------------------------------------------------------------------------------------------- checks


def assert_well_formed_step(env: ToolEnv, step: tuple) -> None:
    assert isinstance(step, tuple) and len(step) == 5
    observation, reward, terminated, truncated, info = step
    assert isinstance(observation, str) and env.observation_space.contains(observation)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert isinstance(info, dict) and STEP_INFO_KEYS <= set(info)
    assert all(math.isfinite(value) for value in info["reward_components"].values())


def play(env: ToolEnv, seed: int, actions: list[str]) -> int:
    """Step through ``actions`` (until the episode ends), checking every step; returns the steps taken."""
    env.reset(seed=seed)
    for taken, action in enumerate(actions, start=1):
        step = env.step(action)
        assert_well_formed_step(env, step)
        if step[2] or step[3]:
            return taken
    return len(actions)


@pytest.mark.parametrize("tool_format", FORMATS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**16), actions=st.lists(ACTIONS, min_size=1, max_size=4))
def test_random_turns_always_give_well_formed_steps(tool_format: str, seed: int, actions: list[str]) -> None:
    assert play(fuzz_env(tool_format), seed, actions) >= 1


@pytest.mark.parametrize("tool_format", FORMATS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=ACTIONS)
def test_a_random_turn_then_an_answer_ends_the_episode(tool_format: str, action: str) -> None:
    env = fuzz_env(tool_format)
    env.reset(seed=0)
    first = env.step(action)
    if not (first[2] or first[3]):
        answer = env.tool_format.render_answer("x")
        assert env.step(answer)[2]


@pytest.mark.parametrize("number", HUGE_NUMBERS)
@pytest.mark.parametrize(("tool_format", "template"),
                         [(name, template) for name, templates in NUMBER_TEMPLATES.items() for template in templates])
def test_a_number_python_cannot_hold_is_an_observation(tool_format: str, template: str, number: str) -> None:
    env = fuzz_env(tool_format)
    env.reset(seed=0)
    step = env.step(template.format(number))
    assert_well_formed_step(env, step)
    assert not step[2] and step[4]["reward_components"]["format"] == 0.0


@tool
def scale(x: float) -> str:
    """Multiply a number by two.

    Args:
        x: the number.
    """
    scale.calls.append(x)
    return str(2 * x)


scale.calls = []
_NUMBER_ARGUMENTS = {
    "hermes": '<tool_call>{{"name": "scale", "arguments": {{"x": {}}}}}</tool_call>',
    "xml": '<scale>{{"x": {}}}</scale>',
    "openai": '{{"tool_calls": [{{"function": {{"name": "scale", "arguments": "{{\\"x\\": {}}}"}}}}]}}',
}


@pytest.mark.parametrize("number", [*HUGE_NUMBERS, "1" + "0" * 400])
@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_number_argument_out_of_range_never_reaches_the_tool(tool_format: str, number: str) -> None:
    env = ToolEnv([Task("t", "Double it.", ("2",))], [scale], tool_format=tool_format)
    env.reset(seed=0)
    scale.calls.clear()
    step = env.step(_NUMBER_ARGUMENTS[tool_format].format(number))
    assert_well_formed_step(env, step)
    assert scale.calls == [] and step[4]["reward_components"]["format"] == 0.0


@pytest.mark.parametrize("tool_format", FORMATS)
def test_space_samples_are_valid_actions(tool_format: str) -> None:
    env = fuzz_env(tool_format)
    env.action_space.seed(0)
    assert play(env, 0, [env.action_space.sample() for _ in range(4)]) >= 1
