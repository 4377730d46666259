"""The rollout bar shows each turn and the tokens generated, before any episode ends."""

from __future__ import annotations

from conftest import FACT_TASKS, FactLookup

from agent_gym.env import ToolEnv
from agent_gym.trainers.backends import TransformersBackend
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig


def test_the_rollout_bar_counts_turns_and_tokens(tiny_model, capsys) -> None:
    model, tokenizer = tiny_model
    envs = [ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=2) for _ in range(2)]
    collector = RolloutCollector(envs, TransformersBackend(model, tokenizer), tokenizer,
                                 RolloutConfig(max_new_tokens=4, max_turns=2, show_progress=True))
    collector.collect([FACT_TASKS[0].id, FACT_TASKS[1].id], seed=0)
    bar = capsys.readouterr().err
    assert "turn 1 of 2 episodes, 0 tokens" in bar  # shown as the first turn starts
    assert "turn 1 done, " in bar and "turn 2 done, " in bar
