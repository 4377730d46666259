"""`EpisodeDriver` holds the rules of one token episode (room, cut, pay, truncate) once: the rollout collector and
a plain synchronous loop (`run_episode`, the shape verl's agent loop follows; its own test is in
test_adapter_verl.py) give the same trajectories, and each stop condition ends the episode as documented."""

from __future__ import annotations

import json

import pytest
from conftest import FACT_TASKS, FactLookup
from support.backends import ScriptedBackend

from agent_gym.env import ToolEnv
from agent_gym.models.chat_template import encode_text
from agent_gym.trainers.episode_driver import EpisodeDriver, run_episode
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return tiny_model[1]


def _lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


def _play(tokenizer, env: ToolEnv, turns: list[str], **limits) -> EpisodeDriver:
    """One episode of ``env`` with ``turns`` (the last repeats), through `run_episode`."""
    _, info = env.reset(options={"task_id": "capital-france"})
    driver = EpisodeDriver(tokenizer, info, **limits)
    played = iter(range(10_000))

    def generate(prompt_ids: list[int], room: int | None) -> tuple[list[int], list[float]]:
        ids = encode_text(tokenizer, turns[min(next(played), len(turns) - 1)]) + [tokenizer.eos_token_id]
        return ids, [0.0] * len(ids)

    return run_episode(driver, env, generate)


def _collected(tokenizer, env: ToolEnv, turns: list[str], max_turns: int | None = None, max_context: int = 100_000):
    config = RolloutConfig(max_context_tokens=max_context, max_turns=max_turns, show_progress=False)
    [trajectory] = RolloutCollector([env], ScriptedBackend(tokenizer, turns), tokenizer, config).collect(
        ["capital-france"])
    return trajectory


@pytest.mark.parametrize(("turns", "env_turns", "max_turns", "ended_by"), [
    ([_lookup("France"), "<answer>Paris</answer>"], 8, None, None),  # the agent answers
    ([_lookup("France"), "no call"], 2, None, "env"),  # the env's own turn limit
    ([_lookup("France"), "no call"], 8, 2, "max_turns"),  # the driver's turn cap: the env's truncate() pays
])
def test_the_collector_and_a_plain_loop_play_an_episode_alike(tokenizer, turns, env_turns, max_turns, ended_by):
    alone = _play(tokenizer, ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=env_turns), turns,
                  max_turns=max_turns, max_context_tokens=100_000)
    [mine] = alone.trajectories("0:capital-france")
    theirs = _collected(tokenizer, ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=env_turns), turns, max_turns)
    assert (mine.response_ids, mine.loss_mask, mine.turn_rewards) == (
        theirs.response_ids, theirs.loss_mask, theirs.turn_rewards)
    assert mine.episode == theirs.episode and mine.episode.truncated_by == ended_by
    assert mine.episode.reward == pytest.approx(mine.outcome)


def test_a_cut_pays_the_envs_truncate_on_the_last_turn(tokenizer):
    driver = _play(tokenizer, ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=8), [_lookup("France"), "x"],
                   max_turns=2)
    assert (driver.finished, driver.awaits_truncation, driver.tokens.cut_reason) == (True, False, "max_turns")
    assert driver.tokens.sample.turn_rewards[-1] == pytest.approx(1 / 3 - 1.0)  # Agent-R1 Eq. 6, paid on the cut


def test_a_full_context_cuts_before_a_turn_and_an_env_reply_that_fills_it_cuts_after(tokenizer):
    env = ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=8)
    _, info = env.reset(options={"task_id": "capital-france"})
    prompt = EpisodeDriver(tokenizer, info).tokens.sample.length
    full = EpisodeDriver(tokenizer, info, max_context_tokens=prompt)
    assert full.room_for_turn() == 0 and full.finished and full.summary.truncated_by == "context"
    assert not full.awaits_truncation  # no turn played: nothing to pay
    tight = _play(tokenizer, env, [_lookup("France")], max_context_tokens=prompt + 40)
    assert tight.tokens.turns == 1 and tight.summary.truncated_by == "context" and tight.summary.truncated
