"""`agent-gym eval` options that make a model eval cheaper on a CPU, and the table's per-episode seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_SYNTHHOP

from agent_gym.cli import main


def test_eval_of_a_model_caps_tokens_turns_and_threads(tiny_model_dir_for_synthhop: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from agent_gym.models.threads import DEFAULT_TORCH_THREADS

    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.append(n))
    threads: list[int] = []
    out = tmp_path / "eval.jsonl"
    assert main(["eval", "AgentR1-SynthHop-v0", "--model", str(tiny_model_dir_for_synthhop), "--episodes", "2",
                 "--no-progress", "--max-new-tokens", "3", "--max-turns", "1", "--out", str(out),
                 "--env-kwargs", json.dumps(TINY_SYNTHHOP)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["turns"] for record in records] == [1, 1]
    assert all(record["generated_tokens"] <= 3 for record in records)
    assert threads == [DEFAULT_TORCH_THREADS]
    threads.clear()
    assert main(["eval", "AgentR1-SynthHop-v0", "--model", str(tiny_model_dir_for_synthhop), "--episodes", "1",
                 "--no-progress", "--max-new-tokens", "3", "--max-turns", "1", "--torch-threads", "2",
                 "--out", str(out), "--env-kwargs", json.dumps(TINY_SYNTHHOP)]) == 0
    assert threads == [2]


@pytest.mark.parametrize("flags", [["--max-new-tokens", "0"], ["--max-turns", "0"]])
def test_eval_refuses_a_budget_below_one(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "AgentR1-Calculator-v0", *flags, "--episodes", "1"]) == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_the_table_shows_seconds_an_episode_that_round_below_a_millisecond() -> None:
    from agent_gym.evaluation import format_table

    table = format_table([("oracle", {"episodes": 3, "em": 1.0, "seconds": 0.000123})])
    assert table.splitlines()[-1] == "| oracle | 3 | 1.000 | 0.000123 |"


def test_sft_help_shows_each_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    help_text = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())
    for option, default in [("--epochs EPOCHS", "3"), ("--lr LR", "0.001"), ("--batch-size BATCH_SIZE", "16"),
                            ("--seed SEED", "0"), ("--torch-threads TORCH_THREADS", "1"),
                            ("--episodes EPISODES", "256")]:
        section = help_text.split(option, 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in section, option
    assert "--model MODEL model directory to start from (agent-gym model init) --out" in help_text  # required


def test_train_pretrain_sft_and_eval_default_to_the_measured_thread_count() -> None:
    from agent_gym.cli import _build_parser
    from agent_gym.models.threads import DEFAULT_TORCH_THREADS
    from agent_gym.trainers.config import TrainConfig
    from agent_gym.warmstart.pretrain import PretrainConfig

    assert DEFAULT_TORCH_THREADS == 1  # measured: see agent_gym/models/threads.py
    assert TrainConfig().torch_threads == PretrainConfig().torch_threads == DEFAULT_TORCH_THREADS
    sft = _build_parser("sft").parse_args(["--env", "E", "--model", "m", "--out", "o"])
    assert sft.torch_threads == DEFAULT_TORCH_THREADS
    assert _build_parser("eval").parse_args(["E"]).torch_threads is None  # None: the default, applied at --model
