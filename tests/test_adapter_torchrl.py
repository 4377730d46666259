"""TorchRL's GymWrapper resets and steps our envs with strings, keeps info["messages"], and passes its checks."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl not installed: pip install 'agent-gym[torchrl]'")

import gymnasium as gym  # noqa: E402
from torchrl.envs.libs.gym import GymWrapper  # noqa: E402
from torchrl.envs.utils import check_env_specs  # noqa: E402

import agent_gym  # noqa: E402, F401 - registers the ids
from agent_gym.adapters.torchrl import NonTensorInfoReader, make_torchrl_env  # noqa: E402

SMALL = {"hops": 1, "num_pages": 200, "num_questions": 10}
SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "college"}}</tool_call>'


def test_gym_wrapper_on_a_plain_gym_make_resets_and_steps_with_strings():
    env = GymWrapper(gym.make("AgentR1-SynthHop-v0", **SMALL))
    reset = env.reset()
    assert isinstance(reset["observation"], str) and reset["observation"].endswith("?")
    reset["action"] = SEARCH
    step = env.step(reset)
    assert "<tool_response>" in step["next", "observation"] and not step["next", "done"].item()


def test_a_plain_gym_wrapper_keeps_the_messages_with_one_info_reader():
    # TorchRL's GymWrapper reads no info key of any env until a reader is set; ours takes lists of dicts.
    env = GymWrapper(gym.make("AgentR1-SynthHop-v0", **SMALL))
    env.set_info_dict_reader(NonTensorInfoReader(["messages"]))
    reset = env.reset()
    assert [message["role"] for message in reset["messages"]] == ["system", "user"]
    reset["action"] = SEARCH
    assert [message["role"] for message in env.step(reset)["next", "messages"]][-2:] == ["assistant", "tool"]


def test_make_torchrl_env_keeps_the_chat_context_in_every_tensordict():
    env = make_torchrl_env("AgentR1-SynthHop-v0", **SMALL)
    reset = env.reset()
    assert [message["role"] for message in reset["messages"]] == ["system", "user"]
    reset["action"] = SEARCH
    step = env.step(reset)
    assert [message["role"] for message in step["next", "messages"]][-2:] == ["assistant", "tool"]


def test_torchrl_env_checks_pass():
    check_env_specs(make_torchrl_env("AgentR1-SynthHop-v0", **SMALL))


def test_a_torchrl_rollout_ends_when_the_agent_answers():
    env = make_torchrl_env("AgentR1-SynthHop-v0", **SMALL)
    rollout = env.rollout(5, policy=lambda td: td.set("action", "<answer>1999</answer>"))
    assert rollout.batch_size[0] == 1 and rollout["next", "terminated"].all()
