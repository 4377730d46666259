"""ModelPolicy: a causal LM driven greedily through the scripted-policy interface of `agent-gym eval`."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import TINY_SYNTHHOP

import agent_gym  # noqa: F401  (registers the env ids)
from agent_gym.agents.model_policy import ModelPolicy, ModelPolicyError
from agent_gym.evaluation import run_episode
from agent_gym.models.chat_template import render_prompt
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig

ENV_ID = "AgentR1-SynthHop-v0"
ENV_KWARGS = TINY_SYNTHHOP


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir_for_synthhop):
    return tiny_model_dir_for_synthhop


@pytest.fixture()
def env():
    environment = gym.make(ENV_ID, **ENV_KWARGS)
    yield environment
    environment.close()


def _started(policy: ModelPolicy, env: gym.Env, task_index: int = 0) -> tuple[str, dict]:
    observation, info = env.reset(seed=0, options={"task_index": task_index})
    policy.begin(env.unwrapped, observation, info)
    return observation, info


def test_prompt_is_the_chat_template_rendering_of_info_messages(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=8)
    _, info = _started(policy, env)
    assert policy.prompt_ids(info) == render_prompt(policy.tokenizer, info["messages"])


def test_prompt_keeps_the_newest_tokens_when_the_context_overflows(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=8, max_context_tokens=40)
    _, info = _started(policy, env)
    full = render_prompt(policy.tokenizer, info["messages"])
    assert policy.prompt_ids(info) == full[-32:]


def test_act_is_greedy_so_repeated_turns_are_identical(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=12)
    observation, info = _started(policy, env)
    assert policy.act(observation, info) == policy.act(observation, info)


def test_first_turn_matches_the_rollout_collectors_greedy_turn(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=12)
    observation, info = _started(policy, env, task_index=3)
    collector = RolloutCollector(
        [gym.make(ENV_ID, **ENV_KWARGS)],
        policy.backend,
        policy.tokenizer,
        RolloutConfig(max_new_tokens=12, max_turns=1, show_progress=False),
    )
    (trajectory,) = collector.collect([{"seed": 0, "options": {"task_index": 3}}], greedy=True)
    collector.envs[0].close()
    sampled = trajectory.response_ids[: trajectory.turn_end_indices[0] + 1]
    assert policy.act(observation, info) == policy.tokenizer.decode(sampled, skip_special_tokens=True)


def test_missing_messages_raise_a_clear_error(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=4)
    observation, _ = _started(policy, env)
    with pytest.raises(ModelPolicyError, match="messages"):
        policy.act(observation, {})


def test_a_turn_budget_that_leaves_no_room_for_the_prompt_is_rejected(model_dir):
    with pytest.raises(ValueError, match="max_context_tokens"):
        ModelPolicy.from_pretrained(model_dir, max_new_tokens=64, max_context_tokens=64)


def test_a_model_plays_whole_episodes_in_the_eval_loop(model_dir, env):
    policy = ModelPolicy.from_pretrained(model_dir, max_new_tokens=8)
    record = run_episode(env, policy, seed=0, options={"task_index": 0}, keep_messages=True)
    observation, info = _started(policy, env)  # the same episode, stepped by hand to its end
    actions, reward, done = [], 0.0, False
    while not done:
        actions.append(policy.act(observation, info))
        observation, step_reward, terminated, truncated, info = env.step(actions[-1])
        reward, done = reward + step_reward, terminated or truncated
    assert [m["content"] for m in record.messages if m["role"] == "assistant"] == actions
    assert (record.turns, record.terminated, record.reward, record.em, record.answer) == (
        len(actions), terminated, reward, info["reward_components"]["em"], info.get("answer"))


def test_a_missing_dot_slash_model_folder_is_refused_at_once_not_sent_to_the_hub(tmp_path, monkeypatch):
    from agent_gym.models.model_init import ModelInitError

    monkeypatch.chdir(tmp_path)  # no models/ here: without its "./" the name would read as a hub id
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: pytest.fail("asked the hub"))
    with pytest.raises(ModelInitError, match=r"'\./models/nonexistent' does not exist"):
        ModelPolicy.from_pretrained("./models/nonexistent")


def test_eval_no_progress_hides_the_weights_bar_too(model_dir, tmp_path, capsys):
    import json

    from transformers.utils import logging as transformers_logging

    from agent_gym.cli import main

    # short turns: the test is about the weights' progress bar, not what the model says
    argv = ["eval", ENV_ID, "--model", str(model_dir), "--episodes", "1", "--out", str(tmp_path / "e.jsonl"),
            "--env-kwargs", json.dumps(ENV_KWARGS), "--max-new-tokens", "8", "--max-turns", "2"]
    assert main([*argv, "--no-progress"]) == 0
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()  # hidden for that load only
    assert main(argv) == 0
    assert "Loading weights" in capsys.readouterr().err
