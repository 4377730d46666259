"""`agent_gym.make_env` reads an env source one way: an id with kwargs, a factory, or an env."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agent_gym.make import make_env


def test_an_id_is_made_with_its_kwargs_and_a_factory_is_called():
    env = make_env("AgentR1-Calculator-v0", {"max_turns": 3})
    assert env.spec.id == "AgentR1-Calculator-v0" and env.spec.kwargs["max_turns"] == 3
    assert make_env(lambda: env) is env


def test_an_env_instance_is_returned_unless_the_adapter_needs_a_fresh_env_per_rollout():
    env = gym.make("AgentR1-Calculator-v0")
    assert make_env(env) is env
    with pytest.raises(TypeError, match="not an env: this adapter makes one env per rollout"):
        make_env(env, instance_ok=False)


def test_kwargs_without_an_id_and_sources_of_other_types_are_refused():
    with pytest.raises(TypeError, match="bind them into the factory"):
        make_env(lambda: gym.make("AgentR1-Calculator-v0"), {"max_turns": 3})
    with pytest.raises(TypeError, match="got int"):
        make_env(3)


def test_an_unknown_id_is_an_agent_gym_error_that_names_the_listing_command():
    from agent_gym.error import AgentGymError

    with pytest.raises(AgentGymError, match="agent-gym envs") as caught:
        make_env("AgentR1-NoSuchEnv-v0")
    assert isinstance(caught.value, gym.error.Error)


def test_make_env_is_public_api():
    import agent_gym

    assert agent_gym.make_env is make_env
