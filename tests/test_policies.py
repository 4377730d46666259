"""Scripted policies: the oracle proves env, search and reward agree; naive-rag is a measurably weaker baseline."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import SMALL_SYNTHHOP

from agent_gym.evaluation import evaluate, run_episode, summarize
from agent_gym.policies import POLICIES, extract_answer, make_policy

EPISODES = 20


def synthhop(hops: int, **settings) -> gym.Env:
    return gym.make("AgentR1-SynthHop-v0", hops=hops, **SMALL_SYNTHHOP, **settings)


def mean_em(policy: str, hops: int, **settings) -> float:
    records = evaluate(synthhop(hops, **settings), make_policy(policy), EPISODES, progress=False)
    return summarize(records)["em"]


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_oracle_scores_full_em_on_synthhop(hops: int) -> None:
    assert mean_em("oracle", hops) == 1.0


@pytest.mark.parametrize("tool_format", ["xml", "openai"])
def test_oracle_scores_full_em_in_every_wire_format(tool_format: str) -> None:
    assert mean_em("oracle", 2, tool_format=tool_format) == 1.0


@pytest.mark.parametrize("hops", [2, 3, 4])
def test_naive_rag_scores_measurably_less_than_oracle_on_multi_hop(hops: int) -> None:
    # measured on this world (20 episodes): EM 0.00 / 0.05 / 0.10 at 2 / 3 / 4 hops, against the oracle's 1.0
    assert mean_em("naive-rag", hops) <= 0.5


def test_naive_rag_answers_most_single_hop_questions() -> None:
    # measured: EM 0.90 at 1 hop, so its reader works and the multi-hop gap is about hops, not reading
    assert mean_em("naive-rag", 1) >= 0.6


def test_gold_search_retrieves_all_evidence() -> None:
    records = evaluate(synthhop(2), make_policy("gold-search"), EPISODES, progress=False)
    assert summarize(records)["evidence_recall"] == 1.0


@pytest.mark.parametrize("tool_format", ["hermes", "xml", "openai"])
def test_random_policy_finishes_every_episode(tool_format: str) -> None:
    records = evaluate(synthhop(2, tool_format=tool_format), make_policy("random", seed=1), EPISODES,
                       progress=False)
    assert len(records) == EPISODES and all(record.turns >= 1 for record in records)


def test_oracle_takes_one_turn_per_hop_plus_the_answer() -> None:
    record = run_episode(synthhop(3), make_policy("oracle"), seed=0)
    assert (record.turns, record.tool_calls, record.valid_tool_calls) == (4, 3, 3)


def test_make_policy_knows_every_policy() -> None:
    assert sorted(POLICIES) == ["gold-search", "naive-rag", "oracle", "random", "stub", "weak-multihop"]


def test_make_policy_rejects_unknown_name_listing_choices() -> None:
    with pytest.raises(ValueError, match="unknown policy 'genius'; choose one of"):
        make_policy("genius")


@pytest.mark.parametrize(
    ("question", "passage", "expected"),
    [
        ("Where was Herman Melville born?", "Herman Melville was born in New York City in 1819.", "New York City"),
        ("When was Herman Melville born?", "Herman Melville was born in New York City in 1819.", "1819"),
        ("Who wrote Moby Dick?", "Moby Dick. Moby Dick is a novel written by Herman Melville.", "Herman Melville"),
        ("How many moons does Mars have?", "Mars has 2 moons, Phobos and Deimos.", "2"),
    ],
)
def test_extract_answer_picks_the_span_the_question_asks_for(question: str, passage: str, expected: str) -> None:
    assert extract_answer(question, passage) == expected


def test_extract_answer_of_empty_passage_is_none() -> None:
    assert extract_answer("Who wrote Moby Dick?", "") is None


def test_weak_multihop_teacher_scores_between_naive_rag_and_the_oracle_on_two_hops() -> None:
    env = synthhop(2)
    weak = summarize(evaluate(env, make_policy("weak-multihop", seed=0), 40, progress=False))
    assert 0.05 < weak["em"] < 0.8
