"""The parquet rows verl's RL dataset reads, from any env's tasks: ``agent-gym data export-verl ID --split S``.

One row per task: ``prompt`` (the env's own first messages, which verl's ``RLHFDataset`` needs for its length
filter; the agent loop renders the env's messages itself), ``data_source`` (the env id, verl's key for metrics),
``agent_name`` (``agent_gym``: the loop of ``agent_gym.adapters.verl``), ``reward_model`` (the gold answers, for
reading only: the env pays the reward) and ``extra_info`` (``index``, ``env_id``, ``env_kwargs`` as JSON,
``task_id``, ``max_tokens_per_turn``): what ``AgentGymAgentLoop`` needs to play the task. verl itself is not
needed to write the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_gym.contract import GOLD_ANSWERS, MESSAGES, TASK_ID
from agent_gym.error import InvalidValue

__all__ = ["VerlExportConfig", "verl_rows", "write_verl_parquet"]


@dataclass
class VerlExportConfig:
    """What ``agent-gym data export-verl`` writes (its flags come from these fields, beside the env kwargs):
    ``verl_rows(config.env_id, {..., "split": config.split}, limit=config.limit,
    max_tokens_per_turn=config.max_tokens_per_turn)``."""

    env_id: str = field(metadata={"positional": True, "help": "environment id, e.g. AgentR1-HotpotQA-v0"})
    split: str = field(default="train", metadata={"help": "the env's split kwarg (default: train)"})
    limit: int | None = field(default=None, metadata={"help": "export the first N tasks (default: all)"})
    max_tokens_per_turn: int = field(default=1024, metadata={
        "help": "the model's token budget per turn in verl's rollout (default: 1024, as in Agent-R1's GRPO recipe)"})
    out: str | None = field(default=None, metadata={"help": "parquet file (default: data/verl/ENV_SPLIT.parquet)"})


def verl_rows(env_id: str, env_kwargs: dict[str, Any] | None = None, *, limit: int | None = None,
              max_tokens_per_turn: int = 1024) -> list[dict[str, Any]]:
    """A verl row for each task of the env (its first ``limit``), in the env's task order.

    An env without a ``tasks`` list (docs/DESIGN.md §2 asks only for ``task_index`` in reset) needs ``limit``.
    """

    from agent_gym.make import make_env

    env_kwargs = dict(env_kwargs or {})
    env = make_env(env_id, env_kwargs)
    try:
        tasks = getattr(env.unwrapped, "tasks", None)
        count = len(tasks) if tasks is not None else None
        if count is None and limit is None:
            raise InvalidValue(f"{env_id} does not list its tasks; give --limit N to export task indices 0..N-1")
        count = min(count, limit) if count is not None and limit is not None else (count or limit)
        rows = []
        for index in range(count):
            _, info = env.reset(seed=index, options={"task_index": index})
            task_id = str(info.get(TASK_ID, index))
            gold = list(tasks[index].answers) if tasks is not None else list(info.get(GOLD_ANSWERS) or [])
            rows.append({
                "data_source": env_id,
                "prompt": [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in info[MESSAGES]],
                "agent_name": "agent_gym",
                "ability": "agent",
                "reward_model": {"style": "env", "ground_truth": json.dumps(gold)},
                "extra_info": {"index": index, "env_id": env_id, "env_kwargs": json.dumps(env_kwargs, sort_keys=True),
                               "task_id": task_id, "max_tokens_per_turn": max_tokens_per_turn},
            })
        return rows
    finally:
        env.close()


def write_verl_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as one parquet file (pyarrow), making its folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
