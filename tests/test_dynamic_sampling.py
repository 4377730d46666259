"""Dynamic sampling (DAPO) and the balance by task kind, on scripted rounds and hand-built batches."""

import pytest
import torch

from agent_gym.contract import TASK_FIELDS
from agent_gym.episode_summary import EpisodeSummary
from agent_gym.error import InvalidValue
from agent_gym.trainers.dynamic_sampling import fill_with_informative_groups, informative_groups, round_seed
from agent_gym.trainers.kind_balance import (
    balance_weights,
    informative_share_by_kind,
    row_loss_weights,
    task_kinds,
)
from agent_gym.trainers.trajectory import Trajectory


def _trajectory(group, outcome, hops=1, tokens=1):
    return Trajectory([1], [5] * tokens, [1] * tokens, [0.0] * tokens, [tokens - 1], [outcome], outcome, group,
                      episode=EpisodeSummary(task_fields={"hops": hops, "kind": "bridge"}))


def _group(name, outcomes, hops=1, tokens=1):
    return [_trajectory(name, outcome, hops, tokens) for outcome in outcomes]


class ScriptedRounds:
    """Round r returns rounds[r] (the last one repeats), and counts the calls."""

    def __init__(self, *rounds):
        self.rounds, self.calls = rounds, 0

    def __call__(self, round_index):
        assert round_index == self.calls  # rounds are asked for in order
        self.calls += 1
        return self.rounds[min(round_index, len(self.rounds) - 1)]


def test_informative_groups_are_those_whose_returns_differ():
    outcomes = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.7])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert informative_groups(outcomes, groups).tolist() == [False, True, False, False]


def test_groups_with_equal_returns_are_dropped_and_more_tasks_fill_the_batch():
    first = _group("a", [1, 1]) + _group("b", [0, 1]) + _group("c", [0, 0])
    second = _group("a", [0, 1]) + _group("d", [1, 1]) + _group("e", [1, 0])
    rounds = ScriptedRounds(first, second)
    sampled = fill_with_informative_groups(rounds, groups_wanted=3, max_rounds=5)
    assert rounds.calls == 2 and sampled.rounds == 2
    # b from round 0, then a and e of round 1; the same task in two rounds is two groups
    assert [t.group_id for t in sampled.trajectories] == ["0/b", "0/b", "1/a", "1/a", "1/e", "1/e"]
    assert (sampled.groups, sampled.informative) == (6, 3)
    assert sampled.informative_share == pytest.approx(0.5)
    assert len(sampled.sampled) == 12  # every episode played, for the episode metrics


def test_a_full_first_round_plays_no_refill_and_keeps_the_batch_size():
    rounds = ScriptedRounds(_group("a", [0, 1]) + _group("b", [1, 0]) + _group("c", [0, 1]))
    sampled = fill_with_informative_groups(rounds, groups_wanted=2, max_rounds=4)
    assert rounds.calls == 1
    assert [t.group_id for t in sampled.trajectories] == ["0/a", "0/a", "0/b", "0/b"]  # the surplus c left out
    assert sampled.informative_share == 1.0


def test_refill_stops_after_max_rounds_and_trains_on_the_last_round_when_none_was_informative():
    last = _group("z", [1, 1])
    rounds = ScriptedRounds(_group("a", [0, 0]), _group("b", [1, 1]), last)
    sampled = fill_with_informative_groups(rounds, groups_wanted=1, max_rounds=3)
    assert rounds.calls == 3 and sampled.rounds == 3
    assert [t.group_id for t in sampled.trajectories] == ["2/z", "2/z"]
    assert sampled.informative_share == 0.0


def test_a_step_that_ends_short_trains_on_the_informative_groups_it_found():
    rounds = ScriptedRounds(_group("a", [0, 1]), _group("b", [1, 1]))
    sampled = fill_with_informative_groups(rounds, groups_wanted=4, max_rounds=2)
    assert [t.group_id for t in sampled.trajectories] == ["0/a", "0/a"]
    assert sampled.informative_share == pytest.approx(0.5)


def test_refill_rounds_sample_with_new_seeds_and_round_zero_keeps_the_steps():
    assert round_seed(17, 0) == 17
    seeds = {round_seed(17, r) for r in range(1, 5)} | {round_seed(18, r) for r in range(1, 5)}
    assert len(seeds) == 8 and 17 not in seeds and 18 not in seeds


def test_rounds_and_groups_wanted_must_be_positive():
    with pytest.raises(InvalidValue):
        fill_with_informative_groups(ScriptedRounds([]), groups_wanted=1, max_rounds=0)


# ---------------------------------------------------------------------------------------------- balance by kind


def _batch(groups):
    """Rows of hand-built groups: (kind, outcomes, tokens per row)."""
    kinds, outcomes, group_ids, tokens = [], [], [], []
    for index, (kind, returns, length) in enumerate(groups):
        for outcome in returns:
            kinds.append(kind)
            outcomes.append(float(outcome))
            group_ids.append(index)
            tokens.append(length)
    return kinds, torch.tensor(outcomes), torch.tensor(group_ids), torch.tensor(tokens, dtype=torch.float32)


def test_each_kind_holds_the_same_total_loss_weight_among_informative_groups():
    # three informative 1-hop groups of short episodes, one informative 2-hop group of long ones, and an
    # uninformative 2-hop group
    kinds, outcomes, groups, tokens = _batch(
        [("1", [0, 1], 10), ("1", [1, 0], 10), ("1", [0, 1], 10), ("2", [0, 1], 30), ("2", [0, 0], 30)]
    )
    scale = balance_weights(kinds, outcomes, groups, tokens)
    informative = torch.tensor([True] * 8 + [False] * 2)
    weight = scale * tokens
    assert float(weight[:6].sum()) == pytest.approx(float(weight[6:8].sum()))  # 1-hop's total, 2-hop's
    assert float(weight[informative].sum()) == pytest.approx(float(tokens[informative].sum()))  # total unchanged
    assert scale[~informative].tolist() == [1.0, 1.0]  # no signal to rebalance


def test_balance_by_sequence_weights_counts_rows_not_tokens():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert row_loss_weights(mask, "seq-mean-token-mean").tolist() == [1.0, 1.0]
    assert row_loss_weights(mask, "token-mean").tolist() == [3.0, 1.0]
    kinds, outcomes, groups, _ = _batch([("a", [0, 1], 1), ("a", [0, 1], 1), ("b", [1, 0], 1)])
    scale = balance_weights(kinds, outcomes, groups, torch.ones(6))
    assert float(scale[:4].sum()) == pytest.approx(3.0) and float(scale[4:].sum()) == pytest.approx(3.0)


def test_a_batch_with_one_informative_kind_is_left_as_it_is():
    kinds, outcomes, groups, tokens = _batch([("1", [0, 1], 5), ("2", [1, 1], 9)])
    assert balance_weights(kinds, outcomes, groups, tokens).tolist() == [1.0] * 4


def test_informative_share_is_reported_per_kind():
    trajectories = (
        _group("a", [0, 1], hops=1) + _group("b", [1, 1], hops=1) + _group("c", [0, 1], hops=2)
    )
    assert informative_share_by_kind(trajectories, "hops") == {"1": 0.5, "2": 1.0}
    assert task_kinds(trajectories, "kind") == ["bridge"] * 6


def test_a_field_the_env_does_not_give_is_a_clear_error():
    with pytest.raises(InvalidValue, match="balance_by='level'.*hops"):
        task_kinds(_group("a", [0, 1]), "level")


def test_synthhop_reset_info_names_each_tasks_hop_count_and_kind():
    from agent_gym import make_env

    env = make_env("AgentR1-SynthHop-v0", {"hops": [1, 2]})
    hops = set()
    for index in range(4):
        _, info = env.reset(options={"task_index": index})
        assert info[TASK_FIELDS]["kind"] in ("bridge", "comparison")
        hops.add(info[TASK_FIELDS]["hops"])
    assert hops == {1, 2}
