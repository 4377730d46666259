"""`agent-gym eval`'s loop, model policies included, needs only the Gymnasium contract, not a ToolEnv."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest
from support.backends import ScriptedBackend

from agent_gym.evaluation import evaluate, run_episode
from agent_gym.policies import PolicyError, make_policy
from agent_gym.spaces import UnicodeText


class EchoEnv(gym.Env):
    """A contract-following env that is not a ToolEnv: answer the number in the question."""

    def __init__(self) -> None:
        self.observation_space = UnicodeText(max_length=1000)
        self.action_space = UnicodeText(max_length=1000)
        self.index = 0

    def reset(self, *, seed=None, options=None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.index = int((options or {}).get("task_index", 0))
        question = f"Say {self.index}."
        messages = [{"role": "system", "content": "Answer in <answer></answer>."},
                    {"role": "user", "content": question}]
        return question, {"messages": messages, "task_id": str(self.index), "turn": 0, "tools": [],
                          "reward_components": {}, "tool_calls": []}

    def step(self, action: str):
        correct = f"<answer>{self.index}</answer>" in action
        components = {"em": float(correct), "f1": float(correct), "outcome": float(correct)}
        info = {"messages": [], "task_id": str(self.index), "turn": 1, "tool_calls": [], "answer": action,
                "gold_answers": [str(self.index)], "reward_components": components}
        return "", float(correct), True, False, info


class ReadsTheQuestion:
    """A policy that uses only the observation, as a model policy uses only info['messages']."""

    def begin(self, env, observation, info) -> None:
        self.number = observation.split()[1].rstrip(".")

    def act(self, observation, info) -> str:
        return f"<answer>{self.number}</answer>"


def test_evaluate_plays_an_env_that_is_not_a_tool_env():
    records = evaluate(EchoEnv(), ReadsTheQuestion(), 3, progress=False)
    assert [record.em for record in records] == [1.0, 1.0, 1.0]
    assert [record.question for record in records] == ["Say 0.", "Say 1.", "Say 2."]


@pytest.mark.parametrize(("turn", "em"), [("<answer>1</answer>", 1.0), ("<answer>2</answer>", 0.0)])
def test_a_model_policy_evaluates_on_an_env_that_is_not_a_tool_env(tiny_model, turn, em):
    from agent_gym.agents.model_policy import ModelPolicy
    from agent_gym.models.chat_template import render_prompt

    model, tokenizer = tiny_model
    backend = ScriptedBackend(tokenizer, [turn])  # the model's turn, fixed so the score is known
    policy = ModelPolicy(model, tokenizer, max_new_tokens=8, max_context_tokens=256, backend=backend)
    record = run_episode(EchoEnv(), policy, options={"task_index": 1})
    _, info = EchoEnv().reset(options={"task_index": 1})
    assert backend.prompts == [render_prompt(tokenizer, info["messages"])]  # prompted from info["messages"] alone
    assert (record.turns, record.answer, record.em) == (1, turn, em)


@pytest.mark.parametrize("name", ["oracle", "naive-rag", "gold-search", "weak-multihop"])
def test_a_gold_reading_scripted_policy_says_which_hook_the_env_lacks(name):
    with pytest.raises(PolicyError, match=r"env\.unwrapped\.task.*--model"):
        run_episode(EchoEnv(), make_policy(name))
