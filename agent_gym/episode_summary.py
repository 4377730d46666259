"""What one episode was, read from its infos, and the one metric vocabulary of many episodes.

Evaluation (``agent-gym eval``), the trainer's rollout statistics and its held-out evaluation all summarise
episodes here, so a valid tool call and every metric name mean the same thing wherever they are logged:

- a **tool call** is one record of a step's ``info["tool_calls"]``; it is **valid** when it parsed, its
  arguments were valid and the tool ran without error (``ok`` is True and no ``error``);
- ``tool_call_validity`` is valid calls over all calls, pooled over the episodes (episodes without a call add
  nothing); the other metrics are means over episodes: ``reward`` (the return), ``em``, ``f1``, ``turns``,
  ``tool_calls`` (per episode), ``answered`` (share the agent ended with an answer), ``evidence_recall``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_gym.contract import (
    ANSWER,
    EVIDENCE_RECALL,
    FORMAT_ERRORS,
    GOLD_ANSWERS,
    TASK_FIELDS,
    TASK_ID,
    TOOL_CALLS,
    reward_split,
)

__all__ = ["EpisodeSummary", "METRIC_NAMES", "as_number", "is_valid_tool_call", "summarize_episodes"]

#: the names :func:`summarize_episodes` reports (besides ``episodes``), in table order
METRIC_NAMES = ("em", "f1", "reward", "turns", "tool_calls", "tool_call_validity", "answered", "evidence_recall")


def is_valid_tool_call(record: Any) -> bool:
    """The one definition of a valid tool call: its record says it ran (``ok``) and carries no error."""
    return isinstance(record, Mapping) and record.get("ok") is True and not record.get("error")


def as_number(value: Any) -> float | None:
    """A reported metric as a float; None for a bool or anything that is not a number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class EpisodeSummary:
    """One episode, accumulated step by step from its infos (:meth:`add_step`, :meth:`add_truncation`).

    Attributes:
        task_id: the task the episode played.
        reward: the return, the sum of the rewards paid (a truncation's included).
        turns: the agent's turns (steps).
        tool_calls: tool-call records over all steps; ``valid_tool_calls`` of them valid.
        format_errors: steps whose turn had format errors.
        em, f1: the final answer's scores (the env's ``reward_scores``); None when the env reports none.
        answer, gold_answers: the final answer and the gold ones, from the last info.
        evidence_recall: share of the task's supporting titles retrieved (tasks that name them).
        terminated: the agent ended the episode with an answer; ``truncated``: a limit cut it.
        truncated_by: which limit: ``"env"`` (the env's own), or the reason a driver cut it outside the env
            (``"context"``, ``"max_turns"``); None when the agent answered.
        task_fields: reset's ``info["task_fields"]`` (the task's kind, hop count...), for balancing and breakdowns.

    The rollout collector hands this record on as it is: every `Trajectory` of the episode carries it
    (``trajectory.episode``).
    """

    task_id: str = ""
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    valid_tool_calls: int = 0
    format_errors: int = 0
    em: float | None = None
    f1: float | None = None
    answer: str | None = None
    gold_answers: list[str] = field(default_factory=list)
    evidence_recall: float | None = None
    terminated: bool = False
    truncated: bool = False
    truncated_by: str | None = None
    task_fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_reset(cls, info: Mapping[str, Any]) -> EpisodeSummary:
        """An episode that has just started, with reset's ``info``."""
        summary = cls(task_id=str(info.get(TASK_ID, "")), task_fields=dict(info.get(TASK_FIELDS) or {}))
        summary._read_end(info)
        return summary

    def add_step(self, reward: float, terminated: bool, truncated: bool, info: Mapping[str, Any]) -> None:
        """Count one step: its reward, its tool calls, its format errors, and the end-of-episode keys."""
        self.reward += float(reward)
        self.turns += 1
        calls = [call for call in info.get(TOOL_CALLS) or () if isinstance(call, Mapping)]
        self.tool_calls += len(calls)
        self.valid_tool_calls += sum(is_valid_tool_call(call) for call in calls)
        self.format_errors += int(bool(info.get(FORMAT_ERRORS)))
        self.terminated, self.truncated = bool(terminated), bool(truncated and not terminated)
        self.truncated_by = "env" if self.truncated else None
        self._read_end(info)

    def cut(self, reason: str) -> None:
        """A driver ended the episode outside the env (``reason``: its token budget, its turn cap)."""
        self.terminated, self.truncated, self.truncated_by = False, True, reason

    def add_truncation(self, reward: float, info: Mapping[str, Any]) -> None:
        """The episode was cut outside the env (`cut`) and its ``truncate()`` paid ``reward``."""
        self.reward += float(reward)
        self.terminated, self.truncated = False, True
        self.truncated_by = self.truncated_by or "truncate"
        self._read_end(info)

    def _read_end(self, info: Mapping[str, Any]) -> None:
        if TASK_ID in info:
            self.task_id = str(info[TASK_ID])
        _, scores = reward_split(info)
        for key in ("em", "f1"):
            if (value := as_number(scores.get(key))) is not None:
                setattr(self, key, value)
        if ANSWER in info:
            self.answer = info[ANSWER]
        if GOLD_ANSWERS in info:
            self.gold_answers = list(info[GOLD_ANSWERS] or [])
        if (recall := as_number(info.get(EVIDENCE_RECALL))) is not None:
            self.evidence_recall = recall

    @property
    def tool_call_validity(self) -> float | None:
        """Valid calls over calls; None for an episode without a call."""
        return self.valid_tool_calls / self.tool_calls if self.tool_calls else None


def summarize_episodes(episodes: Iterable[EpisodeSummary]) -> dict[str, float]:
    """The metrics of many episodes (see the module docstring), with ``episodes``, their count.

    A metric that no episode reports (``em`` of an env without answers, ``evidence_recall`` of tasks without
    supporting titles, ``tool_call_validity`` with no call) is left out rather than reported as 0.
    """
    episodes = list(episodes)
    if not episodes:
        return {"episodes": 0}
    calls = sum(episode.tool_calls for episode in episodes)
    metrics: dict[str, float] = {"episodes": len(episodes)}
    for name in ("em", "f1"):
        values = [value for episode in episodes if (value := getattr(episode, name)) is not None]
        if values:
            metrics[name] = statistics.fmean(values)
    metrics["reward"] = statistics.fmean(episode.reward for episode in episodes)
    metrics["turns"] = statistics.fmean(episode.turns for episode in episodes)
    metrics["tool_calls"] = statistics.fmean(episode.tool_calls for episode in episodes)
    if calls:
        metrics["tool_call_validity"] = sum(episode.valid_tool_calls for episode in episodes) / calls
    metrics["answered"] = statistics.fmean(float(episode.terminated) for episode in episodes)
    recalls = [episode.evidence_recall for episode in episodes if episode.evidence_recall is not None]
    if recalls:
        metrics["evidence_recall"] = statistics.fmean(recalls)
    return metrics
