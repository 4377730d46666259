"""openenv-core's own client plays episodes on our OpenEnv server (runs in the peer venv: scripts/make_peer_venv.sh)."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv", reason="openenv-core not installed (peer venv: bash scripts/make_peer_venv.sh)")

import gymnasium as gym  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from test_adapter_openenv import SMALL, served  # noqa: E402

import agent_gym  # noqa: E402, F401 - registers the ids


def test_openenv_cores_generic_client_resets_and_steps_a_served_env():
    task = gym.make("AgentR1-SynthHop-v0", **SMALL).unwrapped.tasks[0]
    with served() as url, GenericEnvClient(base_url=url).sync() as client:
        first = client.reset(seed=0, options={"task_index": 0})
        assert first.done is False and first.observation["text"] == task.question
        call = f'<tool_call>{{"name": "search", "arguments": {{"query": "{task.decomposition[0].query}"}}}}</tool_call>'
        searched = client.step({"text": call})
        assert task.answers[0] in searched.observation["text"] and not searched.done
        answered = client.step({"text": f"<answer>{task.answers[0]}</answer>"})
        assert answered.done and answered.reward == 1.0
        assert answered.observation["info"]["reward_components"]["em"] == 1.0


def test_openenv_cores_client_sees_our_error_messages():
    with served() as url, GenericEnvClient(base_url=url).sync() as client:
        with pytest.raises(RuntimeError, match="step before reset"):
            client.step({"text": "<answer>x</answer>"})
