"""The env contract of docs/DESIGN.md §2 in code: the info keys, their types, and a checker that holds an env to them.

Every consumer of an env (the rollout collector, evaluation, the adapters) reads ``info`` through the names
below, so a key means one thing everywhere. The one derived key is ``new_messages``: the messages a step
appended after the agent's turn (tool results, feedback on a malformed turn), or on reset the whole first
context. A consumer that extends its own copy of the context appends ``new_messages``; when the env rewrote its
context (``context_rewritten``), it starts again from ``messages``.

:func:`check_tool_env_contract` plays a few steps of an env and raises :class:`ContractError` on the first
broken rule, as Gymnasium's ``check_env`` does for the Gymnasium API (run both: Gymnasium's checks the spaces and
the seeding, ours the info keys).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from agent_gym.error import AgentGymError

__all__ = [
    "ANSWER", "CHECK", "CONTEXT_REWRITTEN", "EVIDENCE_RECALL", "FORMAT_ERRORS", "GOLD_ANSWERS", "IGNORED_TOOL_CALLS",
    "INFO_KEYS", "MESSAGES", "NEW_MESSAGES", "REWARD_COMPONENTS", "REWARD_SCORES", "REWARD_SPEC", "REWARD_TERMS",
    "STOP_STRINGS", "TASK_FIELDS", "TASK_ID", "TOOLS", "TOOL_CALLS", "TOOL_FORMAT", "TURN", "ChatMessage",
    "ContractError", "ResetInfo", "StepInfo", "ToolCallRecord", "check_reset_info", "check_step_info",
    "check_tool_env_contract", "new_messages", "reward_split",
]

# --- keys of every info (reset and step) ---
MESSAGES = "messages"  # the full context for the next turn, OpenAI chat format
NEW_MESSAGES = "new_messages"  # the messages this step appended after the agent's turn (reset: the first context)
CONTEXT_REWRITTEN = "context_rewritten"  # the context policy rewrote `messages` this step
TASK_ID = "task_id"
TURN = "turn"
# The reward of a step, in two dicts: the terms PAID (their sum is the step's reward, exactly) and the scores only
# REPORTED (format, format_score, em, f1, ...: measured, logged, never added to the reward).
REWARD_TERMS = "reward_terms"
REWARD_SCORES = "reward_scores"
# Deprecated, kept for one release for the readers of its old keys: the two dicts above merged into one, so its
# sum is NOT the reward. Read `reward_terms` / `reward_scores` (or `reward_split(info)` for any env).
REWARD_COMPONENTS = "reward_components"
TOOL_CALLS = "tool_calls"  # the calls parsed and run this step, each with `ok` and `error`
EVIDENCE_RECALL = "evidence_recall"  # tasks with supporting titles only
# --- keys of reset's info ---
TOOLS = "tools"  # OpenAI-style schemas of the available tools
TOOL_FORMAT = "tool_format"
STOP_STRINGS = "stop_strings"
REWARD_SPEC = "reward_spec"
# the task's kind and its scalar metadata (e.g. SynthHop's {"kind": "bridge", "hops": 2}): what a trainer may
# balance or break metrics down by (TrainConfig.balance_by)
TASK_FIELDS = "task_fields"
# --- keys of a step's info ---
FORMAT_ERRORS = "format_errors"
IGNORED_TOOL_CALLS = "ignored_tool_calls"  # calls a turn made beside its final answer (not run)
# --- keys of the info that ends an episode ---
ANSWER = "answer"
GOLD_ANSWERS = "gold_answers"
CHECK = "check"  # a tool task checker's details

#: every info key above; tests/test_contract_keys.py fails on a literal one used as an info key outside this module
INFO_KEYS = frozenset({
    MESSAGES, NEW_MESSAGES, CONTEXT_REWRITTEN, TASK_ID, TURN, REWARD_TERMS, REWARD_SCORES, REWARD_COMPONENTS,
    TOOL_CALLS, EVIDENCE_RECALL, TOOLS, TOOL_FORMAT, STOP_STRINGS, REWARD_SPEC, TASK_FIELDS, FORMAT_ERRORS,
    IGNORED_TOOL_CALLS, ANSWER, GOLD_ANSWERS, CHECK,
})


class ChatMessage(TypedDict, total=False):
    """One message of the context (OpenAI chat format; ``tool_calls`` in the ``openai`` wire format)."""

    role: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    name: str


class ToolCallRecord(TypedDict, total=False):
    """What ``info["tool_calls"]`` says of one call."""

    name: str
    arguments: dict[str, Any]
    id: str | None
    error: str | None  # why it did not run, or the tool's error message
    ok: bool  # it parsed, its arguments were valid, and the tool ran without error
    result_chars: int
    hits: list[dict[str, Any]]  # a search's structured hits (doc_id, title, text, score), in rank order


class StepInfo(TypedDict, total=False):
    """The info of ``step`` (and, less the step keys, of ``reset``)."""

    messages: list[ChatMessage]
    new_messages: list[ChatMessage]
    context_rewritten: bool
    task_id: str
    turn: int
    reward_terms: dict[str, float]
    reward_scores: dict[str, float]
    reward_components: dict[str, float]  # deprecated: reward_terms and reward_scores merged
    tool_calls: list[ToolCallRecord]
    format_errors: list[str]
    ignored_tool_calls: int
    evidence_recall: float
    answer: str | None
    gold_answers: list[str]
    check: dict[str, Any]


class ResetInfo(StepInfo, total=False):
    """The info of ``reset``: the step keys, plus what a policy needs once per episode."""

    tools: list[dict[str, Any]]
    tool_format: str
    stop_strings: list[str]
    reward_spec: str
    task_fields: dict[str, str | int | float | bool]


class ContractError(AgentGymError, ValueError):
    """An env's reset or step broke the env contract (docs/DESIGN.md §2); the message says which rule."""


def reward_split(info: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """``(paid terms, reported scores)`` of a step's ``info``.

    ``info["reward_terms"]`` and ``info["reward_scores"]`` where the env gives them; an env written before them
    gives one mixed ``reward_components`` dict, returned whole as scores (nothing in it is known to be paid).
    """
    terms = info.get(REWARD_TERMS)
    if terms is not None:
        return dict(terms), dict(info.get(REWARD_SCORES) or {})
    return {}, dict(info.get(REWARD_COMPONENTS) or {})


def new_messages(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The messages the step (or reset) of ``info`` appended to the context.

    ``info["new_messages"]`` where the env gives it. An env written before that key gets the messages after
    the last assistant message of ``info["messages"]`` (all of them after a reset): the same list, for an env
    that appends.
    """
    given = info.get(NEW_MESSAGES)
    if given is not None:
        return list(given)
    messages = list(info.get(MESSAGES) or [])
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return messages[index + 1 :]
    return messages


# ---------------------------------------------------------------------------------------------- checks


def _check_messages(value: Any, key: str, *, non_empty: bool) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        raise ContractError(f"info[{key!r}] must be a list of chat messages, got {type(value).__name__}")
    if non_empty and not value:
        raise ContractError(f"info[{key!r}] is empty; it must hold the context (at least the task prompt)")
    for index, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ContractError(f"info[{key!r}][{index}] must be a dict with a str 'role', got {message!r:.80}")
    return value


def _check_common(info: Any, *, require_new_messages: bool) -> Mapping[str, Any]:
    if not isinstance(info, Mapping):
        raise ContractError(f"info must be a dict, got {type(info).__name__}")
    if MESSAGES not in info:
        raise ContractError("info has no 'messages': the env must hand the agent its context (docs/DESIGN.md §2)")
    _check_messages(info[MESSAGES], MESSAGES, non_empty=True)
    if NEW_MESSAGES in info:
        _check_messages(info[NEW_MESSAGES], NEW_MESSAGES, non_empty=False)
    elif require_new_messages:
        raise ContractError("info has no 'new_messages': the messages this step appended after the agent's turn")
    if CONTEXT_REWRITTEN in info and not isinstance(info[CONTEXT_REWRITTEN], bool):
        raise ContractError(f"info['context_rewritten'] must be a bool, got {info[CONTEXT_REWRITTEN]!r:.80}")
    for key in (REWARD_TERMS, REWARD_SCORES, REWARD_COMPONENTS):
        components = info.get(key)
        if components is not None and (not isinstance(components, Mapping) or not all(
                isinstance(name, str) and isinstance(value, numbers.Real) for name, value in components.items())):
            raise ContractError(f"info[{key!r}] must map names to numbers, got {components!r:.120}")
    return info


def check_reset_info(info: Any, *, require_new_messages: bool = True) -> None:
    """Raise :class:`ContractError` unless ``info`` is a valid reset info (its ``new_messages`` is its
    ``messages``: the whole first context)."""
    _check_common(info, require_new_messages=require_new_messages)
    if NEW_MESSAGES in info and list(info[NEW_MESSAGES]) != list(info[MESSAGES]):
        raise ContractError("reset's info['new_messages'] must be the whole first context, info['messages']")
    tools = info.get(TOOLS)
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(item, Mapping) for item in tools)):
        raise ContractError(f"info['tools'] must be a list of tool schemas (dicts), got {tools!r:.120}")
    stops = info.get(STOP_STRINGS)
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(item, str) for item in stops)):
        raise ContractError(f"info['stop_strings'] must be a list of str, got {stops!r:.120}")


def check_step_info(info: Any, previous_messages: Sequence[Mapping[str, Any]] | None = None, *,
                    require_new_messages: bool = True) -> None:
    """Raise :class:`ContractError` unless ``info`` is a valid step info.

    With ``previous_messages`` (the context the step started from) and no context rewrite, ``messages`` must be
    that context, the agent's turn (an assistant message), then ``new_messages``.
    """
    _check_common(info, require_new_messages=require_new_messages)
    calls = info.get(TOOL_CALLS)
    if calls is not None:
        if not isinstance(calls, list):
            raise ContractError(f"info['tool_calls'] must be a list, got {type(calls).__name__}")
        for index, call in enumerate(calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("ok"), bool):
                raise ContractError(f"info['tool_calls'][{index}] must be a dict with a bool 'ok', got {call!r:.80}")
    if previous_messages is None or info.get(CONTEXT_REWRITTEN):
        return
    messages, previous = list(info[MESSAGES]), list(previous_messages)
    appended = new_messages(info)
    turn = len(previous)
    if messages[:turn] != previous or len(messages) <= turn or messages[turn].get("role") != "assistant":
        raise ContractError("a step without a context rewrite must keep the context and append the agent's turn as "
                            "an assistant message; set info['context_rewritten'] = True when the env rewrites it")
    if messages[turn + 1 :] != appended:
        raise ContractError(f"info['new_messages'] ({len(appended)} messages) must be what the step appended after "
                            f"the agent's turn ({len(messages) - turn - 1} messages in info['messages'])")


_DEFAULT_ACTIONS = ("I will look this up.", "<answer>I do not know</answer>")


def check_tool_env_contract(env: Any, *, seed: int = 0, actions: Sequence[str] = _DEFAULT_ACTIONS,
                            max_steps: int = 4) -> None:
    """Play one short episode of ``env`` and raise :class:`ContractError` on the first broken rule of docs/DESIGN.md §2.

    Checks: text spaces that hold the observations; ``reset`` and ``step`` return shapes and types; every info
    key above that is present has its type; ``new_messages`` is what each step appended; a seeded reset repeats
    its first context. ``actions`` are played in turn (the last one repeats) for at most ``max_steps`` steps.
    """
    import gymnasium as gym

    for name in ("observation_space", "action_space"):
        if not isinstance(getattr(env, name, None), gym.spaces.Space):
            raise ContractError(f"env.{name} must be a gymnasium Space (agent_gym.spaces.UnicodeText)")
    first = _checked_reset(env, seed)
    again = _checked_reset(env, seed)
    if (first[0], first[1][MESSAGES]) != (again[0], again[1][MESSAGES]):
        raise ContractError(f"reset(seed={seed}) twice gave two first contexts; a seeded reset must repeat")
    previous = list(again[1][MESSAGES])
    for step in range(max_steps):
        action = actions[min(step, len(actions) - 1)]
        result = env.step(action)
        if not isinstance(result, tuple) or len(result) != 5:
            raise ContractError("step must return (observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = result
        if not isinstance(observation, str) or not env.observation_space.contains(observation):
            raise ContractError(f"step's observation must be a str within observation_space, got {observation!r:.80}")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise ContractError(f"step's reward must be a number, got {reward!r:.80}")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            raise ContractError(f"terminated and truncated must be bools, got {terminated!r} and {truncated!r}")
        check_step_info(info, previous)
        _check_paid(reward, info)
        if terminated or truncated:
            return
        previous = list(info[MESSAGES])


def _check_paid(reward: float, info: Mapping[str, Any]) -> None:
    """The paid terms of ``info`` (when it names them) sum to the step's reward."""
    terms = info.get(REWARD_TERMS)
    if terms is not None and not math.isclose(sum(terms.values()), reward, rel_tol=1e-9, abs_tol=1e-9):
        raise ContractError(f"info['reward_terms'] {dict(terms)!r:.120} sum to {sum(terms.values())}, not to the "
                            f"step's reward {reward}: every paid term belongs there, and only those")


def _checked_reset(env: Any, seed: int) -> tuple[str, Mapping[str, Any]]:
    result = env.reset(seed=seed)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ContractError("reset must return (observation, info)")
    observation, info = result
    if not isinstance(observation, str) or not env.observation_space.contains(observation):
        raise ContractError(f"reset's observation must be a str within observation_space, got {observation!r:.80}")
    check_reset_info(info)
    return observation, info
