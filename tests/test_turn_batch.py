"""The one step path: `step_turns` plays a batch of turns; a step validates each call once; evidence comes from
the tool's hook; `truncate()` pays what the env's own turn limit pays."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from conftest import FACT_TASKS, FactLookup

import agent_gym.env
import agent_gym.tools.core
from agent_gym.env import ToolEnv, step_turns
from agent_gym.tools import ToolResult


def lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


def started(env: ToolEnv, task_id: str = "capital-france") -> ToolEnv:
    env.reset(seed=0, options={"task_id": task_id})
    return env


def test_step_turns_sends_the_calls_of_every_env_to_a_shared_tool_as_one_batch() -> None:
    shared = FactLookup()
    envs = [started(ToolEnv(list(FACT_TASKS), [shared])) for _ in range(3)]
    step_turns(envs, [lookup("France") + lookup("Japan"), lookup("Moby Dick"), "no call at all"])
    assert shared.batches == [3]


def test_step_turns_gives_each_env_what_its_own_step_gives() -> None:
    actions = [lookup("Japan"), lookup("France"), "<answer>Paris</answer>"]
    batched = step_turns([started(ToolEnv(list(FACT_TASKS), [FactLookup()])) for _ in actions], actions)
    alone = [started(ToolEnv(list(FACT_TASKS), [FactLookup()])).step(action) for action in actions]
    assert [step[:4] for step in batched] == [step[:4] for step in alone]
    assert [step[4]["messages"] for step in batched] == [step[4]["messages"] for step in alone]


def test_step_turns_needs_one_action_per_env() -> None:
    with pytest.raises(ValueError, match="2 envs and 1 actions"):
        step_turns([started(ToolEnv(list(FACT_TASKS), [FactLookup()])) for _ in range(2)], ["x"])


def test_a_step_validates_each_calls_arguments_once(monkeypatch) -> None:
    checked: list[object] = []
    validate = agent_gym.tools.core.validate_arguments

    def counting(schema, arguments):
        checked.append(arguments)
        return validate(schema, arguments)

    monkeypatch.setattr(agent_gym.env, "validate_arguments", counting)
    monkeypatch.setattr(agent_gym.tools.core, "validate_arguments", counting)
    started(ToolEnv(list(FACT_TASKS), [FactLookup()])).step(lookup("France") + lookup("Japan"))
    assert checked == [{"title": "France"}, {"title": "Japan"}]


class _EvidenceInText(FactLookup):
    """Reports its evidence through the hook only; its results carry no metadata at all."""

    def run(self, title: str) -> ToolResult:
        return ToolResult(text=f"Entry: {title}")

    def evidence(self, result: ToolResult) -> list[str]:
        return [result.text.removeprefix("Entry: ")]


def test_process_reward_and_evidence_recall_read_the_tools_evidence_hook() -> None:
    env = started(ToolEnv(list(FACT_TASKS), [_EvidenceInText()], reward="dense"), "melville-birthplace")
    _, reward, *_, info = env.step(lookup("Moby Dick"))
    assert reward == pytest.approx(0.1) and info["evidence_recall"] == 0.5


def test_a_tool_without_the_evidence_hook_earns_no_evidence_reward() -> None:
    class Untold(FactLookup):
        def evidence(self, result: ToolResult) -> list[str]:
            return []

    _, reward, *_, info = started(ToolEnv(list(FACT_TASKS), [Untold()], reward="dense")).step(lookup("France"))
    assert reward == 0.0 and info["evidence_recall"] == 0.0


def test_truncate_pays_what_the_envs_own_turn_limit_pays() -> None:
    actions = [lookup("France"), "not a tool call"]
    own_limit = started(ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=2))
    limited = [own_limit.step(action) for action in actions]
    cut = started(ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=8))
    unlimited = [cut.step(action) for action in actions]
    reward, info = cut.truncate()
    assert unlimited[-1][1] + reward == pytest.approx(limited[-1][1])
    # Agent-R1 Eq. 6: format score - 1, with 1 well-formed turn of 3 (the missing answer counts as malformed)
    assert reward == pytest.approx(1 / 3 - 1.0)
    ours, theirs = info["reward_components"], limited[-1][4]["reward_components"]
    assert {key: ours[key] for key in ("outcome", "format_score", "em", "f1")} == {
        key: theirs[key] for key in ("outcome", "format_score", "em", "f1")
    }
    assert (info["answer"], info["gold_answers"]) == (None, ["Paris"])


def test_truncate_ends_the_episode() -> None:
    env = started(ToolEnv(list(FACT_TASKS), [FactLookup()]))
    env.truncate()
    with pytest.raises(gym.error.ResetNeeded):
        env.step(lookup("France"))
    with pytest.raises(gym.error.ResetNeeded):
        env.truncate()
