"""register_tool_env makes a user's tool env an ordinary Gymnasium id: make, make_vec, overrides, lazy parts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym
from agent_gym import Task, register_tool_env, tool
from agent_gym.vector import ToolVectorEnv

ADDER_ID = "TestAdder-v0"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return str(a + b)


ADDER_TASKS = [Task("sum-2-3", "What is 2 + 3?", ("5",)), Task("sum-40-2", "What is 40 + 2?", ("42",))]


@pytest.fixture
def adder_id() -> Iterator[str]:
    """A calculator-style custom env, registered in three lines the way the README shows."""
    register_tool_env(ADDER_ID, tools=[add], tasks=ADDER_TASKS, max_turns=4, description="adds two integers")
    yield ADDER_ID
    gym.registry.pop(ADDER_ID, None)


def _add_call(a: int, b: int) -> str:
    return f"<tool_call>{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}</tool_call>"


def test_registered_custom_env_is_made_by_id(adder_id: str) -> None:
    assert isinstance(gym.make(adder_id).unwrapped, agent_gym.ToolEnv)


def test_custom_env_runs_its_tool(adder_id: str) -> None:
    env = gym.make(adder_id)
    env.reset(seed=0, options={"task_id": "sum-2-3"})
    observation, *_ = env.step(_add_call(2, 3))
    assert observation == "<tool_response>\n5\n</tool_response>"


def test_custom_env_pays_a_correct_answer(adder_id: str) -> None:
    env = gym.make(adder_id)
    env.reset(seed=0, options={"task_id": "sum-40-2"})
    _, reward, terminated, *_ = env.step("<answer>42</answer>")
    assert (reward, terminated) == (1.0, True)


def test_spec_holds_only_plain_settings(adder_id: str) -> None:
    assert gym.spec(adder_id).kwargs == {"reward": "paper", "max_turns": 4, "tool_format": "hermes"}


def test_make_overrides_settings(adder_id: str) -> None:
    assert gym.make(adder_id, max_turns=3).unwrapped.max_turns == 3


def test_make_override_changes_the_wire_format(adder_id: str) -> None:
    assert gym.make(adder_id, tool_format="xml").unwrapped.tool_format.name == "xml"


def test_custom_env_is_listed_with_its_description(adder_id: str) -> None:
    assert agent_gym.registered_envs()[adder_id] == "adds two integers"


def test_make_vec_of_custom_env_is_the_native_vector_env(adder_id: str) -> None:
    envs = gym.make_vec(adder_id, num_envs=2)
    assert isinstance(envs, ToolVectorEnv) and envs.num_envs == 2


def test_reregistering_an_id_replaces_it(adder_id: str) -> None:
    register_tool_env(adder_id, tools=[add], tasks=ADDER_TASKS[:1], max_turns=2)
    assert len(gym.make(adder_id).unwrapped.tasks) == 1


def test_factories_are_not_called_until_make() -> None:
    calls: list[str] = []

    def tasks() -> list[Task]:
        calls.append("tasks")
        return ADDER_TASKS

    register_tool_env("TestLazyAdder-v0", tools=[add], tasks=tasks)
    try:
        assert calls == []
    finally:
        gym.registry.pop("TestLazyAdder-v0", None)


def test_factories_build_the_env_on_make() -> None:
    register_tool_env("TestLazyAdder-v0", tools=lambda: [add], tasks=lambda: ADDER_TASKS)
    try:
        assert gym.make("TestLazyAdder-v0").reset(seed=0, options={"task_index": 1})[0] == "What is 40 + 2?"
    finally:
        gym.registry.pop("TestLazyAdder-v0", None)


def test_suite_env_is_made_by_id() -> None:
    env = gym.make("AgentR1-SynthHop-v0", num_pages=2000, num_questions=50)
    assert env.reset(seed=0)[1]["task_id"].startswith("synth-")


def test_suite_env_overrides_reach_the_env() -> None:
    env = gym.make("AgentR1-SynthHop-v0", num_pages=2000, num_questions=50, max_turns=3, reward="dense")
    assert (env.unwrapped.max_turns, env.unwrapped.reward_spec.name) == (3, "dense")


def test_module_prefixed_id_works_in_a_fresh_process_without_import() -> None:
    script = (
        "import sys, gymnasium as gym\n"
        "assert 'agent_gym' not in sys.modules\n"
        "env = gym.make('agent_gym:AgentR1-SynthHop-v0', num_pages=2000, num_questions=50, max_turns=3)\n"
        "observation, info = env.reset(seed=0)\n"
        "print(type(env.unwrapped).__name__, env.unwrapped.max_turns, bool(observation))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                               timeout=120)
    assert completed.stdout.strip() == "ToolEnv 3 True", completed.stderr[-2000:]


def test_a_misspelt_setting_is_refused_at_registration_naming_the_one_meant() -> None:
    with pytest.raises(TypeError, match=r"takes no setting 'max_turn' \(did you mean 'max_turns'\?\)"):
        register_tool_env("TestTypoAdder-v0", tools=[add], tasks=ADDER_TASKS, max_turn=4)
    assert "TestTypoAdder-v0" not in gym.registry


def test_registering_over_a_suite_id_is_refused_unless_overridden() -> None:
    suite_entry = gym.spec("AgentR1-SynthHop-v0").entry_point
    with pytest.raises(ValueError, match="AgentR1-SynthHop-v0 is one of agent-gym's suite envs.*override=True"):
        register_tool_env("AgentR1-SynthHop-v0", tools=[add], tasks=ADDER_TASKS)
    assert gym.spec("AgentR1-SynthHop-v0").entry_point is suite_entry
    try:
        register_tool_env("AgentR1-SynthHop-v0", tools=[add], tasks=ADDER_TASKS, override=True)
        assert gym.make("AgentR1-SynthHop-v0").reset(seed=0, options={"task_index": 0})[0] == "What is 2 + 3?"
    finally:
        agent_gym.envs.register_suite()  # the suite restores its own id
    assert gym.spec("AgentR1-SynthHop-v0").entry_point.entry_point == suite_entry.entry_point


@pytest.mark.parametrize(("parts", "message"), [
    ({"tools": [add, add], "tasks": ADDER_TASKS}, "two tools are named 'add'"),
    ({"tools": [lambda a, b: a + b], "tasks": ADDER_TASKS}, r"tools\[0\] is a function, not a Tool"),
    ({"tools": [add], "tasks": []}, "needs at least one task"),
    ({"tools": [add], "tasks": [{"id": "q"}]}, r"tasks\[0\] is a dict, not a Task"),
    ({"tools": [add], "tasks": ADDER_TASKS * 2}, "two tasks have the id 'sum-2-3'"),
])
def test_bad_tools_or_tasks_are_refused_at_registration(parts: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        register_tool_env("TestBadParts-v0", **parts)
    assert "TestBadParts-v0" not in gym.registry


def test_a_generator_of_tasks_is_read_once_and_kept() -> None:
    register_tool_env("TestGenAdder-v0", tools=[add], tasks=(task for task in ADDER_TASKS))
    try:
        assert len(gym.make("TestGenAdder-v0").unwrapped.tasks) == 2
    finally:
        gym.registry.pop("TestGenAdder-v0", None)
