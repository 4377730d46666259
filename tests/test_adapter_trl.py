"""TRL's GRPOTrainer on our envs through both of its entry points (runs in the peer venv: scripts/make_peer_venv.sh).

Which keeps env tokens out of the loss: both, each checked here on TRL's own masks. rollout_func: TRL's loss mask
is our loss_mask, token for token, over the env's own observation tokens. environment_factory: TRL's tool_mask
zeroes its own rendering of each tool result (the raw result, wrapped once).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl", reason="trl not installed (peer venv: bash scripts/make_peer_venv.sh)")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import agent_gym  # noqa: E402, F401 - registers the ids
from agent_gym.adapters.trl import (  # noqa: E402
    RolloutFunc,
    env_reward,
    make_environment_factory,
    make_tool_dataset,
    prepare_tokenizer,
)
from agent_gym.trainers.rollout import RolloutConfig  # noqa: E402

ENV = "AgentR1-SynthHop-v0"
SMALL = {"hops": 1, "num_pages": 200, "num_questions": 10, "max_turns": 3}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir_for_synthhop):
    """The suite's shared tiny model (conftest; its tokenizer learned SynthHop's text), as a path string."""
    return str(tiny_model_dir_for_synthhop)


def _config(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=96, max_steps=1, learning_rate=1e-4, use_cpu=True, bf16=False,
                    gradient_checkpointing=False, report_to="none", logging_steps=1, save_strategy="no",
                    disable_tqdm=True, seed=0, beta=0.0)
    settings.update(overrides)
    return GRPOConfig(**settings)


def _task(index: int):
    return gym.make(ENV, **SMALL).unwrapped.tasks[index]


# ---------------------------------------------------------------------------------------------- environment_factory


def test_environment_methods_are_the_envs_tools_with_schema_signatures_and_docstrings():
    environment = make_environment_factory(ENV, **SMALL)()
    schema = get_json_schema(environment.search)["function"]
    tool = gym.make(ENV, **SMALL).unwrapped.tools["search"].schema()["function"]
    assert schema["name"] == "search" and schema["parameters"]["required"] == tool["parameters"]["required"]
    assert schema["parameters"]["properties"]["query"]["type"] == "string"
    assert get_json_schema(environment.answer)["function"]["parameters"]["required"] == ["answer"]


def test_a_tool_method_returns_the_raw_result_and_answer_reaches_the_envs_scorer():
    environment = make_environment_factory(ENV, **SMALL)()
    task = _task(0)
    assert environment.reset(task_index=0) == task.question
    result = environment.search(query=task.decomposition[0].query)
    assert task.answers[0] in result and "<tool_response>" not in result
    environment.answer(answer=task.answers[0])
    assert environment.get_reward() == 1.0


def test_an_episode_left_without_an_answer_pays_the_envs_truncation():
    environment = make_environment_factory(ENV, **SMALL)()
    environment.reset(task_index=0)
    assert environment.get_reward() == -1.0  # Agent-R1 Eq. 6: format_score - 1, no turn well formed


def test_environment_factory_masks_trls_rendering_of_each_tool_result(model_dir, tmp_path):
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=model, args=_config(tmp_path, max_completion_length=1024), processing_class=tokenizer,
                          train_dataset=make_tool_dataset(ENV, 4, **SMALL),
                          environment_factory=make_environment_factory(ENV, **SMALL))
    task = _task(0)
    turns = [f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{task.decomposition[0].query}"}}}}\n'
             "</tool_call><|im_end|>", f"The answer is {task.answers[0]}.<|im_end|>"]
    scripted = iter([[tokenizer.encode(turn, add_special_tokens=False)] for turn in turns])

    def generate_single_turn(prompt_ids, *args, **kwargs):  # a scripted policy in place of sampling
        ids = next(scripted)
        return ids, [[0.0] * len(ids[0])]

    trainer._generate_single_turn = generate_single_turn
    row = make_tool_dataset(ENV, 1, **SMALL)[0]
    trainer._batch_environments = [None]
    trainer.environments = [trainer._environment_pool[None][0]]
    trainer._sync_tool_dicts = [{name: getattr(trainer.environments[0], name) for name in ("search", "answer")}]
    trainer._async_tool_dicts = [{}]
    prompt = [*row["prompt"][:-1], {"role": "user", "content": trainer.environments[0].reset(task_index=0)}]
    _, completion_ids, tool_mask, _, _, _, _, _ = trainer._generate([prompt])
    masked = [token for token, keep in zip(completion_ids[0], tool_mask[0], strict=True) if not keep]
    kept = [token for token, keep in zip(completion_ids[0], tool_mask[0], strict=True) if keep]
    tool_text = tokenizer.decode(masked)
    assert tool_text.count("<tool_response>") == 1 and task.answers[0] in tool_text
    assert tokenizer.decode(kept) == "".join(turns)  # every sampled token, and only those, is trained


@pytest.mark.slow
def test_grpo_trainer_trains_a_step_with_environment_factory(model_dir, tmp_path):
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=_config(tmp_path),
                          processing_class=tokenizer, train_dataset=make_tool_dataset(ENV, 4, **SMALL),
                          environment_factory=make_environment_factory(ENV, **SMALL))
    trainer.train()
    assert trainer.state.global_step == 1


# ---------------------------------------------------------------------------------------------- rollout_func


def test_rollout_func_hands_trl_our_exact_tokens_and_loss_mask_as_its_own(model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rollout = RolloutFunc(ENV, num_envs=4, config=RolloutConfig(max_new_tokens=24, max_turns=3,
                                                                show_progress=False), **SMALL)
    dataset = rollout.dataset(4)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=env_reward,
                          args=_config(tmp_path), processing_class=tokenizer, train_dataset=dataset,
                          rollout_func=rollout)
    inputs = [dataset[0], dataset[0], dataset[1], dataset[1]]
    output = trainer._generate_and_score_completions(inputs)
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 4 and any(0 in t.loss_mask for t in trajectories)  # env tokens are there
    for row, trajectory in enumerate(trajectories):
        length = len(trajectory.response_ids)
        assert output["completion_ids"][row, :length].tolist() == trajectory.response_ids
        trained = (output["completion_mask"][row] * output["tool_mask"][row])[:length]
        assert trained.tolist() == trajectory.loss_mask  # TRL's loss mask is ours, token for token
        prompt = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist()
        assert prompt == trajectory.prompt_ids
    rewards = torch.tensor([t.outcome for t in trajectories])
    assert torch.allclose(output["advantages"], (rewards.view(2, 2) - rewards.view(2, 2).mean(1, keepdim=True))
                          .flatten() / (rewards.view(2, 2).std(1, keepdim=True).flatten().repeat_interleave(2)
                                        + 1e-4), atol=1e-3)


@pytest.mark.slow
def test_grpo_trainer_trains_a_step_with_rollout_func(model_dir, tmp_path):
    rollout = RolloutFunc(ENV, num_envs=4, config=RolloutConfig(max_new_tokens=24, max_turns=3,
                                                                show_progress=False), **SMALL)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=env_reward,
                          args=_config(tmp_path), processing_class=AutoTokenizer.from_pretrained(model_dir),
                          train_dataset=rollout.dataset(4), rollout_func=rollout)
    trainer.train()
    logged = trainer.state.log_history[0]
    outcomes = [t.outcome for t in rollout.last_trajectories]
    assert trainer.state.global_step == 1
    assert logged["rewards/env_reward/mean"] == pytest.approx(sum(outcomes) / len(outcomes))


def test_a_prompt_rollout_func_did_not_build_is_refused():
    rollout = RolloutFunc(ENV, num_envs=1, **SMALL)
    with pytest.raises(ValueError, match="dataset"):
        rollout([[{"role": "user", "content": "hi"}]], trainer=None)
