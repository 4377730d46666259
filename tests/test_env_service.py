"""The OpenEnv server's parts without HTTP: ``EnvService``'s routes, the session table and ``answer_message``,
called directly.

tests/test_adapter_openenv.py and tests/test_env_server_hardening.py test the same server over real sockets.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.adapters.openenv_server import EnvService, _Error, _Session, _SessionTable, answer_message
from agent_gym.error import InvalidValue

SMALL = {"hops": 1, "num_pages": 200, "num_questions": 10}


def _factory() -> gym.Env:
    return gym.make("AgentR1-SynthHop-v0", **SMALL)


@pytest.fixture(scope="module")
def service() -> EnvService:
    return EnvService(_factory, name="synthhop", max_sessions=2, max_idle_connections=8)


def _refused(call) -> _Error:  # noqa: ANN001
    with pytest.raises(_Error) as caught:
        call()
    return caught.value


def test_the_settings_are_checked_before_any_env_is_made():
    def never() -> gym.Env:
        raise AssertionError("made an env")

    for settings in ({"max_sessions": 0}, {"idle_timeout_s": 0}, {"max_message_bytes": 100},
                     {"max_idle_connections": 0}):
        with pytest.raises(InvalidValue):
            EnvService(never, **settings)


def test_health_metadata_and_schema_describe_the_env_and_the_limits(service):
    assert service.health() == {"status": "healthy", "active_sessions": 0, "max_sessions": 2}
    metadata = service.metadata()
    assert metadata["name"] == "synthhop" and metadata["max_idle_connections"] == 8
    assert metadata["action_max_length"] == service.action_length is not None
    assert service.schema()["action"]["properties"]["text"]["maxLength"] == service.action_length


def test_http_reset_answers_an_observation_or_a_4xx(service):
    status, payload = service.reset(b'{"seed": 3}')
    assert status == 200 and payload["done"] is False and payload["observation"]["text"]
    assert service.reset(b"")[0] == 200  # no body: no seed
    assert service.reset(b"{not json")[0] == 422
    assert service.reset(b"[1]") == (422, {"error": 'the body must be a JSON object such as {"seed": 0}'})
    assert service.reset(b'{"seed": -1}')[0] == 422
    assert service.reset(b'{"options": {"task_id": "no-such-task"}}')[0] == 400
    assert service.step()[0] == 409


def test_the_session_table_holds_at_most_max_sessions():
    table = _SessionTable(2)
    first, second = table.reserve(), table.reserve()
    assert (first, second, table.reserve(), len(table)) == (1, 2, None, 2)
    table.release(first)
    assert table.reserve() == 3  # ids are never reused


def test_messages_are_answered_in_order_and_malformed_ones_refused():
    session = _Session(_factory(), 1)
    try:
        assert _refused(lambda: answer_message(session, None)).code == "INVALID_JSON"  # a binary frame
        assert _refused(lambda: answer_message(session, "{")).code == "INVALID_JSON"
        assert _refused(lambda: answer_message(session, '{"type": "dance"}')).code == "UNKNOWN_TYPE"
        assert _refused(lambda: answer_message(session, '{"type": "step", "data": []}')).code == "VALIDATION_ERROR"
        step = json.dumps({"type": "step", "data": {"text": "<answer>x</answer>"}})
        assert _refused(lambda: answer_message(session, step)).code == "EXECUTION_ERROR"  # before reset
        reset = answer_message(session, json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert reset["type"] == "observation" and reset["data"]["reward"] is None
        stepped = answer_message(session, step)
        assert stepped["data"]["done"] is True and stepped["data"]["observation"]["terminated"] is True
        state = answer_message(session, '{"type": "state"}')
        assert state["type"] == "state" and state["data"]["step_count"] == 1
        assert answer_message(session, '{"type": "close"}') is None
    finally:
        session.env.close()
