"""Run a policy for N episodes and summarise them (``agent-gym eval``; the metrics are episode_summary.py's).

The loop needs only the Gymnasium contract of the README (``reset``/``step`` and the info keys), so it runs on any
conforming env, ``RemoteEnv`` included. A policy's ``begin(env, observation, info)`` receives ``env.unwrapped``:
that is the hook through which the scripted policies that need gold data (the oracle's decompositions, the
tasks' supporting titles) read the env's ``task`` and ``tools``, which ``ToolEnv`` has; a model policy reads only
``info["messages"]``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agent_gym.contract import MESSAGES, TOOLS
from agent_gym.episode_summary import METRIC_NAMES, EpisodeSummary, summarize_episodes
from agent_gym.policies import Policy

__all__ = [
    "EpisodeRecord",
    "EvalConfig",
    "EvaluationInterrupted",
    "evaluate",
    "format_table",
    "iter_episodes",
    "partial_output_path",
    "run_episode",
    "summarize",
]


@dataclass(kw_only=True)
class EvalConfig:
    """The settings of ``agent-gym eval`` (its flags come from these fields, beside the env kwargs): which env,
    which scripted policies or which model and how it decodes, how many episodes, where the records go."""

    env_id: str = field(metadata={"positional": True, "help": "environment id, e.g. AgentR1-SynthHop-v0"})
    policy: str = field(default="naive-rag", metadata={
        "help": "scripted policies, comma-separated: oracle (needs gold decompositions), gold-search, naive-rag, "
                "weak-multihop, random, stub (coding envs) (ignored with --model)"})
    model: str | None = field(default=None, metadata={
        "help": "evaluate this model (a directory, a training run's directory, or a HF name); greedy unless "
                "--best-of or --value-guided"})
    adapter: str | None = field(default=None, metadata={
        "help": "with --model: a LoRA adapter directory (agent-gym sft/train --lora-rank, or a committed "
                "experiments/checkpoints/real-*) merged into the model"})
    naive_rag: bool = field(default=False, metadata={
        "help": "with --model: the paper's naive RAG baseline, the question searched once by a script, then the "
                "model answers (pair it with --max-turns 2)"})
    dtype: Literal["auto", "float32", "bfloat16"] = field(default="auto", metadata={
        "help": "with --model: weights' dtype (auto: bfloat16 where the CPU or GPU runs it natively)"})
    best_of: int | None = field(default=None, metadata={
        "exclusive": "decoding", "metavar": "N",
        "help": "with --model: sample N turns each turn, play the one the policy finds likeliest"})
    value_guided: int | None = field(default=None, metadata={
        "exclusive": "decoding", "metavar": "N",
        "help": "with --model RUN of a PPO run (or --adapter DIR of a published one, its critic.pt beside it): "
                "sample N turns each turn, play the one its critic values most "
                "(the value at the turn's last token)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of those N turns"})
    max_new_tokens: int = field(default=256, metadata={
        "help": "with --model: token budget of one model turn (fewer: a cheaper eval on a CPU)"})
    max_turns: int | None = field(default=None, metadata={
        "help": "turns per episode: sets the env's max_turns (an episode cut there pays the env's truncation); "
                "default: the env's own"})
    torch_threads: int | None = field(default=None, metadata={
        "help": "with --model: torch.set_num_threads (default: agent_gym.models.threads's measured default; 0 "
                "keeps torch's own)"})
    policy_kwarg: list[str] = field(default_factory=list, metadata={
        "append": True, "metavar": "KEY=VALUE",
        "help": "option of the scripted policies (repeatable), e.g. --policy-kwarg p_multihop=0.5"})
    episodes: int = field(default=100, metadata={
        "help": "episodes, one per task in the env's task order (at most the env's task count)"})
    seed: int = field(default=0, metadata={"help": "seed of the env's task order and of the policies"})
    out: str | None = field(default=None, metadata={
        "help": "per-episode JSONL (default: runs/eval-ENV-POLICY-Nep[-SETTINGS-HASH].jsonl, one file per episode "
                "count, env kwargs, model and decoding settings); written to OUT's .partial.jsonl until the last "
                "episode ends, so an interrupted eval leaves an earlier OUT as it was"})
    no_progress: bool = field(default=False, metadata={"help": "hide the progress bar"})


@dataclass
class EpisodeRecord(EpisodeSummary):
    """One evaluated episode: its :class:`~agent_gym.episode_summary.EpisodeSummary`, and what eval adds."""

    question: str = ""
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
    record = EpisodeRecord.from_reset(info)
    record.question = question
    tools = list(info.get(TOOLS) or [])
    begin = getattr(policy, "begin", None)
    if callable(begin):
        begin(env.unwrapped, question, info)
    observation = question
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(policy.act(observation, info))
        record.add_step(reward, terminated, truncated, info)
    record.seconds = time.perf_counter() - started
    record.generated_tokens = None if tokens_before is None else policy.generated_tokens - tokens_before
    if keep_messages:
        record.messages, record.tools = list(info[MESSAGES]), tools
    return record


def iter_episodes(env: gym.Env, policy: Policy, episodes: int, *, seed: int = 0, task_offset: int = 0,
                  keep_messages: bool = False, progress: bool = True,
                  description: str = "episodes") -> Iterator[EpisodeRecord]:
    """Episodes on tasks ``task_offset, task_offset + 1, ...``, episode ``i`` seeded ``seed + i``, one at a time."""
    for index in tqdm(range(episodes), desc=description, disable=not progress, unit="ep"):
        yield run_episode(env, policy, seed=seed + index, options={"task_index": task_offset + index},
                          keep_messages=keep_messages)


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`evaluate`: the records of the episodes that finished, and the file that holds them.

    A ``KeyboardInterrupt``, so code that does not look for it stops as before.
    """

    def __init__(self, records: list[EpisodeRecord], planned: int, partial_path: Path | None) -> None:
        where = f"; its records are in {partial_path}" if partial_path else ""
        super().__init__(f"evaluation interrupted after {len(records)} of {planned} episodes{where}")
        self.records, self.planned, self.partial_path = records, planned, partial_path


def partial_output_path(out_path: str | Path) -> Path:
    """Where :func:`evaluate` writes the records of ``out_path`` until the last episode ends (``X.partial.jsonl``)."""
    path = Path(out_path)
    return path.with_name(f"{path.stem}.partial{path.suffix}")


def evaluate(env: gym.Env, policy: Policy, episodes: int, *, seed: int = 0, out_path: str | Path | None = None,
             progress: bool = True, description: str = "eval") -> list[EpisodeRecord]:
    """Evaluate on the first ``episodes`` tasks of the env's task list (distinct tasks, in order).

    Episode ``i`` resets with ``options={"task_index": i}``. An env that does not expose its task list
    (``env.unwrapped.tasks``; a ``RemoteEnv``) plays ``episodes`` episodes. A policy's ``check_env`` (or
    ``check_tasks``) runs first: a scripted policy raises ``PolicyError`` on an env it cannot play (the oracle on
    tasks without gold decompositions, naive-rag on an env without a search tool).

    With ``out_path``, each record is appended to :func:`partial_output_path` (JSONL) as soon as its episode
    ends, and that file replaces ``out_path`` only once every episode has ended: an earlier complete result in
    ``out_path`` survives a run that is interrupted or fails, and the interrupted run keeps what it measured.
    Ctrl-C raises :class:`EvaluationInterrupted`, which holds the finished episodes' records.
    """
    tasks = getattr(env.unwrapped, "tasks", None)
    count = min(episodes, len(tasks)) if tasks is not None else episodes
    check_env, check_tasks = getattr(policy, "check_env", None), getattr(policy, "check_tasks", None)
    if callable(check_env) and tasks is not None:  # e.g. naive-rag refuses an env without a search tool
        check_env(env.unwrapped, tasks[:count])
    elif callable(check_tasks) and tasks is not None:  # e.g. the oracle refuses tasks without gold decompositions
        check_tasks(tasks[:count])
    records: list[EpisodeRecord] = []
    partial = partial_output_path(out_path) if out_path else None
    if partial:
        partial.parent.mkdir(parents=True, exist_ok=True)
    handle = open(partial, "w", encoding="utf-8") if partial else None  # noqa: SIM115 - closed below
    try:
        for record in iter_episodes(env, policy, count, seed=seed, progress=progress, description=description):
            records.append(record)
            if handle:
                handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
                handle.flush()
    except KeyboardInterrupt:
        raise EvaluationInterrupted(records, count, partial) from None
    finally:
        if handle:
            handle.close()
    if partial:
        os.replace(partial, out_path)  # atomic: a reader sees the earlier complete file or this one
    return records


def summarize(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """:func:`~agent_gym.episode_summary.summarize_episodes` of the records, plus mean ``seconds`` and
    ``generated_tokens`` (model policies)."""
    summary = summarize_episodes(records)
    if not records:
        return summary
    summary["seconds"] = float(np.mean([r.seconds for r in records]))
    tokens = [r.generated_tokens for r in records if r.generated_tokens is not None]
    if tokens:
        summary["generated_tokens"] = float(np.mean(tokens))
    return summary


def format_table(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A Markdown table with one row per (label, summary)."""
    columns = ["episodes", *METRIC_NAMES, "generated_tokens", "seconds"]
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
