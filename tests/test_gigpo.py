"""GiGPO on hand-built trajectories: anchor groups, step returns, and the advantage formula term by term.

One task, four episodes after the prompt [1, 2]. A search turn is model tokens, then the page the env returned:
- A searches with tokens [10, 11], gets page [50, 51], answers right (reward 1 on turn 2);
- B searches in other words [12, 11], gets the same page, answers wrong (0);
- C searches exactly as A did, gets the same page, answers wrong (0);
- D answers at once, half right (0.5).
"""

import statistics

import pytest
import torch

from agent_gym.trainers.algorithms import ESTIMATORS, EstimatorInputs, gigpo_advantages, grpo_advantages
from agent_gym.trainers.gigpo import find_turns
from agent_gym.trainers.trajectory import Trajectory, collate

PROMPT = [1, 2]


def _episode(turns, rewards, group="task-0"):
    """turns: a list of (model tokens, env tokens after them) pairs; rewards: one per turn."""
    response, mask, ends = [], [], []
    for model, env in turns:
        response += model
        mask += [1] * len(model)
        ends.append(len(response) - 1)
        response += env
        mask += [0] * len(env)
    return Trajectory(PROMPT, response, mask, [0.0] * len(response), ends, list(rewards), float(sum(rewards)), group)


EPISODES = [
    _episode([([10, 11], [50, 51]), ([20], [])], [0.0, 1.0]),  # A
    _episode([([12, 11], [50, 51]), ([21], [])], [0.0, 0.0]),  # B
    _episode([([10, 11], [50, 51]), ([22], [])], [0.0, 0.0]),  # C
    _episode([([30], [])], [0.5]),  # D
]


@pytest.fixture
def batch():
    return collate(EPISODES, pad_id=0)


def _turns(batch, state="observations"):
    return find_turns(batch.input_ids, batch.loss_mask, batch.attention_mask, batch.prompt_lengths,
                      batch.token_rewards, batch.group_index, state)


def _normalised(value, members):
    mean = statistics.mean(members)
    std = statistics.stdev(members) if len(members) > 1 else 0.0
    return (value - mean) / (std + 1e-6)


def test_turns_are_the_runs_of_model_tokens_with_their_rewards(batch):
    turns = _turns(batch)
    assert turns.row.tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert turns.start.tolist() == [2, 6, 2, 6, 2, 6, 2]  # after the 2 prompt tokens; turn 2 after the page
    assert turns.end.tolist() == [6, 7, 6, 7, 6, 7, 3]  # a turn's span holds the env reply after it
    assert turns.reward.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5]


def test_episodes_that_saw_the_same_pages_share_an_anchor_state(batch):
    anchor = _turns(batch, "observations").anchor.tolist()
    first_turns, second_turns = [anchor[0], anchor[2], anchor[4], anchor[6]], [anchor[1], anchor[3], anchor[5]]
    assert len(set(first_turns)) == 1  # every episode starts from the task's prompt
    assert len(set(second_turns)) == 1  # A, B and C read the same page, whatever words B searched with
    assert first_turns[0] != second_turns[0]


def test_context_anchor_states_need_the_same_tokens_too(batch):
    anchor = _turns(batch, "context").anchor.tolist()
    a, b, c = anchor[1], anchor[3], anchor[5]
    assert a == c and b != a  # B's own words differ from A's, C's do not


def test_the_same_state_in_two_groups_is_two_anchor_groups():
    other = [_episode([([10, 11], [50, 51]), ([20], [])], [0.0, 1.0], group="task-1")]
    batch = collate(EPISODES + other, pad_id=0)
    anchor = _turns(batch).anchor.tolist()
    assert anchor[7] != anchor[0] and anchor[8] != anchor[1]


def test_step_returns_discount_later_turn_rewards(batch):
    returns = _turns(batch).returns(0.95).tolist()
    assert returns == pytest.approx([0.95, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5])


def test_gigpo_advantage_is_grpo_plus_the_anchor_normalised_step_return(batch):
    action = batch.loss_mask.float()
    advantages = gigpo_advantages(batch, action, step_weight=0.5, step_gamma=0.95)
    episode = grpo_advantages(batch.episode_returns, batch.group_index, action)
    first = [0.95, 0.0, 0.0, 0.5]  # the returns of the first turns (one anchor group)
    second = [1.0, 0.0, 0.0]  # of the second turns of A, B, C (one anchor group by observations)
    # A's first turn (tokens 2, 3) and second turn (token 6); the page (4, 5) is the env's: no advantage
    assert advantages[0, 2].item() == pytest.approx(episode[0, 2].item() + 0.5 * _normalised(0.95, first))
    assert advantages[0, 6].item() == pytest.approx(episode[0, 6].item() + 0.5 * _normalised(1.0, second))
    assert advantages[1, 6].item() == pytest.approx(episode[1, 6].item() + 0.5 * _normalised(0.0, second))
    assert advantages[3, 2].item() == pytest.approx(episode[3, 2].item() + 0.5 * _normalised(0.5, first))
    assert advantages[:, 4:6].abs().sum() == 0 and advantages[:, :2].abs().sum() == 0


def test_a_turn_alone_in_its_anchor_state_gets_no_step_advantage(batch):
    action = batch.loss_mask.float()
    advantages = gigpo_advantages(batch, action, anchor_state="context")
    episode = grpo_advantages(batch.episode_returns, batch.group_index, action)
    assert advantages[1, 6].item() == pytest.approx(episode[1, 6].item())  # B's second turn: a singleton


def test_with_zero_step_weight_gigpo_is_grpo(batch):
    action = batch.loss_mask.float()
    episode = grpo_advantages(batch.episode_returns, batch.group_index, action)
    assert torch.allclose(gigpo_advantages(batch, action, step_weight=0.0), episode)


def test_advantage_mask_off_gives_the_env_reply_its_turns_step_advantage(batch):
    action = batch.response_mask.float()
    advantages = gigpo_advantages(batch, action)
    assert advantages[0, 4].item() == pytest.approx(advantages[0, 2].item())  # the page after A's search
    assert advantages[0, 0].item() == 0.0  # the prompt never


def test_gigpo_is_a_group_estimator_reading_the_batch_tokens(batch):
    estimator = ESTIMATORS["gigpo"]
    assert estimator.needs_groups and not estimator.needs_critic and estimator.reads_token_rewards
    action = batch.loss_mask.float()
    inputs = EstimatorInputs(batch.token_rewards, batch.episode_returns, batch.group_index, action, tokens=batch)
    assert torch.allclose(estimator(inputs).advantages, gigpo_advantages(batch, action))
