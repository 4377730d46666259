"""The LoRA critic: its own adapters and value head on the policy's own weights, shared and never copied."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.tiny_model import tiny_model_and_tokenizer

from agent_gym.trainers.critic import CRITIC_FILE, LoraValueModel, ValueModel, critic_from_policy

TEXTS = ["What is the code of Arlo?", "<answer>blue</answer>", "The code of Arlo is blue."]


@pytest.fixture
def policy():
    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer(TEXTS)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    policy = get_peft_model(model, lora)
    for name, parameter in policy.named_parameters():  # a trained policy adapter: B is not zero
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)
    return policy


def _base_weights(policy):
    return {name: p for name, p in policy.named_parameters() if "lora_" not in name}


def _adapter_weights(policy):
    return {name: p for name, p in policy.named_parameters() if "lora_" in name}


def _snapshot(named):
    return {name: p.detach().clone() for name, p in named.items()}


INPUT = torch.tensor([[3, 7, 11, 19, 23, 5], [4, 8, 12, 16, 20, 24]])


def _critic_step(critic, steps=3):
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (critic(INPUT) - 1.0).pow(2).mean()
        loss.backward()
        optimizer.step()
    return loss


def test_the_critic_reads_the_policys_own_weights_not_a_copy(policy):
    critic = LoraValueModel(policy, rank=4)
    torch.nn.init.normal_(critic.value_head.weight)  # so the values depend on the hidden states
    before = critic(INPUT).detach()
    weight = policy.get_base_model().model.layers[0].mlp.down_proj.base_layer.weight
    with torch.no_grad():
        weight.mul_(2.0)  # in place: the same storage the critic reads
    assert not torch.allclose(critic(INPUT).detach(), before)
    base_storage = {p.data_ptr() for p in policy.parameters()}
    assert not base_storage & {p.data_ptr() for p in critic.parameters()}
    assert not any(key.startswith("policy") or "base_layer" in key for key in critic.state_dict())


def test_the_lora_critic_holds_far_fewer_parameters_than_a_full_copy(policy):
    lora = LoraValueModel(policy, rank=4)
    full = ValueModel.from_policy(policy)
    layers = [m for n, m in policy.get_base_model().model.named_modules()
              if isinstance(m, torch.nn.Linear) and "lora_" not in n]
    expected = sum(4 * (m.in_features + m.out_features) for m in layers) + policy.config.hidden_size + 1
    lora_count = sum(p.numel() for p in lora.parameters())
    assert lora_count == expected
    assert lora_count < sum(p.numel() for p in full.parameters()) / 2


def test_a_critic_step_trains_its_adapters_and_head_and_nothing_of_the_policy(policy):
    critic = LoraValueModel(policy, rank=4)
    base, adapter = _snapshot(_base_weights(policy)), _snapshot(_adapter_weights(policy))
    head = critic.value_head.weight.detach().clone()
    lora_b = {name: p.detach().clone() for name, p in critic.named_parameters() if "lora_B" in name}
    _critic_step(critic)
    assert not torch.equal(critic.value_head.weight, head)
    assert any(not torch.equal(p, lora_b[name]) for name, p in critic.named_parameters() if "lora_B" in name)
    assert all(torch.equal(p, base[name]) for name, p in _base_weights(policy).items())
    assert all(torch.equal(p, adapter[name]) for name, p in _adapter_weights(policy).items())
    assert all(p.grad is None for p in policy.parameters())  # the value loss never reached the policy
    assert all(p.requires_grad for p in _adapter_weights(policy).values())  # and its adapter still trains


def test_the_policys_own_forward_is_unchanged_by_the_critic(policy):
    expected = policy(INPUT).logits.detach()
    critic = LoraValueModel(policy, rank=4)
    _critic_step(critic)
    assert torch.equal(policy(INPUT).logits.detach(), expected)


def test_the_policy_and_the_critic_train_in_one_backward(policy):
    critic = LoraValueModel(policy, rank=4)
    logits = policy(INPUT).logits  # the policy's graph is built first, as in the trainer's update
    values = critic(INPUT)
    (logits.logsumexp(-1).mean() + values.pow(2).mean() + (values - 1).pow(2).mean()).backward()
    assert all(p.grad is not None for p in _adapter_weights(policy).values())
    assert all(p.grad is not None for name, p in critic.named_parameters())


def test_a_saved_lora_critic_loads_on_the_merged_policy_with_the_same_values(policy, tmp_path):
    critic = critic_from_policy(policy, "lora", lora_rank=4)
    _critic_step(critic)
    expected = critic(INPUT).detach()
    critic.save(tmp_path / CRITIC_FILE)
    critic.remove_hooks()
    merged = policy.merge_and_unload()  # what `agent-gym eval` loads from a run's final/
    loaded = ValueModel.load(tmp_path / CRITIC_FILE, merged)
    assert isinstance(loaded, LoraValueModel)
    assert torch.allclose(loaded(INPUT).detach(), expected, atol=1e-5)
