"""Advantage estimators against hand-computed numbers.

The batch is a two-turn episode: prompt (2 tokens), model turn 1 (2 tokens), env observation (2 tokens), model
turn 2 (2 tokens). The env segment in the middle is what the estimators must skip.
"""

import math

import pytest
import torch

from agent_gym.trainers.algorithms import (
    advantage_token_mask,
    discounted_returns,
    gae_advantages,
    group_index,
    grpo_advantages,
    kl_penalized_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)

ACTION = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1]], dtype=torch.float32)
RESPONSE = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.float32)
ENV_POSITIONS = [4, 5]


def two_turn_rewards() -> torch.Tensor:
    """Turn 1 pays 0.5 on its last model token (index 3), turn 2 pays 1.0 on index 7."""
    rewards = torch.zeros(1, 8)
    rewards[0, 3] = 0.5
    rewards[0, 7] = 1.0
    return rewards


def test_group_index_numbers_groups_in_order_of_first_appearance():
    assert group_index(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]


def test_grpo_normalises_by_group_mean_and_unbiased_std():
    outcomes = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    advantages = grpo_advantages(outcomes, groups, ACTION.expand(4, -1))
    # group 0: mean 0.5, unbiased std sqrt(0.5); group 1: std 0 -> advantage 0
    expected = torch.tensor([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0])
    assert torch.allclose(advantages[:, 2], expected, atol=1e-5)
    assert torch.allclose(advantages[:, 7], expected, atol=1e-5)


def test_grpo_gives_env_and_prompt_tokens_zero_advantage():
    advantages = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), ACTION.expand(2, -1))
    assert advantages[:, ENV_POSITIONS].abs().sum() == 0
    assert advantages[:, :2].abs().sum() == 0


def test_dr_grpo_subtracts_group_mean_without_std():
    advantages = grpo_advantages(
        torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), ACTION.expand(3, -1), scale_by_std=False
    )
    assert torch.allclose(advantages[:, 6], torch.tensor([2 / 3, -1 / 3, -1 / 3]), atol=1e-6)


def test_advantage_mask_off_gives_env_tokens_the_advantage():
    mask = advantage_token_mask(ACTION, RESPONSE, use_advantage_mask=False)
    advantages = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask.expand(2, -1))
    assert torch.allclose(advantages[0, ENV_POSITIONS], advantages[0, 2].expand(2))
    assert advantages[0, 2] != 0


def test_rloo_baseline_is_mean_of_the_other_samples():
    advantages = rloo_advantages(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 0]), ACTION.expand(3, -1))
    # 1 - (0 + 0.5)/2, 0 - (1 + 0.5)/2, 0.5 - (1 + 0)/2
    assert torch.allclose(advantages[:, 3], torch.tensor([0.75, -0.75, 0.0]))
    assert advantages[:, ENV_POSITIONS].abs().sum() == 0


def test_rloo_singleton_group_gets_zero_advantage():
    advantages = rloo_advantages(torch.tensor([1.0]), torch.tensor([0]), ACTION)
    assert advantages.abs().sum() == 0


def test_gae_skips_env_tokens_and_bootstraps_across_them():
    values = torch.tensor(
        [[9.0, 9.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4]]
    )  # 9.0 on non-action tokens must be ignored
    advantages, returns = gae_advantages(two_turn_rewards(), values, ACTION, gamma=0.9, lam=0.8)
    # by hand, backwards over action tokens 7, 6, 3, 2 (gamma * lam = 0.72):
    a7 = 1.0 - 0.4  # 0.6
    a6 = (0.9 * 0.4 - 0.3) + 0.72 * a7  # 0.492
    a3 = (0.5 + 0.9 * 0.3 - 0.2) + 0.72 * a6  # next action token after 3 is 6, across the env segment
    a2 = (0.9 * 0.2 - 0.1) + 0.72 * a3
    expected = torch.tensor([[0, 0, a2, a3, 0, 0, a6, a7]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.allclose(returns, (expected + values) * ACTION, atol=1e-6)


def test_gae_ignores_right_padding_after_the_last_action_token():
    action = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 7.0, 7.0]])
    advantages, _ = gae_advantages(rewards, values, action, gamma=1.0, lam=1.0)
    assert torch.allclose(advantages, torch.tensor([[0.5, 0.5, 0.0, 0.0]]))


def test_discounted_return_does_not_discount_over_env_tokens():
    returns = discounted_returns(two_turn_rewards(), ACTION, gamma=0.5)
    # G7 = 1, G6 = 0.5, G3 = 0.5 + 0.5 * G6 = 0.75, G2 = 0.375
    assert torch.allclose(returns, torch.tensor([[0, 0, 0.375, 0.75, 0, 0, 0.5, 1.0]]))


def test_reinforce_pp_whitens_returns_over_the_whole_batch():
    rewards = torch.cat([two_turn_rewards(), torch.zeros(1, 8)])
    advantages = reinforce_pp_advantages(rewards, ACTION.expand(2, -1), gamma=1.0)
    # returns on action tokens: [1.5, 1.5, 1, 1] and [0, 0, 0, 0]; mean 0.625, population std sqrt(0.421875)
    std = math.sqrt(0.421875)
    expected_row0 = torch.tensor([0, 0, 0.875, 0.875, 0, 0, 0.375, 0.375]) / std
    expected_row1 = torch.tensor([0, 0, -0.625, -0.625, 0, 0, -0.625, -0.625]) / std
    assert torch.allclose(advantages, torch.stack([expected_row0, expected_row1]), atol=1e-5)


def test_reinforce_pp_group_baseline_subtracts_group_mean_outcome_at_the_last_action():
    rewards = torch.cat([two_turn_rewards(), torch.zeros(1, 8)])
    advantages = reinforce_pp_advantages(
        rewards,
        ACTION.expand(2, -1),
        gamma=1.0,
        outcomes=torch.tensor([1.5, 0.0]),
        groups=torch.tensor([0, 1]),
    )
    # singleton groups: row 0's last reward becomes 1.0 - 1.5, so returns [0, 0, -0.5, -0.5] and [0, 0, 0, 0];
    # mean -0.125, population std sqrt(0.046875)
    std = math.sqrt(0.046875)
    expected_row0 = torch.tensor([0, 0, 0.125, 0.125, 0, 0, -0.375, -0.375]) / std
    expected_row1 = torch.tensor([0, 0, 0.125, 0.125, 0, 0, 0.125, 0.125]) / std
    assert torch.allclose(advantages, torch.stack([expected_row0, expected_row1]), atol=1e-5)


def test_reinforce_pp_baseline_without_outcomes_is_a_clear_error():
    with pytest.raises(ValueError, match="outcomes"):
        reinforce_pp_advantages(two_turn_rewards(), ACTION, groups=torch.tensor([0]))


def test_kl_in_reward_penalises_action_tokens_only():
    logprobs = torch.full((1, 8), -1.0)
    ref_logprobs = torch.full((1, 8), -1.5)
    rewards = kl_penalized_rewards(two_turn_rewards(), logprobs, ref_logprobs, ACTION, kl_coef=0.1)
    assert torch.allclose(rewards[0, 2], torch.tensor(-0.05))
    assert torch.allclose(rewards[0, 7], torch.tensor(0.95))
    assert rewards[0, ENV_POSITIONS].abs().sum() == 0
