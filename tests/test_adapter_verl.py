"""verl 0.9.1's agent loop on agent-gym envs: `AgentGymAgentLoop` driven as verl's AgentLoopWorker drives it,
against a fake server manager that serves our transformers backend (CPU). Runs in the verl venv
(`bash scripts/make_verl_venv.sh`); the full GPU run is marked `gpu`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl runs in its own venv: bash scripts/make_verl_venv.sh")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from agent_gym.adapters.verl import AGENT_NAME, AgentGymAgentLoop  # noqa: E402
from agent_gym.adapters.verl_dataset import verl_rows  # noqa: E402
from agent_gym.models.chat_template import encode_text  # noqa: E402
from agent_gym.trainers.backends import SamplingParams, TransformersBackend  # noqa: E402

ENV_ID = "AgentR1-SynthHop-v0"
ENV_KWARGS = {"hops": 1, "num_pages": 200, "num_questions": 10, "split": "train"}
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The suite's shared tiny model and tokenizer (conftest; its tokenizer learned SynthHop's text)."""
    return tiny_model


class TransformersServerManager:
    """verl's server-manager interface (`generate(request_id, prompt_ids=, sampling_params=) -> TokenOutput`)
    answered by our transformers backend; it records every request."""

    def __init__(self, model, tokenizer) -> None:
        self.backend = TransformersBackend(model, tokenizer)
        self.requests: list[tuple[str, list[int], dict]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
        params = SamplingParams(max_new_tokens=sampling_params["max_tokens"],
                                temperature=sampling_params.get("temperature", 1.0),
                                top_p=sampling_params.get("top_p", 1.0),
                                stop_token_ids=sampling_params.get("stop_token_ids", ()),
                                stop_strings=sampling_params.get("stop", ()), seed=len(self.requests))
        generation = self.backend.generate([prompt_ids], params)[0]
        self.outputs.append(list(generation.token_ids))
        return TokenOutput(token_ids=generation.token_ids, log_probs=generation.logprobs, stop_reason="completed")


class ScriptedServerManager(TransformersServerManager):
    """Answers the r-th request with `turns[r]` (then `<|im_end|>`), for episodes whose rewards are known."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns = tokenizer, turns
        self.requests, self.outputs = [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
        text = self.turns[min(len(self.outputs), len(self.turns) - 1)]
        ids = encode_text(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.outputs.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def _loop(server_manager, tokenizer, response_length: int = 8192, max_assistant_turns: int = 4):
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": response_length,
                                          "multi_turn": {"max_assistant_turns": max_assistant_turns}}},
        "data": {},
    })
    return AgentGymAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server_manager,
                             tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset,
                             data_config=DictConfigWrap(config.data))


def _run(loop, row: dict) -> AgentLoopOutput:
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    return asyncio.run(loop.run(sampling, **row))


def _row(task_index: int = 0) -> dict:
    return verl_rows(ENV_ID, ENV_KWARGS, limit=task_index + 1)[task_index]


def _call(query: str) -> str:
    return f'<tool_call>{json.dumps({"name": "search", "arguments": {"query": query}})}</tool_call>'


def test_the_loop_is_registered_under_its_name():
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "agent_gym.adapters.verl.AgentGymAgentLoop"


def test_model_tokens_get_mask_one_and_env_tokens_mask_zero(tiny):
    model, tokenizer = tiny
    server = TransformersServerManager(model, tokenizer)
    output = _run(_loop(server, tokenizer, max_assistant_turns=3), _row())
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    ones = [token for token, mask in zip(output.response_ids, output.response_mask, strict=True) if mask == 1]
    assert ones == [token for turn in server.outputs for token in turn]  # exactly the sampled tokens
    assert all(logprob == 0.0 for logprob, mask in zip(output.response_logprobs, output.response_mask, strict=True)
               if mask == 0)
    assert len(server.outputs) == 3 and 0 in output.response_mask  # the env answered in between, with mask 0


def test_each_turn_is_sampled_from_the_exact_tokens_so_far(tiny):
    model, tokenizer = tiny
    server = TransformersServerManager(model, tokenizer)
    output = _run(_loop(server, tokenizer, max_assistant_turns=3), _row())
    full = output.prompt_ids + output.response_ids
    for (_, prompt_ids, _), sampled in zip(server.requests, server.outputs, strict=True):
        assert full[: len(prompt_ids)] == prompt_ids  # token in: the context is never re-encoded
        assert full[len(prompt_ids) : len(prompt_ids) + len(sampled)] == sampled  # token out: kept verbatim
    assert len({request_id for request_id, _, _ in server.requests}) == 1  # one sticky session per episode


def test_the_reward_score_and_components_are_the_envs(tiny):
    _, tokenizer = tiny
    env = gym.make(ENV_ID, **ENV_KWARGS)
    env.reset(seed=0, options={"task_index": 0})
    task = env.unwrapped.task
    turns = [_call(task.decomposition[0].query), f"<answer>{task.answers[0]}</answer>"]
    expected = [env.step(turn) for turn in turns]
    output = _run(_loop(ScriptedServerManager(tokenizer, turns), tokenizer), _row())
    assert output.reward_score == sum(step[1] for step in expected) == 1.0
    assert output.extra_fields["turn_scores"] == [step[1] for step in expected]
    assert output.extra_fields["reward_components"]["em"] == expected[-1][4]["reward_components"]["em"] == 1.0
    assert output.extra_fields["reward_extra_info"] == output.extra_fields["reward_components"]
    assert output.num_turns == 5  # prompt, assistant, tool, assistant... as verl counts: 1 + 2 per turn


def test_a_malformed_turn_ends_as_the_env_says(tiny):
    _, tokenizer = tiny
    env = gym.make(ENV_ID, **ENV_KWARGS)
    env.reset(seed=0, options={"task_index": 0})
    turns = ['<tool_call>{"name": "search", "arguments": {"query": </tool_call>', "no call and no answer"]
    expected = [env.step(turn) for turn in turns]
    cut_reward, cut_info = env.unwrapped.truncate()  # two turns, no answer: cut at max_assistant_turns
    output = _run(_loop(ScriptedServerManager(tokenizer, turns), tokenizer, max_assistant_turns=2), _row())
    env_tokens = [token for token, mask in zip(output.response_ids, output.response_mask, strict=True) if mask == 0]
    assert expected[0][4]["messages"][-1]["content"] in tokenizer.decode(env_tokens)  # the env's words on it
    assert output.extra_fields["turn_scores"] == [expected[0][1], expected[1][1] + cut_reward]
    assert output.reward_score == -1.0  # Agent-R1 Eq. 6: no answer, format score 0, minus 1
    assert output.extra_fields["reward_components"] == cut_info["reward_components"]


def test_the_response_length_bounds_the_episode_and_the_env_pays_the_cut(tiny):
    _, tokenizer = tiny
    env = gym.make(ENV_ID, **ENV_KWARGS)
    env.reset(seed=0, options={"task_index": 0})
    task = env.unwrapped.task
    search = _call(task.decomposition[0].query)
    output = _run(_loop(ScriptedServerManager(tokenizer, [search]), tokenizer, response_length=120,
                        max_assistant_turns=10), _row())
    for _ in output.extra_fields["turn_scores"]:
        env.step(search)
    cut_reward, _ = env.unwrapped.truncate()
    assert len(output.response_ids) <= 120 and output.extra_fields["truncated_by"] == "agent_loop"
    assert output.reward_score == pytest.approx(cut_reward)  # searches pay nothing; the cut pays the outcome


def test_a_row_without_an_env_id_is_refused_with_what_to_run(tiny):
    _, tokenizer = tiny
    with pytest.raises(ValueError, match="export-verl"):
        _run(_loop(ScriptedServerManager(tokenizer, ["x"]), tokenizer), {"extra_info": {"index": 0}})


def test_the_example_config_composes_with_verls_defaults_and_names_our_loop():
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class

    with initialize_config_dir(config_dir=str(REPO_ROOT / "examples" / "verl"), version_base=None):
        config = compose(config_name="agentr1_hotpotqa_grpo")
    rollout = config.actor_rollout_ref.rollout
    assert (config.algorithm.adv_estimator, rollout.n, rollout.agent.default_agent_loop) == ("grpo", 5, AGENT_NAME)
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-3B-Instruct"
    loops = OmegaConf.load(REPO_ROOT / rollout.agent.agent_loop_config_path)
    assert [(loop.name, get_class(loop._target_)) for loop in loops] == [(AGENT_NAME, AgentGymAgentLoop)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the full verl GRPO run needs a CUDA GPU, vLLM and the model (AGENT_GYM_VERL_MODEL, "
                    "default Qwen/Qwen2.5-0.5B-Instruct from the Hub)")
def test_the_papers_grpo_recipe_runs_two_steps_on_a_gpu(tmp_path):
    data = tmp_path / "data"
    for split in ("train", "test"):
        subprocess.run([sys.executable, "-m", "agent_gym.cli", "data", "export-verl", "AgentR1-SynthHop-v0",
                        "--split", split, "--limit", "64", "--out", str(data / f"{split}.parquet")], check=True)
    subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={REPO_ROOT / 'examples' / 'verl'}",
         "--config-name=agentr1_hotpotqa_grpo", f"data.train_files={data / 'train.parquet'}",
         f"data.val_files={data / 'test.parquet'}", "trainer.total_training_steps=2",
         "actor_rollout_ref.model.path=" + os.environ.get("AGENT_GYM_VERL_MODEL", "Qwen/Qwen2.5-0.5B-Instruct"),
         f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.logger=[console]",
         # the recipe's node of 4 GPUs with tensor parallel 2, shrunk to the GPUs this machine has
         f"trainer.n_gpus_per_node={torch.cuda.device_count()}",
         "actor_rollout_ref.rollout.tensor_model_parallel_size=1"],
        check=True, cwd=REPO_ROOT, timeout=3600)
