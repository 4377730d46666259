"""A readable sample of each step's rollout: ``OUTPUT_DIR/rollouts.jsonl`` (``TrainConfig.log_rollouts``).

Curves say that a habit changed; the episodes say how. Each step writes the first ``groups`` groups of its
rollout whole (every sample of a task, so a group's contrast can be read), one JSON record per episode:

    {"step", "group", "task_id", "task_fields", "reward", "em", "turns", "tool_calls", "truncated_by", "answer",
     "gold_answers", "prompt_tail", "response"}

``response`` is the episode's response tokens decoded as they are (the model's turns and the env's replies, the
chat template's markers included); ``prompt_tail`` the end of its prompt (the question). A resumed run drops the
records after the step it resumes from, as `metrics.MetricsLogger` does, so each step appears once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_gym.trainers.metrics import drop_records_after
from agent_gym.trainers.trajectory import Trajectory

__all__ = ["ROLLOUTS_FILE", "RolloutLog", "rollout_records"]

ROLLOUTS_FILE = "rollouts.jsonl"
PROMPT_TAIL_CHARS = 400


def rollout_records(step: int, trajectories: Sequence[Trajectory], tokenizer: Any, groups: int) -> list[dict]:
    """The records of the episodes of the first ``groups`` groups (in rollout order), one per episode."""
    chosen: list[str] = []
    for trajectory in trajectories:
        if trajectory.group_id not in chosen and len(chosen) < groups:
            chosen.append(trajectory.group_id)
    records = []
    for trajectory in trajectories:
        if trajectory.group_id not in chosen or trajectory.info.get("sample_index", 0) != 0:
            continue
        episode = trajectory.episode
        prompt = tokenizer.decode(trajectory.prompt_ids, skip_special_tokens=False)
        records.append({
            "step": int(step),
            "group": trajectory.group_id,
            "task_id": episode.task_id if episode else "",
            "task_fields": dict(episode.task_fields) if episode else {},
            "reward": float(trajectory.outcome),
            "em": episode.em if episode else None,
            "turns": episode.turns if episode else len(trajectory.turn_end_indices),
            "tool_calls": episode.tool_calls if episode else None,
            "truncated_by": episode.truncated_by if episode else None,
            "answer": episode.answer if episode else None,
            "gold_answers": list(episode.gold_answers) if episode else [],
            "prompt_tail": prompt[-PROMPT_TAIL_CHARS:],
            "response": tokenizer.decode(trajectory.response_ids, skip_special_tokens=False),
        })
    return records


class RolloutLog:
    """Appends `rollout_records` to ``run_dir/rollouts.jsonl``; on resume from step N, drops records after N."""

    def __init__(self, run_dir: str | Path, tokenizer: Any, groups: int, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / ROLLOUTS_FILE
        self.tokenizer, self.groups = tokenizer, groups
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            drop_records_after(self.path, resume_step)
        elif resume_step is None and self.path.exists():
            self.path.unlink()  # a fresh run's samples do not mix with an old run's

    def write(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        records = rollout_records(step, trajectories, self.tokenizer, self.groups)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
