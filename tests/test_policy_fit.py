"""A scripted policy refuses an env it cannot play, naming those that can; gold-search, like the oracle, answers
only what its searches showed, and the oracle says how many decompositions it could not follow."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
from conftest import SMALL_SYNTHHOP

from agent_gym import Hop, Task, register_tool_env, tool
from agent_gym.evaluation import evaluate, summarize
from agent_gym.policies import PolicyError, make_policy, playable_policies

EMPTY_ENV = "EmptySearch-v0"


@tool
def search(query: str) -> str:
    """Search an encyclopedia that has no page on anything.

    Args:
        query: what to look for.
    """
    return "No page matches."


@pytest.fixture
def empty_search_env():
    tasks = [Task("t1", "Where was the author of Moby Dick born?", ("New York City",),
                  supporting_titles=("Moby Dick", "Herman Melville"),
                  decomposition=(Hop("Who wrote Moby Dick?", "Herman Melville", "Moby Dick", "Moby Dick"),
                                 Hop("Where was he born?", "New York City", "Herman Melville", "Herman Melville")))]
    register_tool_env(EMPTY_ENV, tools=[search], tasks=tasks, max_turns=4)
    yield gym.make(EMPTY_ENV)
    gym.registry.pop(EMPTY_ENV)


@pytest.mark.parametrize("name", ["gold-search", "naive-rag", "weak-multihop"])
def test_a_search_policy_on_the_calculator_is_refused_naming_those_that_can_play_it(name: str) -> None:
    env = gym.make("AgentR1-Calculator-v0", num_questions=5)
    with pytest.raises(PolicyError) as refused:
        evaluate(env, make_policy(name), 2, progress=False)
    message = str(refused.value)
    assert f"the {name} policy" in message
    assert message.endswith("the scripted policies that can play AgentR1-Calculator-v0: oracle, random")


def test_playable_policies_of_a_search_env_with_gold_data() -> None:
    env = gym.make("AgentR1-SynthHop-v0", hops=2, **SMALL_SYNTHHOP)
    assert playable_policies(env.unwrapped) == ["gold-search", "naive-rag", "oracle", "random", "weak-multihop"]


def test_gold_search_answers_unknown_when_its_searches_found_no_evidence(empty_search_env) -> None:
    [record] = evaluate(empty_search_env, make_policy("gold-search"), 1, progress=False)
    assert record.answer == "unknown" and record.em == 0.0 and record.evidence_recall == 0.0


@pytest.mark.parametrize("tool_format", ["hermes", "xml", "openai"])
def test_gold_search_answers_gold_when_it_found_the_evidence_in_every_wire_format(tool_format: str) -> None:
    env = gym.make("AgentR1-SynthHop-v0", hops=2, tool_format=tool_format, **SMALL_SYNTHHOP)
    summary = summarize(evaluate(env, make_policy("gold-search"), 20, progress=False))
    assert summary["em"] == 1.0 and summary["evidence_recall"] == 1.0


def test_eval_says_how_many_decompositions_the_oracle_could_not_follow(
    empty_search_env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_gym.cli import main

    assert main(["eval", EMPTY_ENV, "--policy", "oracle", "--episodes", "1", "--no-progress",
                 "--out", str(tmp_path / "o.jsonl")]) == 0
    assert ("oracle: 1 of 1 gold decompositions could not be followed (a hop's answer was not in what its search "
            "returned; task 't1' first)") in capsys.readouterr().err
