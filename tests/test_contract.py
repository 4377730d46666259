"""The env contract in code: `new_messages` on every env kind, the contract checker, and one EpisodeSummary."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import pytest
from conftest import FACT_TASKS, FactLookup

from agent_gym import register_tool_env
from agent_gym.contract import ContractError, check_tool_env_contract, new_messages
from agent_gym.env import ToolEnv
from agent_gym.episode_summary import EpisodeSummary, is_valid_tool_call, summarize_episodes
from agent_gym.evaluation import run_episode, summarize
from agent_gym.spaces import UnicodeText


def lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


BAD_CALL = f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {}})}</tool_call>"


def started(**kwargs: Any) -> tuple[ToolEnv, dict[str, Any]]:
    env = ToolEnv(list(FACT_TASKS), [FactLookup()], **kwargs)
    _, info = env.reset(seed=0, options={"task_id": "melville-birthplace"})
    return env, info


# ---------------------------------------------------------------------------------------------- new_messages


def test_reset_new_messages_are_the_whole_first_context() -> None:
    _, info = started()
    assert info["new_messages"] == info["messages"] and len(info["messages"]) == 2


def test_step_new_messages_are_what_the_step_appended_after_the_agents_turn() -> None:
    env, before = started()
    _, _, _, _, info = env.step(lookup("Moby Dick"))
    assert info["messages"] == before["messages"] + [info["messages"][2]] + info["new_messages"]
    assert [message["role"] for message in info["new_messages"]] == ["tool"]


def test_a_malformed_turns_new_messages_are_the_envs_feedback() -> None:
    env, _ = started()
    _, _, _, _, info = env.step("no call at all")
    assert len(info["new_messages"]) == 1 and "could not be used" in str(info["new_messages"][0]["content"])


def test_the_answer_step_appends_nothing_after_the_turn() -> None:
    env, _ = started()
    _, _, terminated, _, info = env.step("<answer>New York City</answer>")
    assert terminated and info["new_messages"] == []


def test_a_rewritten_context_still_reports_the_steps_reply_and_ends_with_it() -> None:
    env, _ = started(context="window", window_turns=1)
    env.step(lookup("Moby Dick"))
    _, _, _, _, info = env.step(lookup("Herman Melville"))
    assert info["context_rewritten"] is True
    assert info["messages"][-len(info["new_messages"]):] == info["new_messages"]
    assert "New York City" in str(info["new_messages"][0]["content"])


def test_truncate_reports_no_new_messages() -> None:
    env, _ = started()
    env.step(lookup("Moby Dick"))
    _, info = env.truncate()
    assert info["new_messages"] == []


def test_the_native_vector_env_reports_each_envs_new_messages() -> None:
    register_tool_env("TestContractFacts-v0", tools=[FactLookup()], tasks=list(FACT_TASKS), max_turns=3)
    try:
        envs = gym.make_vec("TestContractFacts-v0", num_envs=2)
        _, reset_infos = envs.reset(seed=0)
        _, _, _, _, infos = envs.step([lookup("France"), "no call"])
    finally:
        gym.registry.pop("TestContractFacts-v0", None)
    assert [list(messages) for messages in reset_infos["new_messages"]] == [list(m) for m in reset_infos["messages"]]
    assert [len(messages) for messages in infos["new_messages"]] == [1, 1]
    assert "Paris" in str(infos["new_messages"][0][0]["content"])


def test_an_env_without_the_key_gets_the_messages_after_its_last_assistant_turn() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "A"}, {"role": "tool", "content": "R"}]
    assert new_messages({"messages": messages}) == [messages[-1]]
    assert new_messages({"messages": messages[:2]}) == messages[:2]  # a reset: the whole first context


# ---------------------------------------------------------------------------------------------- the checker


class ScriptedEnv(gym.Env):
    """A minimal env of the contract; each flag breaks one rule."""

    metadata = {"render_modes": []}

    def __init__(self, *, drop_new_messages: bool = False, wrong_new_messages: bool = False,
                 drop_assistant: bool = False, text_reward: bool = False, no_reset_messages: bool = False,
                 score_in_terms: bool = False) -> None:
        self.observation_space = UnicodeText(max_length=1000)
        self.action_space = UnicodeText(max_length=1000)
        self.flags = dict(drop_new_messages=drop_new_messages, wrong_new_messages=wrong_new_messages,
                          drop_assistant=drop_assistant, text_reward=text_reward, no_reset_messages=no_reset_messages,
                          score_in_terms=score_in_terms)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.messages = [{"role": "user", "content": "Q?"}]
        if self.flags["no_reset_messages"]:
            return "Q?", {}
        return "Q?", {"messages": list(self.messages), "new_messages": list(self.messages)}

    def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]:
        reply = [{"role": "tool", "content": "R"}]
        if not self.flags["drop_assistant"]:
            self.messages.append({"role": "assistant", "content": action})
        self.messages.extend(reply)
        info: dict[str, Any] = {"messages": list(self.messages), "new_messages": reply, "context_rewritten": False,
                                "reward_terms": {"outcome": 0.0}, "reward_scores": {"em": 1.0}}
        if self.flags["score_in_terms"]:  # a reported score filed among the paid terms: they no longer sum
            info["reward_terms"] = {"outcome": 0.0, "em": 1.0}
        if self.flags["drop_new_messages"]:
            del info["new_messages"]
        if self.flags["wrong_new_messages"]:
            info["new_messages"] = reply * 2
        return "R", "0.0" if self.flags["text_reward"] else 0.0, len(self.messages) > 4, False, info


def test_the_checker_passes_a_conforming_env() -> None:
    check_tool_env_contract(ScriptedEnv())


@pytest.mark.parametrize(("flag", "message"), [
    ("drop_new_messages", "no 'new_messages'"),
    ("wrong_new_messages", "must be what the step appended"),
    ("drop_assistant", "append the agent's turn"),
    ("text_reward", "reward must be a number"),
    ("no_reset_messages", "no 'messages'"),
    ("score_in_terms", "sum to .* not to the step's reward"),
])
def test_the_checker_names_the_rule_a_broken_env_breaks(flag: str, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        check_tool_env_contract(ScriptedEnv(**{flag: True}))


def test_the_checker_passes_tool_envs_of_every_context_policy() -> None:
    for context in ("append", "window", "summarize"):
        env = ToolEnv(list(FACT_TASKS), [FactLookup()], context=context, window_turns=1, max_turns=4)
        check_tool_env_contract(env, actions=[lookup("Moby Dick"), lookup("Herman Melville"), "no call"])


# ---------------------------------------------------------------------------------------------- EpisodeSummary


@pytest.mark.parametrize(("record", "valid"), [
    ({"ok": True, "error": None}, True),
    ({"ok": True, "error": "timed out"}, False),
    ({"ok": False, "error": "unknown tool"}, False),
    ({"error": None}, False),
    ("not a record", False),
])
def test_a_valid_tool_call_is_one_that_ran_without_error(record: Any, valid: bool) -> None:
    assert is_valid_tool_call(record) is valid


def test_tool_call_validity_pools_calls_over_episodes() -> None:
    many = EpisodeSummary(tool_calls=3, valid_tool_calls=3)
    one = EpisodeSummary(tool_calls=1, valid_tool_calls=0)
    none = EpisodeSummary()
    assert summarize_episodes([many, one, none])["tool_call_validity"] == 0.75


def test_a_metric_no_episode_reports_is_left_out() -> None:
    metrics = summarize_episodes([EpisodeSummary(reward=1.0, turns=2)])
    assert "em" not in metrics and "tool_call_validity" not in metrics and metrics["reward"] == 1.0


class Scripted:
    def __init__(self, turns: list[str]) -> None:
        self.turns = turns

    def act(self, observation: str, info: dict) -> str:
        return self.turns[int(info.get("turn", 0))]


def test_evaluation_and_the_summary_of_a_steps_infos_count_the_same_calls() -> None:
    turns = [lookup("Moby Dick") + BAD_CALL, lookup("Herman Melville"), "<answer>New York City</answer>"]
    env = ToolEnv(list(FACT_TASKS), [FactLookup()])
    record = run_episode(env, Scripted(turns), seed=0, options={"task_id": "melville-birthplace"})
    _, info = env.reset(seed=0, options={"task_id": "melville-birthplace"})
    summary = EpisodeSummary.from_reset(info)
    for turn in turns:
        _, reward, terminated, truncated, info = env.step(turn)
        summary.add_step(reward, terminated, truncated, info)
    assert (record.tool_calls, record.valid_tool_calls) == (summary.tool_calls, summary.valid_tool_calls) == (3, 2)
    assert summarize([record])["tool_call_validity"] == summarize_episodes([summary])["tool_call_validity"] == 2 / 3
    assert (summary.em, summary.terminated, summary.turns) == (1.0, True, 3)
