"""The warm-start sweep's selection rule (issue 25): fixed before any RL result, read off the 8-sample groups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import warmstart_sweep as sweep  # noqa: E402


def _pass8(informative_1hop: float, informative_2hop: float) -> dict[str, dict[str, float]]:
    return {"pass8_1hop": {"informative": informative_1hop}, "pass8_2hop": {"informative": informative_2hop}}


def test_group_stats_counts_only_groups_with_both_a_right_and_a_wrong_answer_as_informative() -> None:
    successes = {0: [True] * 8, 1: [False] * 8, 2: [True] + [False] * 7, 3: [False, True] * 4}
    stats = sweep.group_stats(successes, searches=[1, 2, 1, 3])
    assert stats["informative"] == 0.5  # groups 2 and 3
    assert stats["pass_at_k"] == 0.75  # every group but 1
    assert stats["em"] == pytest.approx((8 + 1 + 4) / 32)
    assert stats["multihop"] == 0.5
    assert stats["questions"] == 4 and stats["samples"] == 32


def test_choose_warm_start_maximises_the_smaller_informative_share_of_the_two_hop_counts() -> None:
    evals = {5: _pass8(0.80, 0.02), 25: _pass8(0.70, 0.20), 50: _pass8(0.50, 0.30), 100: _pass8(0.10, 0.60)}
    chosen, scores = sweep.choose_warm_start(evals)
    assert chosen == 50  # min 0.30 beats 0.20 (25 %), 0.10 (100 %) and 0.02 (5 %)
    assert scores == {5: 0.02, 25: 0.20, 50: 0.30, 100: 0.10}


def test_choose_warm_start_breaks_ties_toward_fewer_two_hop_demos_and_skips_unfinished_shares() -> None:
    evals = {25: _pass8(0.4, 0.3), 75: _pass8(0.3, 0.5), 100: {"pass8_1hop": {"informative": 0.9}}}
    assert sweep.choose_warm_start(evals)[0] == 25
    with pytest.raises(ValueError, match="no warm start"):
        sweep.choose_warm_start({100: {"pass8_1hop": {"informative": 0.9}}})


def test_every_share_cycles_its_hop_list_to_the_named_share_of_two_hop_questions() -> None:
    for share, hops in sweep.SHARES.items():
        assert 100 * hops.count(2) / len(hops) == share
    assert sweep.HELD_OUT["world_seed"] not in (0, sweep.TRAIN_ENV["world_seed"])
    assert sweep.HELD_OUT["split"] == "test"
