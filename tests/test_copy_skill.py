"""The copy-skill metric: teacher-forced greedy exactness of each assistant turn."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_gym.trainers.token_episode import SFTExample
from agent_gym.warmstart.copy_skill import turn_exactness


class ScriptedLM(torch.nn.Module):
    """Predicts the true next token everywhere, except at the given positions where it predicts id 0."""

    def __init__(self, vocab_size: int, wrong_after: set[int]) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.wrong_after = wrong_after  # position t: the prediction of token t + 1 is wrong

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        targets = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1).clone()
        for position in self.wrong_after:
            targets[:, position] = 0
        return SimpleNamespace(logits=torch.nn.functional.one_hot(targets, self.vocab_size).float())


# Two assistant turns: tokens 2-3 (turn 1) and 5-7 (turn 2); ids are never 0.
EXAMPLE = SFTExample(input_ids=[5, 6, 7, 8, 9, 10, 11, 12], loss_mask=[0, 0, 1, 1, 0, 1, 1, 1])


def test_a_model_that_predicts_every_token_scores_every_turn_exact() -> None:
    scores = turn_exactness(ScriptedLM(16, set()), [EXAMPLE])
    assert scores["turn1/exact"] == scores["turn2/exact"] == scores["min_exact"] == 1.0


def test_one_wrong_token_makes_only_its_turn_inexact() -> None:
    scores = turn_exactness(ScriptedLM(16, {5}), [EXAMPLE])  # the logits at 5 predict token 6, in turn 2
    assert scores["turn1/exact"] == 1.0
    assert scores["turn2/exact"] == 0.0
    assert scores["turn2/token_acc"] == pytest.approx(2 / 3)
    assert scores["min_exact"] == 0.0


def test_a_wrong_env_token_does_not_count() -> None:
    scores = turn_exactness(ScriptedLM(16, {3}), [EXAMPLE])  # predicts token 4, an env token
    assert scores["min_exact"] == 1.0


def test_exactness_averages_each_turn_over_the_examples_that_have_it() -> None:
    one_turn = SFTExample(input_ids=[1, 2, 3, 4, 5, 6, 7, 8], loss_mask=[0, 0, 1, 1, 1, 1, 0, 0])
    scores = turn_exactness(ScriptedLM(16, {4}), [EXAMPLE, one_turn])  # wrong: token 5 of each
    assert scores["turn1/exact"] == 0.5
    assert scores["turn2/exact"] == 0.0
