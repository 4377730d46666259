"""Fixed-space view of a text tool env, for RL libraries that need Box observations and Discrete actions
(Stable-Baselines3, CleanRL-style code).

The wrapper reads candidate spans (capitalised phrases and numbers) from the question and the latest tool
result, and offers a fixed menu of actions over them: search candidate *i*, answer candidate *i*, or search the
whole question. Each slot is described by a few features (where the span came from, its type, whether it is a
retrieved page's title), so a small MLP policy can learn which span to look up and which to answer. The text env
underneath is unchanged: actions are rendered in its own wire format and its rewards pass through.

It drives one tool: ``search`` if the env has one, else its first tool, which must take a single string
argument (the span); an env whose tool needs more is refused at construction. ``reset`` passes ``options``
through, so ``options={"task_index": i}`` (task ``i`` of the env's list, modulo its length) or
``{"task_id": ...}`` pick the episode's task, as ``benchmarks/sb3_synthhop.py`` does for held-out evaluation.

``CandidateActionWrapper.make(ID, **kwargs)`` (or a factory) builds it from an env id, as the other adapters do.

``action_masks()`` marks the actions that name a filled slot, so sb3-contrib's ``MaskablePPO`` never spends a step
on an empty one (tested with sb3-contrib 2.9).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np

from agent_gym.contract import TOOL_CALLS, TURN
from agent_gym.env import ToolEnv
from agent_gym.error import InvalidType, InvalidValue
from agent_gym.formats import ToolCall
from agent_gym.make import EnvSource, make_env
from agent_gym.policies import candidate_spans

__all__ = ["CandidateActionWrapper"]

_NUMERIC_QUESTION = re.compile(r"\b(when|year|how many|how much|population|earlier|first|older)\b", re.I)
_SLOT_FEATURES = 6  # present, from question, from latest result, is number, is a hit's title, rank in result


class CandidateActionWrapper(gym.Wrapper):
    """Box observations and Discrete actions over ``num_candidates`` candidate spans.

    Actions: ``i < K`` searches candidate ``i``; ``K <= i < 2K`` answers candidate ``i - K``; ``2K`` searches
    the whole question. Choosing an empty slot is a malformed turn (the env's format penalty applies); an action
    outside ``Discrete(2K + 1)`` raises ``ValueError`` (``TypeError`` if it is not an integer).
    """

    def __init__(self, env: gym.Env, num_candidates: int = 8) -> None:
        super().__init__(env)
        tool_env = env.unwrapped
        if not isinstance(tool_env, ToolEnv):
            raise InvalidType(f"CandidateActionWrapper wraps a ToolEnv, got {type(tool_env).__name__}")
        if num_candidates < 1:
            raise InvalidValue(f"num_candidates must be at least 1, got {num_candidates}")
        self._search_tool, self._argument = _driven_tool(tool_env)
        self.num_candidates = num_candidates
        size = num_candidates * _SLOT_FEATURES + 3  # + turn fraction, numeric question, searched-question flag
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2 * num_candidates + 1)
        self._candidates: list[str] = []
        self._turn = 0

    @classmethod
    def make(cls, env: EnvSource, num_candidates: int = 8, **env_kwargs: Any) -> CandidateActionWrapper:
        """The wrapper over an env id (``gymnasium.make`` kwargs in ``env_kwargs``), a factory, or an env, which
        must be a ``ToolEnv`` underneath (actions are rendered in its wire format)."""
        return cls(make_env(env, env_kwargs), num_candidates=num_candidates)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = self.env.reset(seed=seed, options=options)
        self._question = observation
        self._searched_question = False
        self._turn = int(info.get(TURN, 0))
        self._refresh("", {})
        return self._features(), info

    def step(self, action: int):
        tool_env: ToolEnv = self.env.unwrapped
        action = self._checked(action)
        k = self.num_candidates
        search_tool, argument = self._search_tool, self._argument
        if action == 2 * k:
            self._searched_question = True
            text = tool_env.tool_format.render_call(ToolCall(search_tool, {argument: self._question}))
        elif action < len(self._candidates):
            text = tool_env.tool_format.render_call(ToolCall(search_tool, {argument: self._candidates[action]}))
        elif k <= action < k + len(self._candidates):
            text = tool_env.tool_format.render_answer(self._candidates[action - k])
        else:
            text = ""  # an empty slot: the env reports a malformed turn
        observation, reward, terminated, truncated, info = self.env.step(text)
        self._turn = int(info.get(TURN, self._turn + 1))  # the contract's info["turn"], not the env's private state
        if observation:
            self._refresh(observation, info)
        return self._features(), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Which actions are valid now: searching or answering a filled slot, or searching the question.

        sb3-contrib's ``MaskablePPO`` calls this each step (its ``ActionMasker`` protocol).
        """
        k, filled = self.num_candidates, len(self._candidates)
        mask = np.zeros(2 * k + 1, dtype=bool)
        mask[:filled] = True
        mask[k : k + filled] = True
        mask[2 * k] = True
        return mask

    def _checked(self, action: Any) -> int:
        """The action as an int, or a clear error (a negative int must not index from the end)."""
        k = self.num_candidates
        expected = (f"action must be an integer in [0, {2 * k}] (Discrete({2 * k + 1}): 0..{k - 1} search "
                    f"candidate i, {k}..{2 * k - 1} answer candidate i - {k}, {2 * k} search the question)")
        value = action.item() if isinstance(action, np.ndarray) and action.size == 1 else action
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidType(f"{expected}, got {type(action).__name__} {action!r}")
        if not 0 <= value <= 2 * k:
            raise InvalidValue(f"{expected}, got {value}")
        return value

    def _refresh(self, result_text: str, info: dict[str, Any]) -> None:
        from_result = candidate_spans(result_text)
        question_spans = set(candidate_spans(self._question))
        ordered = [span for span in from_result if span not in question_spans]
        ordered += [span for span in candidate_spans(self._question) if span not in ordered]
        self._candidates = ordered[: self.num_candidates]
        self._question_spans = question_spans
        self._result_rank = {span: rank for rank, span in enumerate(from_result)}
        self._titles = {hit["title"] for call in info.get(TOOL_CALLS) or () for hit in call.get("hits") or ()}

    def _features(self) -> np.ndarray:
        tool_env: ToolEnv = self.env.unwrapped
        features = np.zeros(self.observation_space.shape, dtype=np.float32)
        for slot, span in enumerate(self._candidates):
            rank = self._result_rank.get(span)
            features[slot * _SLOT_FEATURES : (slot + 1) * _SLOT_FEATURES] = (
                1.0,
                float(span in self._question_spans),
                float(rank is not None),
                float(span[0].isdigit()),
                float(span in self._titles),
                0.0 if rank is None else 1.0 / (1.0 + rank),
            )
        features[-3] = min(1.0, self._turn / tool_env.max_turns)
        features[-2] = float(bool(_NUMERIC_QUESTION.search(self._question)))
        features[-1] = float(self._searched_question)
        return features


def _driven_tool(env: ToolEnv) -> tuple[str, str]:
    """(tool name, its argument): ``search`` if present, else the first tool; it must take one string."""
    name = "search" if "search" in env.tools else next(iter(env.tools))
    schema = env.tools[name].parameters
    properties = schema.get("properties", {})
    required = list(schema.get("required") or [])
    argument = (required or list(properties))[0] if properties else None
    if argument is None or len(required) > 1 or properties.get(argument, {}).get("type", "string") != "string":
        raise InvalidValue(
            f"CandidateActionWrapper drives a tool that takes one string argument (the candidate span); "
            f"{name!r} takes {', '.join(properties) or 'none'}. Give the env a `search` tool, or wrap an env "
            "whose first tool takes a single string"
        )
    return name, argument
