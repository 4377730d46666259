"""The decision-bias measurement (issue 25): a threshold fitted on training questions, then greedy play that
decides the turn after the first search by it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import decision_bias  # noqa: E402
import decision_probe  # noqa: E402

from agent_gym.contract import MESSAGES  # noqa: E402
from tests.conftest import TINY_SYNTHHOP  # noqa: E402

TINY_ENV = {**TINY_SYNTHHOP, "max_turns": 4}


def test_the_threshold_is_the_best_balanced_split_nearest_zero() -> None:
    # already separated at 0: no shift
    assert decision_bias.best_threshold([-3.0, -2.0], [1.0, 2.0]) == (-0.5, 1.0)
    # separated, but both hop counts lean to searching: the threshold moves between them
    threshold, accuracy = decision_bias.best_threshold([2.0, 3.0], [4.0, 5.0])
    assert threshold == 3.5 and accuracy == 1.0
    assert decision_bias.balanced_accuracy([2.0, 3.0], [4.0, 5.0], 0.0) == 0.5
    # two equally good splits (one 1-hop question above the line, or one 2-hop below): the smaller shift wins
    threshold, accuracy = decision_bias.best_threshold([-2.0, -1.0, 0.5], [0.2, 1.0, 2.0])
    assert threshold == pytest.approx(-0.4) and accuracy == pytest.approx(5 / 6)
    # every 2-hop question below every 1-hop one: the best is to decide one way for all (half right)
    threshold, accuracy = decision_bias.best_threshold([1.0], [-1.0])
    assert accuracy == 0.5 and threshold in (-2.0, 2.0)


def test_the_policy_opens_the_turn_after_the_first_search_by_the_threshold(tiny_model) -> None:
    model, tokenizer = tiny_model
    contexts = decision_probe.first_search_contexts(2, 2, TINY_ENV)
    for messages in contexts:
        log_odds = decision_probe.probe(model, tokenizer, [messages])["log_odds"]
        for threshold, opening in ((log_odds - 1.0, "<tool_call>"), (log_odds + 1.0, "<answer>")):
            policy = decision_bias.ThresholdDecisionPolicy(model, tokenizer, threshold, max_new_tokens=16,
                                                           max_context_tokens=2048)
            text = policy.act("", {MESSAGES: messages})
            assert text.startswith(opening)
            assert len(policy.decisions) == 1
            assert math.isclose(policy.decisions[0][0], log_odds, rel_tol=1e-4, abs_tol=1e-4)
            assert policy.decisions[0][1] == (opening == "<tool_call>")
    # before the first tool reply (the opening turn) it is the plain greedy policy
    first_turn = contexts[0][: next(i for i, m in enumerate(contexts[0]) if m["role"] == "assistant")]
    policy = decision_bias.ThresholdDecisionPolicy(model, tokenizer, 0.0, max_new_tokens=16, max_context_tokens=2048)
    plain = decision_bias.ModelPolicy(model, tokenizer, max_new_tokens=16, max_context_tokens=2048)
    assert policy.act("", {MESSAGES: first_turn}) == plain.act("", {MESSAGES: first_turn})
    assert policy.decisions == []


def test_play_decides_once_an_episode_and_the_shift_replays_only_the_flipped_ones(tiny_model, monkeypatch) -> None:
    model, tokenizer = tiny_model
    # the tiny model never writes a well-formed call; its own turns here are the oracle's first search, so every
    # episode reaches the decision the threshold makes
    search = decision_probe.first_search_contexts(2, 1, TINY_ENV)[0][-2]["content"]
    monkeypatch.setattr(decision_bias.ModelPolicy, "act", lambda self, observation, info: search)
    tasks = range(4)
    never = decision_bias.play(model, tokenizer, math.inf, 2, tasks, TINY_ENV)
    always = decision_bias.play(model, tokenizer, -math.inf, 2, tasks, TINY_ENV)
    assert [e["task"] for e in never] == list(tasks)
    assert decision_bias.summary(never)["decided"] == 4 and decision_bias.summary(never)["searched_again"] == 0
    assert decision_bias.summary(always)["searched_again"] == 4 and decision_bias.summary(always)["multihop"] == 1.0
    # the log-odds do not depend on the threshold: the same decision point, the same model
    assert [e["log_odds"] for e in never] == [e["log_odds"] for e in always]
    # a threshold inside the log-odds' range flips some decisions; the shift from the play at 0 replays those and
    # equals a whole play at that threshold (greedy play is deterministic)
    values = sorted({e["log_odds"] for e in never})
    assert len(values) > 1, "the tiny model's log-odds should differ between questions"
    threshold = (values[0] + values[1]) / 2
    at_0 = decision_bias.play(model, tokenizer, 0.0, 2, tasks, TINY_ENV)
    assert decision_bias.shifted(model, tokenizer, at_0, threshold, 2, TINY_ENV) == decision_bias.play(
        model, tokenizer, threshold, 2, tasks, TINY_ENV)
    calls = []
    monkeypatch.setattr(decision_bias, "play", lambda *args, **kwargs: calls.append(list(args[4])) or [])
    decision_bias.shifted(model, tokenizer, at_0, threshold, 2, TINY_ENV)
    assert calls == [[e["task"] for e in at_0 if (e["log_odds"] > threshold) != e["searched_again"]]]
