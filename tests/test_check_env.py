"""Gymnasium's own env checker and agent-gym's contract checker pass, with no warning, on every id agent-gym
registers (new ids included)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from conftest import SMALL_SYNTHHOP
from gymnasium.utils.env_checker import check_env
from support.data import QA_SAMPLES

import agent_gym
from agent_gym.contract import REWARD_COMPONENTS, REWARD_SCORES, REWARD_TERMS, TOOLS, check_tool_env_contract
from agent_gym.envs.datasets.download import DatasetNotAvailable
from agent_gym.formats import ToolCall

#: small settings per id; an id not listed here is checked with its defaults
TEST_KWARGS: dict[str, dict[str, Any]] = {
    "AgentR1-SynthHop-v0": SMALL_SYNTHHOP,
    "AgentR1-Calculator-v0": {"num_questions": 50},
    **{env_id: {"data_path": path, "limit": 20} for env_id, path in QA_SAMPLES.items()},
}

# AgentGym-Remote-v0 needs a server: check_env over the wire is in test_adapter_openenv.py.
ENV_IDS = sorted(set(agent_gym.registered_envs()) - {agent_gym.REMOTE_ENV_ID})


def make_for_test(env_id: str, **overrides: Any) -> gym.Env:
    kwargs = {**TEST_KWARGS.get(env_id, {}), **overrides}
    missing = [str(value) for value in kwargs.values() if isinstance(value, Path) and not value.exists()]
    if missing:
        pytest.skip(f"{env_id} needs the data sample {missing[0]} (see ../shared/data/README.md)")
    try:
        return gym.make(env_id, **kwargs)
    except DatasetNotAvailable as exc:  # an id added without test kwargs whose data is not on this machine
        pytest.skip(f"{env_id} needs data that is absent: {exc}")


def test_every_suite_id_is_registered() -> None:
    assert {"AgentR1-SynthHop-v0", "AgentR1-Calculator-v0"} <= set(ENV_IDS)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env_passes_without_warnings(env_id: str) -> None:
    env = make_for_test(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_the_env_contract_checker_passes(env_id: str) -> None:
    env = make_for_test(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_tool_env_contract(env)
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_made_env_steps_through_the_passive_checker_without_warnings(env_id: str) -> None:
    env = make_for_test(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(seed=0)
        observation, *_ = env.step("not a tool call")
    env.close()
    assert isinstance(observation, str)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_id_has_a_description(env_id: str) -> None:
    assert agent_gym.registered_envs()[env_id].strip()


def test_check_env_passes_with_the_summarize_context_policy() -> None:
    env = gym.make("AgentR1-SynthHop-v0", context="summarize", window_turns=1, max_turns=6, **SMALL_SYNTHHOP)
    search = env.unwrapped.tool_format.render_call(ToolCall("search", {"query": "river"}, "call_0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
        env.reset(seed=0)
        steps = [env.step(search) for _ in range(3)]
    env.close()
    assert [step[4]["context_rewritten"] for step in steps] == [False, True, True]


def test_check_env_prints_the_prompt_once(capsys: pytest.CaptureFixture[str]) -> None:
    env = gym.make("AgentR1-Calculator-v0", num_questions=5)
    check_env(env.unwrapped)
    env.close()
    assert capsys.readouterr().out.count("[user] ") == 1


def test_human_render_prints_each_new_screen_once(capsys: pytest.CaptureFixture[str]) -> None:
    env = gym.make("AgentR1-Calculator-v0", num_questions=5, render_mode="human")
    env.reset(seed=0)
    env.render()
    first = capsys.readouterr().out
    env.step("not a tool call")
    second = capsys.readouterr().out
    env.close()
    assert first.count("[user] ") == 1 and "[assistant] not a tool call" in second


def _arguments(schema: dict[str, Any], question: str) -> dict[str, Any]:
    """Valid arguments for a tool schema: a search for the question, a sum, a one-line program, else a word."""
    examples = {"query": question[:200], "expression": "2 + 3", "code": "print(2 + 3)"}
    properties = schema["parameters"].get("properties", {})
    arguments = {}
    for name in schema["parameters"].get("required", list(properties)):
        kind = properties.get(name, {}).get("type")
        arguments[name] = 1 if kind in ("integer", "number") else examples.get(name, "x")
    return arguments


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_the_paid_reward_terms_sum_to_every_steps_reward(env_id: str) -> None:
    """A scripted episode under the dense spec (a tool call that earns process reward, a malformed turn that pays
    the format penalty, the gold answer that pays the outcome), then one cut by ``truncate()``: each step's
    ``reward_terms`` sum to its reward, and its scores (em, format...) are never among them."""
    small = {"limit": 1} if env_id == "AgentR1-HumanEval-v0" else {}
    tool_env = make_for_test(env_id, reward="dense", **small).unwrapped
    steps = []
    _, info = tool_env.reset(seed=0)
    assert sum(info[REWARD_TERMS].values()) == 0.0
    task, fmt = tool_env.task, tool_env.tool_format
    schema = info[TOOLS][0].get("function", info[TOOLS][0])  # OpenAI-style {"type": "function", "function": ...}
    call = ToolCall(schema["name"], _arguments(schema, task.question), "call_0")
    for action in (fmt.render_call(call), "not a tool call", fmt.render_answer((task.answers or ("x",))[0])):
        steps.append(tool_env.step(action)[1:])
        if steps[-1][1] or steps[-1][2]:
            break
    tool_env.reset(seed=1)
    tool_env.step("not a tool call")
    reward, info = tool_env.truncate()
    steps.append((reward, False, True, info))
    tool_env.close()
    for reward, _, _, info in steps:
        terms, scores = info[REWARD_TERMS], info[REWARD_SCORES]
        assert sum(terms.values()) == pytest.approx(reward, abs=1e-12)
        assert set(terms) == {"format_penalty", "process", "outcome"} and "em" not in terms and "format" not in terms
        assert info[REWARD_COMPONENTS] == {**scores, **terms}  # the deprecated merged dict, for one release
    assert steps[1][3][REWARD_TERMS]["format_penalty"] < 0 and "em" in steps[-1][3][REWARD_SCORES]
