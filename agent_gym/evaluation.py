"""Run a policy for N episodes and summarise EM / F1 / turns / tool-call validity (``agent-gym eval``).

The loop needs only the Gymnasium contract of the README (``reset``/``step`` and the info keys), so it runs on any
conforming env, ``RemoteEnv`` included. A policy's ``begin(env, observation, info)`` receives ``env.unwrapped``:
that is the hook through which the scripted policies that need gold data (the oracle's decompositions, the
tasks' supporting titles) read the env's ``task`` and ``tools``, which ``ToolEnv`` has; a model policy reads only
``info["messages"]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agent_gym.policies import Policy

__all__ = ["EpisodeRecord", "run_episode", "iter_episodes", "evaluate", "summarize", "format_table"]


@dataclass
class EpisodeRecord:
    """One evaluated episode."""

    task_id: str
    question: str
    answer: str | None
    gold_answers: list[str]
    reward: float
    em: float
    f1: float
    turns: int
    tool_calls: int
    valid_tool_calls: int
    format_errors: int
    evidence_recall: float | None
    terminated: bool
    seconds: float = 0.0  # wall time of the episode, the policy's included
    generated_tokens: int | None = None  # tokens a model policy sampled (its discarded candidates too)
    # The final context and the tool schemas, kept on request (SFT data and drills are made from them).
    messages: list[dict] | None = None
    tools: list[dict] | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as one JSONL row; the kept context only when there is one."""
        row = asdict(self)
        for key in ("messages", "tools"):
            if row[key] is None:
                del row[key]
        return row


def run_episode(env: gym.Env, policy: Policy, *, seed: int | None = None,
                options: dict[str, Any] | None = None, keep_messages: bool = False) -> EpisodeRecord:
    """Play one episode of ``policy`` in ``env`` (any env that follows the README's contract).

    ``keep_messages`` keeps the episode's final ``info["messages"]`` and the tool schemas on the record.
    A policy without ``begin`` (only ``act``) plays too.
    """
    started, tokens_before = time.perf_counter(), getattr(policy, "generated_tokens", None)
    question, info = env.reset(seed=seed, options=options)
    tools = list(info.get("tools") or [])
    begin = getattr(policy, "begin", None)
    if callable(begin):
        begin(env.unwrapped, question, info)
    observation = question
    total_reward, calls, valid_calls, format_errors, turns = 0.0, 0, 0, 0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(policy.act(observation, info))
        total_reward += reward
        turns += 1
        tool_calls = info.get("tool_calls") or []
        calls += len(tool_calls)
        valid_calls += sum(1 for call in tool_calls if call.get("ok") and call.get("error") is None)
        format_errors += int(bool(info.get("format_errors")))
    components = info.get("reward_components") or {}
    return EpisodeRecord(
        task_id=str(info.get("task_id", "")), question=question, answer=info.get("answer"),
        gold_answers=list(info.get("gold_answers") or []), reward=total_reward,
        em=float(components.get("em", 0.0)), f1=float(components.get("f1", 0.0)), turns=int(info.get("turn", turns)),
        tool_calls=calls, valid_tool_calls=valid_calls, format_errors=format_errors,
        evidence_recall=info.get("evidence_recall"), terminated=terminated, seconds=time.perf_counter() - started,
        generated_tokens=None if tokens_before is None else policy.generated_tokens - tokens_before,
        messages=list(info["messages"]) if keep_messages else None, tools=tools if keep_messages else None,
    )


def iter_episodes(env: gym.Env, policy: Policy, episodes: int, *, seed: int = 0, task_offset: int = 0,
                  keep_messages: bool = False, progress: bool = True,
                  description: str = "episodes") -> Iterator[EpisodeRecord]:
    """Episodes on tasks ``task_offset, task_offset + 1, ...``, episode ``i`` seeded ``seed + i``, one at a time."""
    for index in tqdm(range(episodes), desc=description, disable=not progress, unit="ep"):
        yield run_episode(env, policy, seed=seed + index, options={"task_index": task_offset + index},
                          keep_messages=keep_messages)


def evaluate(env: gym.Env, policy: Policy, episodes: int, *, seed: int = 0, out_path: str | Path | None = None,
             progress: bool = True, description: str = "eval") -> list[EpisodeRecord]:
    """Evaluate on the first ``episodes`` tasks of the env's task list (distinct tasks, in order).

    Episode ``i`` resets with ``options={"task_index": i}``. An env that does not expose its task list
    (``env.unwrapped.tasks``; a ``RemoteEnv``) plays ``episodes`` episodes. Each record is appended to
    ``out_path`` (JSONL) as soon as its episode ends, so an interrupted run keeps what it measured. A policy's
    ``check_env`` (or ``check_tasks``) runs first: a scripted policy raises ``PolicyError`` on an env it cannot
    play (the oracle on tasks without gold decompositions, naive-rag on an env without a search tool).
    """
    tasks = getattr(env.unwrapped, "tasks", None)
    count = min(episodes, len(tasks)) if tasks is not None else episodes
    check_env, check_tasks = getattr(policy, "check_env", None), getattr(policy, "check_tasks", None)
    if callable(check_env) and tasks is not None:  # e.g. naive-rag refuses an env without a search tool
        check_env(env.unwrapped, tasks[:count])
    elif callable(check_tasks) and tasks is not None:  # e.g. the oracle refuses tasks without gold decompositions
        check_tasks(tasks[:count])
    records: list[EpisodeRecord] = []
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    handle = open(out_path, "w", encoding="utf-8") if out_path else None  # noqa: SIM115 - closed below
    try:
        for record in iter_episodes(env, policy, count, seed=seed, progress=progress, description=description):
            records.append(record)
            if handle:
                handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
                handle.flush()
    finally:
        if handle:
            handle.close()
    return records


def summarize(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Means over episodes; tool-call validity is valid calls over all calls."""
    if not records:
        return {"episodes": 0}
    calls = sum(r.tool_calls for r in records)
    recalls = [r.evidence_recall for r in records if r.evidence_recall is not None]
    summary = {
        "episodes": len(records),
        "em": float(np.mean([r.em for r in records])),
        "f1": float(np.mean([r.f1 for r in records])),
        "reward": float(np.mean([r.reward for r in records])),
        "turns": float(np.mean([r.turns for r in records])),
        "tool_calls": float(np.mean([r.tool_calls for r in records])),
        "call_validity": sum(r.valid_tool_calls for r in records) / calls if calls else float("nan"),
        "answered": float(np.mean([r.terminated for r in records])),
    }
    if recalls:
        summary["evidence_recall"] = float(np.mean(recalls))
    summary["seconds"] = float(np.mean([r.seconds for r in records]))
    tokens = [r.generated_tokens for r in records if r.generated_tokens is not None]
    if tokens:
        summary["generated_tokens"] = float(np.mean(tokens))
    return summary


def format_table(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A Markdown table with one row per (label, summary)."""
    columns = ["episodes", "em", "f1", "reward", "turns", "tool_calls", "call_validity", "answered",
               "evidence_recall", "generated_tokens", "seconds"]
    columns = [c for c in columns if any(c in summary for _, summary in rows)]
    lines = ["| run | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, summary in rows:
        cells = []
        for column in columns:
            value = summary.get(column)
            whole = column in ("episodes", "generated_tokens")
            # seconds: significant digits, since a scripted policy's episode takes well under a millisecond
            digits = ".3g" if column == "seconds" else ".0f" if whole else ".3f"
            cells.append("" if value is None else f"{value:{digits}}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
