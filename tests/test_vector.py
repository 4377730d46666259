"""Vector envs: the native ToolVectorEnv batches tool calls across envs; Gymnasium's own vector envs also run."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import pytest
from conftest import FACT_TASKS, SMALL_SYNTHHOP, FactLookup
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agent_gym import register_tool_env
from agent_gym.vector import ToolVectorEnv

FACTS_ID = "TestFacts-v0"


@pytest.fixture
def shared_lookup() -> Iterator[FactLookup]:
    """One FactLookup instance, registered as the tool of every env of ``FACTS_ID``."""
    lookup = FactLookup()
    register_tool_env(FACTS_ID, tools=[lookup], tasks=list(FACT_TASKS), max_turns=3)
    yield lookup
    gym.registry.pop(FACTS_ID, None)


def lookup_call(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


# ---------------------------------------------------------------------------------------------- native


def test_make_vec_returns_the_native_vector_env(shared_lookup: FactLookup) -> None:
    assert isinstance(gym.make_vec(FACTS_ID, num_envs=4), ToolVectorEnv)


def test_make_vec_of_suite_id_returns_the_native_vector_env() -> None:
    assert isinstance(gym.make_vec("AgentR1-SynthHop-v0", num_envs=4, **SMALL_SYNTHHOP), ToolVectorEnv)


def test_native_vector_env_declares_next_step_autoreset() -> None:
    assert ToolVectorEnv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP


def test_native_vector_env_has_batched_text_spaces(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=4)
    assert envs.observation_space.contains(envs.reset(seed=0)[0])


def test_native_vector_env_shares_one_tool_object(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=4)
    assert all(env.tools["lookup"] is shared_lookup for env in envs.envs)


def test_tool_calls_of_all_envs_run_as_one_batch(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=4)
    envs.reset(seed=0)
    envs.step([lookup_call(title) for title in ("France", "Japan", "Moby Dick", "Herman Melville")])
    assert shared_lookup.batches == [4]


def test_each_env_gets_its_own_tool_result(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    envs.reset(seed=0)
    observations, *_ = envs.step([lookup_call("Japan"), lookup_call("France")])
    assert [observation.split("\n")[1] for observation in observations] == [
        "Japan is a country whose capital is Tokyo.", "France is a country whose capital is Paris."]


def test_per_env_task_ids_in_reset_options(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=3)
    task_ids = ["melville-birthplace", "capital-france", "capital-japan"]
    _, infos = envs.reset(options={"task_id": task_ids})
    assert list(infos["task_id"]) == task_ids


def test_scalar_task_id_option_applies_to_every_env(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=3)
    _, infos = envs.reset(options={"task_id": "capital-japan"})
    assert list(infos["task_id"]) == ["capital-japan"] * 3


def test_vector_seed_matches_single_env_seed_plus_index(shared_lookup: FactLookup) -> None:
    observations, _ = gym.make_vec(FACTS_ID, num_envs=3).reset(seed=10)
    singles = tuple(gym.make(FACTS_ID).reset(seed=10 + index)[0] for index in range(3))
    assert observations == singles


def _finish_env_zero(envs: ToolVectorEnv) -> None:
    envs.reset(options={"task_id": ["capital-france", "capital-japan"]})
    envs.step(["<answer>Paris</answer>", lookup_call("Japan")])


def test_finished_env_reports_done_and_its_reward(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    envs.reset(options={"task_id": ["capital-france", "capital-japan"]})
    _, rewards, terminations, truncations, _ = envs.step(["<answer>Paris</answer>", lookup_call("Japan")])
    assert (rewards.tolist(), terminations.tolist(), truncations.tolist()) == ([1.0, 0.0], [True, False],
                                                                               [False, False])


def test_autoreset_happens_on_the_step_after_done(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    _finish_env_zero(envs)
    observations, rewards, terminations, _, infos = envs.step([lookup_call("France"), "<answer>Tokyo</answer>"])
    assert (infos["turn"][0], rewards[0], terminations[0], observations[0] in {t.question for t in FACT_TASKS}) == (
        0, 0.0, False, True)


def test_autoreset_step_ignores_the_reset_envs_action(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    _finish_env_zero(envs)
    shared_lookup.batches.clear()
    envs.step([lookup_call("France"), lookup_call("Japan")])
    assert shared_lookup.batches == [1]


def test_envs_that_keep_going_are_not_reset(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    _finish_env_zero(envs)
    *_, infos = envs.step([lookup_call("France"), lookup_call("Japan")])
    assert (infos["task_id"][1], infos["turn"][1]) == ("capital-japan", 2)


def test_wrong_number_of_actions_raises_value_error(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="expected 2 actions, got 1"):
        envs.step(["<answer>x</answer>"])


def test_close_is_idempotent(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    envs.close()
    envs.close()
    assert envs.closed


# ---------------------------------------------------------------------------------------------- gymnasium's


def _synthhop() -> gym.Env:
    return gym.make("AgentR1-SynthHop-v0", **SMALL_SYNTHHOP)


def _calculator() -> gym.Env:
    return gym.make("AgentR1-Calculator-v0", num_questions=50)


SEARCH_THEN_ANSWER = [json.dumps({"name": "search", "arguments": {"query": "founded"}}), "x"]
CALCULATE_THEN_ANSWER = [json.dumps({"name": "calculate", "arguments": {"expression": "6 * 7"}}), "42"]
VECTOR_CLASSES: dict[str, Callable[[list[Callable[[], gym.Env]]], gym.vector.VectorEnv]] = {
    "sync": SyncVectorEnv,
    "async": lambda fns: AsyncVectorEnv(fns, shared_memory=False),
}


def _play_one_episode_each(envs: gym.vector.VectorEnv, script: list[str]) -> list[float]:
    """Two scripted turns (a call, then an answer) in every env; returns the answer step's rewards."""
    observations, _ = envs.reset(seed=0)
    assert all(isinstance(observation, str) and observation for observation in observations)
    call, answer = script
    envs.step([f"<tool_call>{call}</tool_call>"] * envs.num_envs)
    _, rewards, terminations, truncations, _ = envs.step([f"<answer>{answer}</answer>"] * envs.num_envs)
    assert terminations.all() and not truncations.any()
    return rewards.tolist()


@pytest.mark.parametrize("kind", sorted(VECTOR_CLASSES))
def test_gymnasium_vector_env_runs_synthhop_episodes(kind: str) -> None:
    envs = VECTOR_CLASSES[kind]([_synthhop, _synthhop])
    try:
        rewards = _play_one_episode_each(envs, SEARCH_THEN_ANSWER)
    finally:
        envs.close()
    assert rewards == [0.0, 0.0]  # "x" is nobody's answer, in the right format


@pytest.mark.parametrize("kind", sorted(VECTOR_CLASSES))
def test_gymnasium_vector_env_runs_calculator_episodes(kind: str) -> None:
    envs = VECTOR_CLASSES[kind]([_calculator, _calculator])
    try:
        rewards = _play_one_episode_each(envs, CALCULATE_THEN_ANSWER)
    finally:
        envs.close()
    assert all(np.isfinite(rewards)) and set(rewards) <= {0.0, 1.0}


@pytest.mark.parametrize("kind", sorted(VECTOR_CLASSES))
def test_gymnasium_vector_env_autoresets_after_an_episode(kind: str) -> None:
    envs = VECTOR_CLASSES[kind]([_synthhop, _synthhop])
    try:
        _play_one_episode_each(envs, SEARCH_THEN_ANSWER)
        observations, rewards, *_ = envs.step(["ignored"] * 2)
    finally:
        envs.close()
    assert all(observation.endswith("?") for observation in observations) and rewards.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("mode", "vector_kwargs"), [("sync", {}), ("async", {"shared_memory": False})])
def test_make_vec_with_gymnasium_vectorization_modes(mode: str, vector_kwargs: dict) -> None:
    envs = gym.make_vec("AgentR1-SynthHop-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                        **SMALL_SYNTHHOP)
    try:
        observations, _ = envs.reset(seed=0)
    finally:
        envs.close()
    assert observations == gym.make_vec("AgentR1-SynthHop-v0", num_envs=2, **SMALL_SYNTHHOP).reset(seed=0)[0]


# ---------------------------------------------------------------------------------------------- as an EnvBatch


def test_the_native_vector_env_is_an_env_batch_that_addresses_envs_by_index(shared_lookup: FactLookup) -> None:
    from agent_gym.env_batch import EnvBatch, as_env_batch

    envs = gym.make_vec(FACTS_ID, num_envs=3)
    [(_, info)] = envs.reset_batch([2], [{"seed": 0, "options": {"task_id": "capital-japan"}}])
    [(_, _, terminated, _, step_info)] = envs.step_batch([2], [lookup_call("Japan")])
    assert isinstance(envs, EnvBatch) and as_env_batch(envs) is envs
    assert info["task_id"] == "capital-japan" and not terminated and "Tokyo" in str(step_info["new_messages"])
    assert shared_lookup.batches == [1]


def test_an_env_the_batch_ended_is_reset_by_the_next_vector_step(shared_lookup: FactLookup) -> None:
    envs = gym.make_vec(FACTS_ID, num_envs=2)
    envs.reset(seed=0)
    [(_, _, terminated, _, _)] = envs.step_batch([0], ["<answer>Paris</answer>"])
    _, _, _, _, infos = envs.step(["ignored", lookup_call("France")])
    assert terminated and infos["turn"][0] == 0  # NEXT_STEP autoreset: env 0 starts its next episode


def test_async_make_vec_with_shared_memory_says_why_it_fails_and_what_works() -> None:
    with pytest.raises(ValueError, match=r"observations are text.*shared_memory': False"):
        gym.make_vec("AgentR1-SynthHop-v0", num_envs=2, vectorization_mode="async", **SMALL_SYNTHHOP)
