"""The trainer's records: `collate` builds a `TokenBatch` once; `rows` and `narrowed` cut every tensor alike;
the estimator table maps each algo name to its estimator."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agent_gym.trainers.algorithms import ESTIMATORS, EstimatorInputs, gae_advantages, grpo_advantages
from agent_gym.trainers.batch import Advantages, ScoredBatch, UpdateBatch
from agent_gym.trainers.trajectory import Trajectory, collate


def _trajectory(prompt: int, response: int, outcome: float, group_id: str) -> Trajectory:
    return Trajectory(
        prompt_ids=[1] * prompt,
        response_ids=[5] * response,
        loss_mask=[1] * response,
        sampling_logprobs=[-0.5] * response,
        turn_end_indices=[response - 1],
        turn_rewards=[outcome],
        outcome=outcome,
        group_id=group_id,
    )


def test_collate_numbers_groups_and_keeps_each_rows_episode_return():
    batch = collate([_trajectory(2, 3, 1.0, "b"), _trajectory(1, 2, 0.0, "a"), _trajectory(2, 1, 0.5, "b")], 0)
    assert batch.group_index.tolist() == [0, 1, 0]
    assert batch.episode_returns.tolist() == [1.0, 0.0, 0.5]


def test_token_batch_is_frozen():
    batch = collate([_trajectory(2, 3, 1.0, "g")], 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.model_token_mask = batch.response_mask  # type: ignore[misc]


def test_rows_and_trimmed_cut_every_record_of_an_update_batch_alike():
    tokens = collate([_trajectory(2, 6, 1.0, "g"), _trajectory(1, 2, 0.0, "g"), _trajectory(1, 3, 0.0, "g")], 0)
    targets = Advantages(tokens.token_rewards * 2, tokens.model_token_mask.float())
    batch = UpdateBatch(tokens, ScoredBatch(values=tokens.sampling_logprobs), targets)
    short = batch.rows(torch.tensor([2, 1])).trimmed()
    assert short.tokens.input_ids.shape == short.scored.values.shape == short.targets.advantages.shape == (2, 4)
    assert short.tokens.prompt_lengths.tolist() == [1, 1] and short.scored.old_logprobs is None
    assert torch.equal(short.targets.advantages, tokens.token_rewards[[2, 1], :4] * 2)


def _inputs(**overrides) -> EstimatorInputs:
    action_mask = torch.tensor([[0.0, 1.0, 1.0]] * 4)
    values = {
        "token_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]),
        "episode_returns": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "group_index": torch.tensor([0, 0, 1, 1]),
        "action_mask": action_mask,
        "values": torch.full((4, 3), 0.25),
    }
    return EstimatorInputs(**{**values, **overrides})


def test_estimator_table_runs_the_estimator_its_algo_names():
    inputs = _inputs()
    grpo = ESTIMATORS["grpo"](inputs)
    expected = grpo_advantages(inputs.episode_returns, inputs.group_index, inputs.action_mask)
    assert torch.equal(grpo.advantages, expected) and grpo.returns is None
    ppo = ESTIMATORS["ppo"](inputs)
    advantages, returns = gae_advantages(inputs.token_rewards, inputs.values, inputs.action_mask, 1.0, 1.0)
    assert torch.equal(ppo.advantages, advantages) and torch.equal(ppo.returns, returns)


@pytest.mark.parametrize("algo", sorted(ESTIMATORS))
def test_every_estimator_gives_no_advantage_outside_the_action_mask(algo):
    result = ESTIMATORS[algo](_inputs())
    assert result.advantages[:, 0].abs().sum() == 0 and torch.equal(result.action_mask, _inputs().action_mask)


def test_ppo_without_critic_values_is_a_clear_error():
    with pytest.raises(ValueError, match="critic"):
        ESTIMATORS["ppo"](_inputs(values=None))
