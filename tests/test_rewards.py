"""Answer metrics against hand-computed cases (official HotpotQA/SQuAD rules) and the reward specs."""

from __future__ import annotations

import pytest
from support.data import QA_SAMPLES

from agent_gym.error import InvalidValue
from agent_gym.rewards import (
    REWARD_SPECS,
    AnswerScores,
    RewardSpec,
    exact_match,
    f1_score,
    get_reward_spec,
    normalize_answer,
    score_answer,
    sub_exact_match,
)

# ---------------------------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        # lower -> "the  eiffel-tower!"; punctuation -> "the  eiffeltower"; articles -> "   eiffeltower"; fold
        ("The  Eiffel-Tower!", "eiffeltower"),
        ("An apple a day", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("  New\tYork \n City ", "new york city"),
        ("Dr. Who's 2nd-best (1963)", "dr whos 2ndbest 1963"),
        ("Über Café", "über café"),  # non-ASCII letters are not punctuation
        ("", ""),
    ],
)
def test_normalize_answer_follows_official_rules(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


# ---------------------------------------------------------------------------------------------- EM


def test_exact_match_ignores_case_punctuation_and_articles() -> None:
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0


def test_exact_match_is_zero_for_a_partial_answer() -> None:
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0


# ---------------------------------------------------------------------------------------------- F1


def test_f1_precision_and_recall_on_hand_computed_example() -> None:
    # prediction "cat sat on mat" (4 tokens), gold "cat on mat" (3): 3 shared -> P = 3/4, R = 1, F1 = 6/7
    f1, precision, recall = f1_score("The cat sat on the mat", "a cat on a mat")
    assert (f1, precision, recall) == pytest.approx((6 / 7, 0.75, 1.0))


def test_f1_counts_repeated_tokens_once_per_gold_occurrence() -> None:
    # "paris paris france" vs "paris": 1 shared token -> P = 1/3, R = 1, F1 = 0.5
    assert f1_score("Paris Paris France", "Paris") == pytest.approx((0.5, 1 / 3, 1.0))


def test_f1_is_zero_without_shared_tokens() -> None:
    assert f1_score("London", "Paris") == (0.0, 0.0, 0.0)


def test_f1_of_identical_answers_is_one() -> None:
    assert f1_score("New York City", "new york city") == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("prediction", "gold", "expected_f1"),
    [
        ("yes", "yes sir", 0.0),  # prediction is special and differs: only an exact match scores
        ("yes sir", "yes", 0.0),  # gold is special and differs
        ("no", "no", 1.0),
        ("No.", "no", 1.0),  # equal after normalisation
        ("noanswer", "no answer", 0.0),
        ("no answer", "no", 0.0),  # would share the token "no" without the special rule
    ],
)
def test_f1_special_handling_of_yes_no_noanswer(prediction: str, gold: str, expected_f1: float) -> None:
    assert f1_score(prediction, gold)[0] == expected_f1


# ---------------------------------------------------------------------------------------------- sub-EM


def test_sub_exact_match_finds_gold_inside_a_longer_prediction() -> None:
    assert sub_exact_match("It was in New York City, USA.", "New York City") == 1.0


def test_sub_exact_match_needs_whole_tokens() -> None:
    assert sub_exact_match("Yorkshire", "York") == 0.0


def test_sub_exact_match_of_empty_gold_is_zero() -> None:
    assert sub_exact_match("anything", "the") == 0.0


# ---------------------------------------------------------------------------------------------- aliases


def test_score_answer_takes_best_exact_match_over_aliases() -> None:
    assert score_answer("NYC", ["New York City", "NYC"]).em == 1.0


def test_score_answer_takes_best_f1_over_aliases_with_its_precision_and_recall() -> None:
    # vs "New York City": P = 1, R = 2/3, F1 = 0.8; vs "York": P = 1/2, R = 1, F1 = 2/3 -> keep the first
    scores = score_answer("New York", ["New York City", "York"])
    assert (scores.f1, scores.precision, scores.recall) == pytest.approx((0.8, 1.0, 2 / 3))


def test_score_answer_takes_best_sub_em_over_aliases() -> None:
    assert score_answer("born in NYC", ["New York City", "NYC"]).sub_em == 1.0


def test_score_answer_of_no_prediction_is_all_zero() -> None:
    assert score_answer(None, ["Paris"]) == AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0)


def test_score_answer_without_gold_is_all_zero() -> None:
    assert score_answer("Paris", []) == AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0)


def test_answer_scores_as_dict_names_every_metric() -> None:
    assert sorted(score_answer("Paris", ["Paris"]).as_dict()) == ["em", "f1", "precision", "recall", "sub_em"]


# ---------------------------------------------------------------------------------------------- specs

PERFECT = AnswerScores(em=1.0, f1=1.0, precision=1.0, recall=1.0, sub_em=1.0)
PARTIAL = AnswerScores(em=0.0, f1=0.8, precision=1.0, recall=2 / 3, sub_em=0.0)


def test_paper_outcome_is_em_when_format_is_right() -> None:
    assert REWARD_SPECS["paper"].outcome(PARTIAL, format_score=1.0, format_ok=True) == 0.0


def test_paper_outcome_pays_full_em_when_format_is_right() -> None:
    assert REWARD_SPECS["paper"].outcome(PERFECT, format_score=1.0, format_ok=True) == 1.0


def test_paper_outcome_is_format_score_minus_one_when_format_is_wrong() -> None:
    # Agent-R1 Eq. 6: a right answer in a wrong format still scores format - 1
    assert REWARD_SPECS["paper"].outcome(PERFECT, format_score=0.25, format_ok=False) == -0.75


def test_f1_outcome_metric_pays_f1() -> None:
    assert RewardSpec(outcome_metric="f1").outcome(PARTIAL, format_score=1.0, format_ok=True) == 0.8


def test_paper_spec_pays_no_process_reward() -> None:
    assert REWARD_SPECS["paper"].process(1.0, paid_so_far=0.0) == 0.0


def test_dense_process_reward_pays_per_useful_call() -> None:
    assert REWARD_SPECS["dense"].process(1.0, paid_so_far=0.0) == pytest.approx(0.1)


def test_dense_process_reward_is_clipped_to_the_cap() -> None:
    assert REWARD_SPECS["dense"].process(1.0, paid_so_far=0.25) == pytest.approx(0.05)


def test_dense_process_reward_is_zero_once_the_cap_is_reached() -> None:
    assert REWARD_SPECS["dense"].process(1.0, paid_so_far=0.3) == 0.0


def test_dense_process_reward_ignores_useless_calls() -> None:
    assert REWARD_SPECS["dense"].process(0.0, paid_so_far=0.0) == 0.0


def test_dense_cap_stays_below_a_correct_outcome() -> None:
    assert REWARD_SPECS["dense"].process_cap < 1.0


def test_get_reward_spec_looks_up_names() -> None:
    assert get_reward_spec("dense") is REWARD_SPECS["dense"]


def test_get_reward_spec_applies_overrides() -> None:
    assert get_reward_spec("dense", process_cap=0.5).process_cap == 0.5


def test_get_reward_spec_rejects_unknown_name_listing_choices() -> None:
    choices = r"\['dense', 'dense_charged', 'paper'\]"
    with pytest.raises(ValueError, match=rf"unknown reward spec 'sparse'; choose one of {choices}"):
        get_reward_spec("sparse")


# ---------------------------------------------------------------------------------------------- per-dataset rules
# Each dataset's official evaluator scores answers a little differently; `rule=` follows each one.


def test_hotpotqa_rule_scores_yes_no_only_by_exact_match() -> None:
    # hotpot_evaluate_v1.py: if either normalised side is yes / no / noanswer and they differ, F1 = P = R = 0.
    assert score_answer("no", ["No Doubt"], rule="hotpotqa").f1 == 0.0


def test_musique_rule_has_no_yes_no_rule() -> None:
    # musique metrics/answer.py compute_f1: plain token overlap; "no" vs "no doubt": P = 1, R = 1/2, F1 = 2/3.
    scores = score_answer("no", ["No Doubt"], rule="musique")
    assert (scores.f1, scores.precision, scores.recall) == (pytest.approx(2 / 3), 1.0, 0.5)


def test_musique_rule_scores_empty_against_empty_as_one() -> None:
    # compute_f1: "if either is no-answer, then F1 is 1 if they agree, 0 otherwise" (tokens of "the" are none).
    assert score_answer("the", [""], rule="musique").f1 == 1.0
    assert score_answer("the", [""], rule="hotpotqa").f1 == 0.0


def test_musique_rule_scores_an_empty_answer_against_a_real_gold_as_zero() -> None:
    assert score_answer("", ["Paris"], rule="musique").f1 == 0.0


def test_2wiki_rule_takes_precision_and_recall_each_as_the_best_over_aliases() -> None:
    # 2wikimultihop_evaluate_v1.1.py update_answer: max_f1, max_prec and max_recall are kept separately.
    # vs "Barack Hussein Obama II": P = 2/3, R = 2/4, F1 = 4/7; vs "Obama": P = 1/3, R = 1, F1 = 1/2.
    golds = ["Barack Hussein Obama II", "Obama"]
    two_wiki = score_answer("Barack Obama president", golds, rule="2wikimultihopqa")
    hotpot = score_answer("Barack Obama president", golds, rule="hotpotqa")
    assert (two_wiki.f1, two_wiki.precision, two_wiki.recall) == (pytest.approx(4 / 7), pytest.approx(2 / 3), 1.0)
    assert (hotpot.f1, hotpot.precision, hotpot.recall) == (pytest.approx(4 / 7), pytest.approx(2 / 3), 0.5)


def test_2wiki_rule_keeps_the_yes_no_rule() -> None:
    assert score_answer("no", ["No Doubt"], rule="2wikimultihopqa").f1 == 0.0


def test_an_unknown_answer_rule_is_refused_listing_the_rules() -> None:
    with pytest.raises(ValueError, match="hotpotqa, 2wikimultihopqa, musique, squad"):
        score_answer("x", ["x"], rule="natural-questions")  # squad is a rule now (Search-R1's nq/tq/popqa rows)


def test_the_reward_specs_answer_rule_decides_how_an_env_scores_answers(make_fact_env) -> None:
    from agent_gym.tasks import Task

    f1 = {}
    for rule in ("hotpotqa", "musique"):
        env = make_fact_env([Task("band", "Which band sang Don't Speak?", ("No Doubt",))],
                            reward=get_reward_spec("paper", answer_rule=rule))
        env.reset(seed=0)
        f1[rule] = env.step("<answer>no</answer>")[4]["reward_components"]["f1"]
    assert f1 == {"hotpotqa": 0.0, "musique": pytest.approx(2 / 3)}


def _qa_env(env_id: str, **kwargs: object):
    import gymnasium as gym

    import agent_gym  # noqa: F401 - registers the ids

    path = QA_SAMPLES[env_id]
    if not path.is_file():
        pytest.skip(f"shared data sample {path} absent")
    return gym.make(env_id, data_path=str(path), limit=2, **kwargs)


@pytest.mark.parametrize(("env_id", "rule"), [("AgentR1-HotpotQA-v0", "hotpotqa"),
                                              ("AgentR1-2WikiMultihopQA-v0", "2wikimultihopqa"),
                                              ("AgentR1-Musique-v0", "musique")])
def test_each_qa_env_scores_answers_with_its_datasets_rule(env_id: str, rule: str) -> None:
    env = _qa_env(env_id, reward="dense")
    assert env.unwrapped.reward_spec.answer_rule == rule and env.unwrapped.reward_spec.name == "dense"
    env.close()


def test_a_qa_env_keeps_the_answer_rule_of_a_reward_spec_given_to_it() -> None:
    env = _qa_env("AgentR1-Musique-v0", reward=get_reward_spec("paper", answer_rule="hotpotqa"))
    assert env.unwrapped.reward_spec.answer_rule == "hotpotqa"
    env.close()


def test_idle_charge_is_the_cost_clipped_to_the_cap() -> None:
    spec = REWARD_SPECS["dense_charged"]
    assert [spec.idle_charge(done) for done in (0.0, 0.25, 0.3)] == pytest.approx([-0.1, -0.05, 0.0])


def test_specs_without_a_cost_charge_nothing() -> None:
    assert REWARD_SPECS["dense"].idle_charge(0.0) == REWARD_SPECS["paper"].idle_charge(0.0) == 0.0


@pytest.mark.parametrize("field", ["format_penalty", "process_reward", "process_cap", "idle_call_cost"])
@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), "0.1", True])
def test_reward_spec_rejects_a_negative_or_non_finite_weight(field: str, value: object) -> None:
    with pytest.raises(InvalidValue, match=field):
        RewardSpec(**{field: value})
