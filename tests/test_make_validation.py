"""Bad settings are refused when an env is made (or registered), with a message that names the valid range."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import FACT_TASKS, SMALL_SYNTHHOP, FactLookup
from support.data import HOTPOT_SAMPLE

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym import register_tool_env
from agent_gym.env import ToolEnv


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hops": 2.5}, "hops must be an int from 1 to 4 or a list of them, got 2.5"),
        ({"hops": [1, 2.5]}, r"hops must be an int from 1 to 4 or a list of them, got \[1, 2.5\]"),
        ({"hops": 0}, "hops must be an int from 1 to 4 or a list of them, got 0"),
        ({"hops": []}, r"hops must be an int from 1 to 4 or a list of them, got \[\]"),
        ({"top_k": 0}, "top_k must be at least 1 \\(an integer\\), got 0"),
        ({"top_k": -1}, "top_k must be at least 1 \\(an integer\\), got -1"),
        ({"top_k": 2.5}, "top_k must be at least 1 \\(an integer\\), got 2.5"),
        ({"num_questions": 0}, "num_questions must be at least 1 \\(an integer\\), got 0"),
        ({"max_context_chars": 0}, "max_context_chars must be at least 1 \\(an integer\\), got 0"),
    ],
)
def test_synthhop_refuses_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make("AgentR1-SynthHop-v0", **SMALL_SYNTHHOP | kwargs)


def test_synthhop_reads_a_str_kinds_as_one_kind() -> None:
    env = gym.make("AgentR1-SynthHop-v0", kinds="comparison", **SMALL_SYNTHHOP)
    assert {task.kind for task in env.unwrapped.tasks} == {"comparison"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_questions": 0}, "num_questions must be at least 1 \\(an integer\\), got 0"),
        ({"num_questions": 2.5}, "num_questions must be at least 1 \\(an integer\\), got 2.5"),
    ],
)
def test_calculator_refuses_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make("AgentR1-Calculator-v0", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be at least 1 \\(an integer\\), got 0"),
        ({"limit": 0}, "limit must be at least 1 \\(an integer\\) or None, got 0"),
    ],
)
def test_qa_env_refuses_bad_settings(kwargs: dict, message: str) -> None:
    if not HOTPOT_SAMPLE.exists():
        pytest.skip(f"needs the data sample {HOTPOT_SAMPLE}")
    with pytest.raises(ValueError, match=message):
        gym.make("AgentR1-HotpotQA-v0", data_path=HOTPOT_SAMPLE, **kwargs)


def test_tool_env_refuses_a_function_that_is_not_a_tool() -> None:
    def lookup(title: str) -> str:
        return title

    with pytest.raises(TypeError, match=r"tools\[0\] is a function, not a Tool; decorate it with @agent_gym.tool"):
        ToolEnv(list(FACT_TASKS), [lookup])


def test_tool_env_refuses_a_task_that_is_not_a_task() -> None:
    with pytest.raises(TypeError, match=r"tasks\[0\] is a dict, not a Task"):
        ToolEnv([{"id": "q", "question": "?", "answers": ("x",)}], [FactLookup()])


def test_register_tool_env_refuses_an_unknown_setting_naming_the_one_meant() -> None:
    with pytest.raises(TypeError, match=r"TestTypo-v0 takes no setting 'max_turn' \(did you mean 'max_turns'\?\)"):
        register_tool_env("TestTypo-v0", tools=[FactLookup()], tasks=list(FACT_TASKS), max_turn=4)
    assert "TestTypo-v0" not in gym.registry



@pytest.mark.parametrize(
    ("env_id", "kwargs", "meant"),
    [
        ("AgentR1-SynthHop-v0", {"hop": 2}, "hops"),
        ("AgentR1-Calculator-v0", {"num_question": 3}, "num_questions"),
        ("AgentR1-HotpotQA-v0", {"datapath": "x.json"}, "data_path"),
    ],
)
def test_a_misspelt_setting_is_named_with_the_one_meant_and_the_valid_ones(env_id: str, kwargs: dict,
                                                                            meant: str) -> None:
    from agent_gym.error import AgentGymError

    with pytest.raises(TypeError) as caught:
        gym.make(env_id, **kwargs)
    message = str(caught.value)
    assert isinstance(caught.value, AgentGymError)
    assert f"(did you mean {meant!r}?)" in message
    assert "its settings:" in message and "max_turns" in message and meant in message.split("its settings:")[1]


def test_the_vector_entry_point_checks_settings_too() -> None:
    with pytest.raises(TypeError, match="did you mean 'hops'"):
        gym.make_vec("AgentR1-SynthHop-v0", num_envs=2, hop=1, **SMALL_SYNTHHOP)
