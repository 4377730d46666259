"""Decoding with N candidate turns: best-of-N by log-likelihood, and value-guided by the PPO critic."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from conftest import TINY_SYNTHHOP

import agent_gym  # noqa: F401  (registers the env ids)
from agent_gym.agents.model_policy import ModelPolicy, ModelPolicyError, best_candidate
from agent_gym.evaluation import run_episode
from agent_gym.models.model_init import load_model_and_tokenizer
from agent_gym.trainers.backends import Generation, GenerationBackend, SamplingParams
from agent_gym.trainers.critic import CRITIC_FILE, ValueModel

ENV_ID = "AgentR1-SynthHop-v0"
ENV_KWARGS = TINY_SYNTHHOP


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir_for_synthhop):
    return tiny_model_dir_for_synthhop


class FixedCandidates(GenerationBackend):
    """Returns the same three candidate turns every call, whatever the prompt."""

    def __init__(self, tokenizer) -> None:
        texts = ["<answer>alpha</answer>", "<answer>beta</answer>", "<answer>gamma</answer>"]
        self.turns = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        self.logprobs = [-3.0, -1.0, -2.0]  # beta is the likeliest
        self.calls: list[SamplingParams] = []

    def generate(self, prompts, params):
        self.calls.append(params)
        assert len(prompts) == len(self.turns)
        pairs = zip(self.turns, self.logprobs, strict=True)
        return [Generation(ids, [logprob / len(ids)] * len(ids), "stop") for ids, logprob in pairs]


class CriticPreferring:
    """A stand-in critic whose value of a sequence is 1 if it ends with the given candidate's ids, else 0."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.seen: list[list[int]] = []

    def turn_values(self, sequences):
        self.seen.extend(sequences)
        return [float(sequence[-len(self.ids):] == self.ids) for sequence in sequences]


def _act(policy: ModelPolicy) -> str:
    env = gym.make(ENV_ID, **ENV_KWARGS)
    observation, info = env.reset(seed=0, options={"task_index": 0})
    policy.begin(env.unwrapped, observation, info)
    action = policy.act(observation, info)
    env.close()
    return action


def test_best_candidate_is_the_highest_score_and_the_first_of_equals() -> None:
    assert best_candidate([0.1, 0.7, 0.3]) == 1
    assert best_candidate([0.5, 0.5]) == 0


def test_value_guided_chooser_plays_the_candidate_with_the_highest_value(model_dir) -> None:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    backend = FixedCandidates(tokenizer)
    critic = CriticPreferring(backend.turns[2])  # gamma: neither the first nor the likeliest
    policy = ModelPolicy(model, tokenizer, backend=backend, candidates=3, select="value", critic=critic)
    assert _act(policy) == "<answer>gamma</answer>"
    assert len(critic.seen) == 3 and all(len(seq) > len(backend.turns[0]) for seq in critic.seen)  # prompt + turn
    assert backend.calls[0].temperature == 1.0


def test_best_of_n_plays_the_candidate_the_policy_finds_likeliest(model_dir) -> None:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    policy = ModelPolicy(model, tokenizer, backend=FixedCandidates(tokenizer), candidates=3, select="logprob")
    assert _act(policy) == "<answer>beta</answer>"
    assert policy.generated_tokens == sum(len(turn) for turn in policy.backend.turns)  # the cost counts all N


def test_value_guided_decoding_without_a_critic_is_refused(model_dir) -> None:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    with pytest.raises(ValueError, match="critic"):
        ModelPolicy(model, tokenizer, candidates=4, select="value")
    with pytest.raises(ModelPolicyError, match="critic"):
        ModelPolicy.from_pretrained(model_dir, candidates=4, select="value")


def test_a_saved_critic_loads_beside_its_policy_and_values_turns(model_dir, tmp_path) -> None:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    critic = ValueModel.from_policy(model)
    torch.nn.init.normal_(critic.value_head.weight)  # a non-trivial critic
    model.save_pretrained(tmp_path / "final")
    tokenizer.save_pretrained(tmp_path / "final")
    critic.save(tmp_path / "final" / CRITIC_FILE)
    policy = ModelPolicy.from_pretrained(tmp_path, candidates=2, select="value", max_new_tokens=6)
    sequences = [[5, 6, 7], [5, 6, 7, 8, 9]]
    assert policy.critic.turn_values(sequences) == pytest.approx(critic.eval().turn_values(sequences))
    record = run_episode(gym.make(ENV_ID, **ENV_KWARGS), policy, seed=0, options={"task_index": 0})
    assert record.generated_tokens > 0 and record.seconds > 0


def test_turn_values_read_the_value_at_each_sequences_last_token(model_dir) -> None:
    model, _ = load_model_and_tokenizer(model_dir)
    critic = ValueModel.from_policy(model).eval()
    torch.nn.init.normal_(critic.value_head.weight)
    full = critic(torch.tensor([[5, 6, 7, 8, 9]]))[0]
    # two forwards of different shapes: equal to fp32 rounding (a few 1e-6 on values near 1), not bit for bit
    assert critic.turn_values([[5, 6, 7], [5, 6, 7, 8, 9]]) == pytest.approx([float(full[2]), float(full[4])],
                                                                               rel=1e-5, abs=1e-5)


def test_a_published_adapters_critic_loads_from_beside_the_adapter_in_bf16(model_dir, tmp_path) -> None:
    # experiments/checkpoints/rl-ppo-*: the policy's LoRA adapter and its LoRA critic, both in bf16, no model.
    from agent_gym.trainers.critic import LoraValueModel
    from agent_gym.warmstart.sft import SFTConfig, prepare_sft_model

    model, tokenizer = load_model_and_tokenizer(model_dir)
    peft_model = prepare_sft_model(model, SFTConfig(lora_rank=4, lora_alpha=8))
    peft_model.save_pretrained(tmp_path / "adapter")
    critic = LoraValueModel(peft_model, rank=4)
    with torch.no_grad():
        for parameter in critic.parameters():
            parameter.copy_(torch.randn(parameter.shape) * 0.05)
    state = {key: value.to(torch.bfloat16) for key, value in critic.state_dict().items()}
    torch.save({**state, "lora_rank": torch.tensor(4)}, tmp_path / "adapter" / CRITIC_FILE)
    policy = ModelPolicy.from_pretrained(model_dir, adapter=tmp_path / "adapter", candidates=2, select="value",
                                         max_new_tokens=6)
    sequences = [[5, 6, 7], [5, 6, 7, 8, 9]]
    expected = critic.eval().turn_values(sequences)
    assert expected[0] != expected[1]
    assert policy.critic.turn_values(sequences) == pytest.approx(expected, rel=0.05, abs=0.02)  # bf16 weights
    with pytest.raises(ModelPolicyError, match=f"no {CRITIC_FILE} in .*adapter"):
        (tmp_path / "adapter" / CRITIC_FILE).unlink()
        ModelPolicy.from_pretrained(model_dir, adapter=tmp_path / "adapter", candidates=2, select="value")
