"""The fixed-space adapter lets Stable-Baselines3 (or any Box/Discrete library) drive a text env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.adapters.candidate_actions import CandidateActionWrapper

SMALL = {"hops": 1, "num_pages": 2000, "num_questions": 30}


def _wrapped() -> CandidateActionWrapper:
    return CandidateActionWrapper(gym.make("AgentR1-SynthHop-v0", **SMALL).unwrapped, num_candidates=6)


def test_wrapper_passes_stable_baselines3_env_checker():
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker", reason="stable-baselines3 not installed")
    sb3_checker.check_env(_wrapped())


def test_searching_a_question_entity_then_answering_from_the_result_solves_a_one_hop_question():
    env = _wrapped()
    observation, _ = env.reset(options={"task_index": 0})
    task = env.unwrapped.task
    entity_slot = env._candidates.index(task.decomposition[0].query)
    observation, _, terminated, _, _ = env.step(entity_slot)
    assert not terminated and task.answers[0] in env._candidates
    _, reward, terminated, _, info = env.step(env.num_candidates + env._candidates.index(task.answers[0]))
    assert terminated and info["reward_components"]["em"] == 1.0 and reward == 1.0


def test_choosing_an_empty_slot_is_a_malformed_turn_not_a_crash():
    env = _wrapped()
    env.reset(options={"task_index": 0})
    empty_slot = len(env._candidates)  # the first slot past the filled ones
    observation, _, _, _, info = env.step(empty_slot)
    assert info["reward_components"]["format"] == 0.0 and np.all(observation >= 0) and np.all(observation <= 1)


@pytest.mark.slow
def test_stable_baselines3_ppo_runs_on_the_wrapped_env():
    ppo = pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed").PPO
    model = ppo("MlpPolicy", _wrapped(), n_steps=64, batch_size=32, n_epochs=1, seed=0, verbose=0)
    model.learn(128)
    assert model.num_timesteps >= 128


@pytest.mark.parametrize("action", [-1, 13, 100, np.int64(-2)])
def test_an_action_outside_the_discrete_space_is_refused_with_its_range(action):
    env = _wrapped()
    env.reset(options={"task_index": 0})
    with pytest.raises(ValueError, match=r"action must be an integer in \[0, 12\].*got -?\d+"):
        env.step(action)


@pytest.mark.parametrize("action", ["3", 2.5, 2.0, None, [1]])
def test_an_action_that_is_not_an_integer_is_refused_naming_its_type(action):
    env = _wrapped()
    env.reset(options={"task_index": 0})
    with pytest.raises(TypeError, match=r"action must be an integer in \[0, 12\]"):
        env.step(action)


def test_integer_actions_of_numpy_types_are_accepted():
    env = _wrapped()
    for action in (np.int64(12), np.array(12), np.int32(12)):
        env.reset(options={"task_index": 0})
        _, _, _, _, info = env.step(action)  # 2K = 12: search the question, as the plain int does
        [call] = info["tool_calls"]
        assert (call["name"], call["arguments"], call["ok"]) == ("search", {"query": env.unwrapped.task.question}, True)


def test_a_tool_with_two_string_arguments_is_refused_at_construction():
    from agent_gym import Task, ToolEnv, tool

    @tool
    def convert(value: str, unit: str) -> str:
        """Convert a value to a unit.

        Args:
            value: the value, e.g. "3 km".
            unit: the target unit, e.g. "mile".
        """
        return f"{value} in {unit}"

    env = ToolEnv([Task("t", "How many miles is 3 km?", ("1.86",))], [convert])
    with pytest.raises(ValueError, match="one string argument.*'convert' takes value, unit"):
        CandidateActionWrapper(env)


def test_action_masks_allow_exactly_the_filled_slots_and_the_question_search():
    env = _wrapped()
    env.reset(options={"task_index": 0})
    mask, filled, k = env.action_masks(), len(env._candidates), env.num_candidates
    assert mask.shape == (2 * k + 1,) and mask[2 * k]
    assert mask[:k].tolist() == [slot < filled for slot in range(k)] == mask[k : 2 * k].tolist()


def test_the_turn_feature_follows_info_turn():
    env = _wrapped()
    observation, _ = env.reset(options={"task_index": 0})
    assert observation[-3] == 0.0
    observation, _, _, _, info = env.step(2 * env.num_candidates)  # search the question
    assert info["turn"] == 1 and observation[-3] == pytest.approx(1 / env.unwrapped.max_turns)


@pytest.mark.slow
def test_sb3_contrib_maskable_ppo_trains_and_only_picks_valid_actions():
    maskable = pytest.importorskip("sb3_contrib", reason="sb3-contrib not installed: pip install 'agent-gym[sb3]'")
    from sb3_contrib.common.maskable.utils import get_action_masks

    env = _wrapped()
    model = maskable.MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0, verbose=0)
    model.learn(128)
    observation, _ = env.reset(options={"task_index": 1})
    for _ in range(3):
        action, _ = model.predict(observation, action_masks=get_action_masks(env), deterministic=False)
        assert env.action_masks()[int(action)]
        observation, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            break
    assert model.num_timesteps >= 128


def test_make_takes_an_env_id_with_kwargs_or_a_factory_like_the_other_adapters():
    by_id = CandidateActionWrapper.make("AgentR1-SynthHop-v0", num_candidates=6, **SMALL)
    by_factory = CandidateActionWrapper.make(lambda: gym.make("AgentR1-SynthHop-v0", **SMALL), num_candidates=6)
    first, _ = by_id.reset(options={"task_index": 3})
    second, _ = by_factory.reset(options={"task_index": 3})
    assert by_id.observation_space.contains(first)
    np.testing.assert_array_equal(first, second)
    with pytest.raises(TypeError, match="only with an env id"):
        CandidateActionWrapper.make(lambda: gym.make("AgentR1-SynthHop-v0"), hops=1)


def test_make_refuses_an_env_that_is_not_a_tool_env_underneath():
    with pytest.raises(TypeError, match="wraps a ToolEnv, got CartPoleEnv"):
        CandidateActionWrapper.make("CartPole-v1")
