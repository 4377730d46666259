"""SkyRL-Gym's own make/init/step protocol drives any agent-gym env through AgentGymTextEnv."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym not installed: pip install 'agent-gym[skyrl]'")

import gymnasium as gym  # noqa: E402

from agent_gym.adapters.skyrl import AgentGymTextEnv, register_skyrl_env  # noqa: E402

CONFIG = {"env_id": "AgentR1-SynthHop-v0", "env_kwargs": {"hops": 1, "num_pages": 200, "num_questions": 10}}


def _make(extras: dict) -> AgentGymTextEnv:
    return skyrl_gym.make(register_skyrl_env(), env_config=CONFIG, extras=extras)


def _call(query: str) -> str:
    return f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'


def test_skyrl_make_builds_the_env_and_init_returns_the_envs_own_prompt():
    env = _make({"extra_info": {"task_index": 3}, "reward_spec": {"ground_truth": "ignored"}})
    messages, metadata = env.init([{"role": "user", "content": "a dataset prompt the env replaces"}])
    task = gym.make("AgentR1-SynthHop-v0", **CONFIG["env_kwargs"]).unwrapped.tasks[3]
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == task.question
    assert metadata["task_id"] == task.id and metadata["tools"][0]["function"]["name"] == "search"


def test_a_solved_episode_steps_to_done_with_the_envs_reward_and_chat_history():
    env = _make({"extra_info": {"task_index": 0}})
    messages, _ = env.init(None)
    task = env.env.unwrapped.task
    first = env.step(_call(task.decomposition[0].query))
    assert not first["done"] and [m["role"] for m in first["observations"]] == ["tool"]
    assert task.answers[0] in first["observations"][0]["content"]
    last = env.step(f"<answer>{task.answers[0]}</answer>")
    assert last["done"] and last["reward"] == 1.0 and last["observations"] == []
    assert [m["role"] for m in env.chat_history] == ["system", "user", "assistant", "tool", "assistant"]
    assert env.get_metrics()["em"] == 1.0


def test_a_malformed_turn_comes_back_as_an_observation_not_an_exception():
    env = _make({"extra_info": {"task_index": 0}})
    env.init(None)
    output = env.step("no call and no answer")
    assert not output["done"] and "could not be used" in output["observations"][-1]["content"]
    assert output["metadata"]["reward_components"]["format"] == 0.0


def test_an_env_config_without_an_env_id_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="env_id"):
        AgentGymTextEnv({}, {})


def test_a_users_env_is_held_to_the_env_contract_before_skyrl_steps_it():
    from agent_gym.contract import ContractError

    class Silent(gym.Wrapper):
        """Hands the agent no context: its reset info lacks 'messages'."""

        def reset(self, **kwargs):
            observation, _ = self.env.reset(**kwargs)
            return observation, {}

    user_env = gym.make("AgentR1-SynthHop-v0", **CONFIG["env_kwargs"])
    AgentGymTextEnv(None, {}, env=user_env)  # a conforming env is taken
    with pytest.raises(ContractError, match="no 'messages'"):
        AgentGymTextEnv(None, {}, env=Silent(user_env))
