"""verifiers 0.4.0 (verifiers.v1) runs episodes of our envs with its own rollout code, against our model behind a
local OpenAI-compatible server (runs in the peer venv: scripts/make_peer_venv.sh)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers not installed (peer venv: bash scripts/make_peer_venv.sh)")

import gymnasium as gym  # noqa: E402
from test_search_server import thread_server  # noqa: E402
from verifiers.v1.clients import ModelContext  # noqa: E402
from verifiers.v1.utils.loaders import load_environment  # noqa: E402

import agent_gym  # noqa: E402, F401 - registers the ids
from agent_gym.adapters.openai_server import create_chat_app  # noqa: E402
from agent_gym.adapters.verifiers import AgentGymEnv, AgentGymTaskset, make_env_config  # noqa: E402

ENV = "AgentR1-SynthHop-v0"
SMALL = {"hops": 1, "num_pages": 200, "num_questions": 10}


def _episode(url: str, task_index: int = 0):
    config = make_env_config(ENV, base_url=url, model="agent-gym", num_tasks=2, max_turns=3, **SMALL)
    env = load_environment(config)
    task = list(env.taskset)[task_index]

    async def play():
        async with env.serving():
            return await env.run_episode(task, ModelContext(model=config.agent.model, client=config.agent.client))

    return env, asyncio.run(play())


def test_the_taskset_yields_the_envs_tasks_with_its_prompts():
    config = make_env_config(ENV, base_url="http://127.0.0.1:1/v1", model="m", num_tasks=3, **SMALL)
    env = load_environment(config)
    local = gym.make(ENV, **SMALL)
    assert isinstance(env, AgentGymEnv) and isinstance(env.taskset, AgentGymTaskset)
    tasks = list(env.taskset)
    assert [t.data.prompt for t in tasks] == [local.reset(options={"task_index": i})[0] for i in range(3)]
    assert tasks[0].data.system_prompt == local.reset(options={"task_index": 0})[1]["messages"][0]["content"]


@pytest.mark.slow
def test_verifiers_rollout_records_the_return_our_env_pays_for_the_models_replies(tiny_model):
    model, tokenizer = tiny_model  # the suite's tiny random model, behind our OpenAI-compatible server
    with thread_server(None, app=create_chat_app(model, tokenizer, max_tokens=24)) as base:
        _, episode = _episode(f"{base}/v1")
    assert episode.ok and not episode.errors
    (trace,) = episode.traces
    replies = [m.content for m in trace.branches[-1].messages if m.role == "assistant"]
    assert 1 <= len(replies) <= 3
    env = gym.make(ENV, **SMALL)  # replay the model's replies in our env: the same return
    env.reset(seed=0, options={"task_index": 0})
    total, done = 0.0, False
    for reply in replies:
        _, reward, terminated, truncated, _ = env.step(reply)
        total += reward
        done = terminated or truncated
    if not done:
        total += env.unwrapped.truncate()[0]
    assert trace.rewards["env_return"].score == pytest.approx(total)
    assert set(trace.metrics) >= {"em", "f1"}
