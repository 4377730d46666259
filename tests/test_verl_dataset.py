"""`agent-gym data export-verl`: the parquet rows verl's RL dataset reads, one per task of any env."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

pq = pytest.importorskip("pyarrow.parquet")

from agent_gym.adapters.verl_dataset import verl_rows  # noqa: E402
from agent_gym.cli import main  # noqa: E402

ENV_ID = "AgentR1-SynthHop-v0"
ENV_KWARGS = {"hops": 1, "num_pages": 200, "num_questions": 10, "split": "train"}


def test_each_row_holds_the_envs_own_prompt_and_what_the_agent_loop_needs_to_replay_its_task():
    rows = verl_rows(ENV_ID, ENV_KWARGS, limit=3)
    env = gym.make(ENV_ID, **ENV_KWARGS)
    _, info = env.reset(seed=2, options={"task_index": 2})
    assert len(rows) == 3
    assert rows[2]["prompt"] == [{"role": m["role"], "content": m["content"]} for m in info["messages"]]
    assert rows[2]["agent_name"] == "agent_gym" and rows[2]["data_source"] == ENV_ID
    extra = rows[2]["extra_info"]
    assert (extra["index"], extra["env_id"], extra["task_id"]) == (2, ENV_ID, info["task_id"])
    assert json.loads(extra["env_kwargs"]) == ENV_KWARGS
    assert json.loads(rows[2]["reward_model"]["ground_truth"]) == list(env.unwrapped.task.answers)


def test_without_a_limit_every_task_of_the_split_is_exported():
    assert len(verl_rows(ENV_ID, ENV_KWARGS)) == len(gym.make(ENV_ID, **ENV_KWARGS).unwrapped.tasks)


def test_the_command_writes_a_parquet_file_verl_can_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "train.parquet"
    status = main(["data", "export-verl", ENV_ID, "--split", "train", "--limit", "4", "--out", str(out),
                   "--env-kwarg", "hops=1", "--env-kwarg", "num_pages=200", "--env-kwarg", "num_questions=10"])
    table = pq.read_table(out)
    assert status == 0 and table.num_rows == 4
    assert {"prompt", "data_source", "agent_name", "reward_model", "extra_info"} <= set(table.column_names)
    assert f"4 rows of {ENV_ID} (train) written to {out}" in capsys.readouterr().out


def test_a_split_the_env_refuses_is_a_one_line_error(capsys: pytest.CaptureFixture[str]):
    assert main(["data", "export-verl", ENV_ID, "--split", "bogus"]) == 2
    assert "agent-gym data export-verl: cannot make AgentR1-SynthHop-v0 with split='bogus'" in capsys.readouterr().err
