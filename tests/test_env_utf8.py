"""Text that leaves the env is valid UTF-8: JSON escapes in an action (``"\\ud800"``) and tool output cannot put
lone surrogates into the observation, ``info`` or the context, so results can be written and sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import FACT_TASKS, FactLookup

from agent_gym.env import ToolEnv
from agent_gym.tools import ToolResult


def _utf8(value: Any) -> bytes:
    """``value`` as UTF-8 JSON: raises UnicodeEncodeError on a lone surrogate, as eval's JSONL writer does."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _play(env: ToolEnv, action: str) -> tuple:
    env.reset(seed=0, options={"task_id": "capital-france"})
    return env.step(action)


def test_openai_answer_with_an_escaped_lone_surrogate_leaves_valid_utf8() -> None:
    env = ToolEnv(list(FACT_TASKS), [FactLookup()], tool_format="openai")
    observation, _, terminated, _, info = _play(env, '{"content": "<answer>\\ud800</answer>"}')
    assert terminated and info["answer"] == "?"
    _utf8([observation, info])


@pytest.mark.parametrize(
    ("tool_format", "action"),
    [
        ("hermes", '<tool_call>{"name": "lookup", "arguments": {"title": "Fr\\udfffance"}}</tool_call>'),
        ("hermes", '<tool_call>{"name": "look\\ud800up", "arguments": {"title": "x"}}</tool_call>'),
        ("openai", '{"tool_calls": [{"id": "c\\ud800", "function": {"name": "lookup", '
                   '"arguments": "{\\"title\\": \\"\\\\ud800\\"}"}}]}'),
    ],
    ids=["hermes-argument", "hermes-name", "openai-nested-arguments"],
)
def test_escaped_lone_surrogates_in_tool_calls_leave_valid_utf8(tool_format: str, action: str) -> None:
    lookup = FactLookup()
    env = ToolEnv(list(FACT_TASKS), [lookup], tool_format=tool_format)
    observation, _, _, _, info = _play(env, action)
    _utf8([observation, info])


def test_a_tool_result_with_a_lone_surrogate_leaves_valid_utf8() -> None:
    class Garbled(FactLookup):
        def run(self, title: str) -> ToolResult:
            return ToolResult(text="bytes \udcff from a program", metadata={"titles": []})

    env = ToolEnv(list(FACT_TASKS), [Garbled()])
    observation, _, _, _, info = _play(env, '<tool_call>{"name": "lookup", "arguments": {"title": "x"}}</tool_call>')
    assert "bytes ? from a program" in observation
    _utf8([observation, info])


def test_a_remote_episode_with_an_escaped_lone_surrogate_completes() -> None:
    pytest.importorskip("fastapi")
    from test_search_server import thread_server

    from agent_gym.adapters.openenv import RemoteEnv
    from agent_gym.adapters.openenv_server import create_env_app

    app = create_env_app(lambda: ToolEnv(list(FACT_TASKS), [FactLookup()], tool_format="openai"))
    with thread_server(None, app=app) as url:
        remote = RemoteEnv(url)
        remote.reset(seed=0, options={"task_id": "capital-france"})
        _, reward, terminated, _, info = remote.step('{"content": "<answer>\\ud800</answer>"}')
        remote.close()
    assert terminated and info["answer"] == "?" and reward <= 0
