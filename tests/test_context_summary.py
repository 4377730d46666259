"""The extractive summary of folded turns: each tool call with the result lines most relevant to it."""

from __future__ import annotations

import json

from agent_gym.context_summary import extractive_summary
from agent_gym.formats import get_format
from agent_gym.tools import tool


@tool
def search(query: str) -> str:
    """Search.

    Args:
        query: what to search for.
    """
    return query


SCHEMAS = [search.schema()]
RESULT = "\n".join([
    "Doc 1 (Title: Moby Dick) Moby Dick is a novel.",
    "Doc 2 (Title: Herman Melville) Herman Melville was born in New York City in 1819.",
    "Doc 3 (Title: Whaling) Whaling is the hunting of whales.",
])


def hermes_turn(query: str, result: str) -> list[dict]:
    call = f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': query}})}</tool_call>"
    return [{"role": "assistant", "content": f"Let me search.\n{call}"},
            {"role": "tool", "name": "search", "tool_call_id": "call_0", "content": result}]


def summary(messages: list[dict], max_chars: int = 2_000, tool_format: str = "hermes") -> str:
    return extractive_summary(messages, get_format(tool_format), SCHEMAS, max_calls=3, max_chars=max_chars)


def test_summary_keeps_the_result_lines_that_share_the_most_words_with_the_call() -> None:
    text = summary(hermes_turn("Herman Melville born", RESULT))
    assert text == ('- search {"query": "Herman Melville born"} -> Doc 2 (Title: Herman Melville) Herman Melville '
                    "was born in New York City in 1819.")


def test_summary_keeps_at_most_two_lines_per_call_in_their_order_of_relevance() -> None:
    text = summary(hermes_turn("Melville whales novel", RESULT))
    assert text.split(" -> ")[1] == ("Doc 1 (Title: Moby Dick) Moby Dick is a novel. | "
                                    "Doc 2 (Title: Herman Melville) Herman Melville was born in New York City in 1819.")


def test_summary_keeps_a_result_that_shares_no_word_with_the_call() -> None:
    assert summary(hermes_turn("6 * 7", "42")) == '- search {"query": "6 * 7"} -> 42'


def test_summary_drops_the_reasoning_text_of_a_turn() -> None:
    assert "Let me search" not in summary(hermes_turn("whales", RESULT))


def test_summary_of_turns_without_a_tool_call_says_so() -> None:
    messages = [{"role": "assistant", "content": "hmm"},
                {"role": "user", "content": "Your last turn could not be used"}]
    assert summary(messages) == "- no tool ran in those turns."


def test_summary_never_exceeds_its_budget_and_keeps_the_newest_calls() -> None:
    messages = [message for index in range(40) for message in hermes_turn(f"query {index}", RESULT)]
    text = summary(messages, max_chars=300)
    assert len(text) <= 300 and "query 39" in text and "earlier calls left out" in text


def test_xml_results_are_shared_by_the_calls_of_their_turn() -> None:
    messages = [{"role": "assistant", "content": "<search>Melville born</search><search>whales</search>"},
                {"role": "user", "content": f"<information>{RESULT}</information>"}]
    lines = summary(messages, tool_format="xml").splitlines()
    assert "Herman Melville was born" in lines[0] and "Whaling is the hunting" in lines[1]
