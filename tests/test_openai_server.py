"""Our OpenAI-compatible chat server answers in the chat-completions schema that OpenAI clients validate."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_search_server import thread_server

from agent_gym.adapters.openai_server import create_chat_app


@pytest.fixture(scope="module")
def url(tiny_model) -> Iterator[str]:
    """Serve the suite's tiny random model; yields the base URL (``.../v1``)."""
    model, tokenizer = tiny_model
    with thread_server(None, app=create_chat_app(model, tokenizer, max_tokens=16)) as base:
        yield f"{base}/v1"


def test_a_chat_completion_has_the_openai_schema_and_is_greedy_at_temperature_zero(url):
    body = {"model": "agent-gym", "messages": [{"role": "user", "content": "who"}], "temperature": 0,
            "max_tokens": 6}
    first, second = (httpx.post(f"{url}/chat/completions", json=body, timeout=60).json() for _ in range(2))
    assert first["object"] == "chat.completion" and first["choices"][0]["message"]["role"] == "assistant"
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["choices"][0]["finish_reason"] in ("stop", "length") and first["usage"]["completion_tokens"] <= 6


def test_the_openai_client_reads_it(url):
    openai = pytest.importorskip("openai")
    body = {"model": "agent-gym", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    reply = openai.OpenAI(base_url=url, api_key="EMPTY").chat.completions.create(**body)
    raw = httpx.post(f"{url}/chat/completions", json=body, timeout=60).json()  # greedy: the same answer
    assert (reply.choices[0].message.content, reply.usage.completion_tokens) == (
        raw["choices"][0]["message"]["content"], raw["usage"]["completion_tokens"])


@pytest.mark.parametrize("body", [{"messages": []}, {"messages": [{"role": "user", "content": "x"}], "n": 2},
                                  {"messages": [{"role": "user", "content": "x"}], "stream": True}])
def test_requests_it_cannot_answer_get_400_with_a_message(url, body):
    answer = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["message"]
