"""AgentR1-Math-v0: reasoning-gym families, reasoning-gym's own scores, held-out splits, baselines."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.envs.reasoning_math import ReasoningGymChecker, generate_math_tasks, score_in_sandbox
from agent_gym.error import InvalidValue
from agent_gym.evaluation import evaluate, summarize
from agent_gym.policies import make_policy
from agent_gym.tools.sandbox import SandboxLimits

reasoning_gym = pytest.importorskip("reasoning_gym", reason="AgentR1-Math-v0 needs reasoning-gym (agent-gym[math])")

FAST = ["basic_arithmetic", "gcd", "lcm"]  # base-class scorers: scored in-process, no sandbox start


def test_tasks_come_from_the_chosen_families_in_turn() -> None:
    tasks = generate_math_tasks(FAST, size=6, seed=1)
    assert [task.metadata["family"] for task in tasks] == FAST * 2
    assert len({task.question for task in tasks}) == 6


def test_train_and_test_splits_differ_by_seed_and_never_share_a_question() -> None:
    families = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    train = {task.question for task in generate_math_tasks(families, size=60, seed=0, split="train")}
    test = {task.question for task in generate_math_tasks(families, size=40, seed=0, split="test")}
    assert len(train) == 60 and len(test) == 40 and not train & test


def test_the_same_seed_gives_the_same_tasks() -> None:
    first, second = (generate_math_tasks(FAST, size=4, seed=7) for _ in range(2))
    assert [task.question for task in first] == [task.question for task in second]


def test_the_score_is_reasoning_gyms_own_including_its_partial_credit() -> None:
    (task,) = generate_math_tasks(["basic_arithmetic"], size=1, seed=3)
    dataset = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=1)
    entry = {"answer": task.answers[0]}
    padded = f"{task.answers[0]} is it"
    assert task.checker(task.answers[0]).score == 1.0
    expected = dataset.score_answer(padded, entry)
    assert 0.0 < expected < 1.0 and task.checker(padded).score == pytest.approx(expected)


def test_a_scorer_that_evaluates_answers_runs_them_in_the_sandbox(tmp_path: Path) -> None:
    (task,) = generate_math_tasks(["countdown"], size=1, seed=0)  # its scorer runs sympy's parse_expr (eval)
    checker = task.checker
    assert isinstance(checker, ReasoningGymChecker) and not checker.in_process
    target = tmp_path / "pwned"
    verdict = checker(f"__import__('pathlib').Path({str(target)!r}).write_text('x') or 1")
    assert verdict.details["scored_in"] in ("sandbox", "refused") and verdict.score < 1.0  # never "process"
    assert not target.exists()
    assert checker(task.answers[0]).score == 1.0


@pytest.mark.parametrize("family", ["bitwise_arithmetic", "polynomial_multiplication"])
def test_the_right_answer_scores_one_where_the_scorer_evaluates_or_generation_follows_the_hash_seed(
        family: str) -> None:
    # bitwise_arithmetic's scorer evals its own question (hex, shifts): a literal-only eval refused it; the sandbox
    # regenerated polynomial_multiplication's question under another hash seed (it iterates a set of monomials)
    task = generate_math_tasks((family,), size=2)[0]
    verdict = task.checker(task.answers[0])
    assert verdict.score == 1.0, verdict.details


@pytest.mark.slow
def test_every_familys_oracle_answer_scores_one() -> None:
    from reasoning_gym.factory import DATASETS

    tasks, without_answers = [], []
    for family in sorted(set(DATASETS) - {"composite"}):  # composite needs the families it mixes
        try:
            tasks += generate_math_tasks([family], size=1, seed=5)
        except InvalidValue as error:
            assert "gives no reference answer" in str(error), (family, error)
            without_answers.append(family)
    assert len(tasks) > 90 and len(without_answers) < 10
    scores = {task.kind: task.checker(task.answers[0]).score for task in tasks if task.checker.in_process}
    # the rest in one sandbox run (one import of reasoning-gym), through the scorer program every checker runs
    in_sandbox = [task for task in tasks if not task.checker.in_process]
    verdicts = score_in_sandbox([(task.checker, task.answers[0]) for task in in_sandbox],
                                SandboxLimits(wall_s=400, cpu_s=300, memory_mb=4096))
    scores.update({task.kind: verdict.score for task, verdict in zip(in_sandbox, verdicts, strict=True)})
    assert {family: score for family, score in scores.items() if score != 1.0} == {}


@pytest.mark.parametrize("answer", ["9**9**9**9", "factorial(10**9)", "(10**9)!", "x**(9^9^9)", "N(pi, 10**8)"])
def test_an_answer_too_large_to_compute_is_refused_before_the_scorer_runs(answer: str) -> None:
    (task,) = generate_math_tasks(["countdown"], size=1, seed=0)  # sympy computes the answer's numbers exactly
    started = time.perf_counter()
    verdict = task.checker(answer)
    assert verdict.score == 0.0 and verdict.details["scored_in"] == "refused"
    assert "too large to score" in verdict.details["error"]
    assert time.perf_counter() - started < 2.0  # a guard, not a benchmark: no sandbox starts (it took ~45 s)


def test_oracle_scores_one_and_random_scores_little() -> None:
    env = gym.make("AgentR1-Math-v0", tasks=FAST, size=6)
    oracle = summarize(evaluate(env, make_policy("oracle"), 6, progress=False))
    random = summarize(evaluate(env, make_policy("random", seed=0), 6, progress=False))
    env.close()
    assert oracle["em"] == 1.0 and random["em"] < 0.5


def test_the_env_offers_run_python_and_calculate() -> None:
    env = gym.make("AgentR1-Math-v0", tasks=FAST, size=3)
    _, info = env.reset(seed=0)
    env.close()
    assert [schema["function"]["name"] for schema in info["tools"]] == ["run_python", "calculate"]


@pytest.mark.parametrize(("kwargs", "message"), [({"tasks": ["no_such_family"]}, "unknown reasoning-gym family"),
                                                 ({"tasks": []}, "at least one"), ({"split": "dev"}, "split"),
                                                 ({"size": 0}, "size must be at least 1")])
def test_bad_settings_are_refused_with_a_clear_message(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make("AgentR1-Math-v0", **{"tasks": FAST, "size": 3, **kwargs})
