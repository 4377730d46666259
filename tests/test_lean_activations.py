"""Lean activations (trainers/lean_activations.py): the same forward and gradients as the model's own layers, less
kept for the backward, and nothing changed where autograd does not record."""

from __future__ import annotations

import pytest
import torch

from agent_gym.trainers.lean_activations import install_lean_activations


def _tiny_llama(layers: int = 2) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    # SmolLM2's shape ratios: intermediate 8/3 of hidden, 3 query heads a key/value head
    config = LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=128)
    return AutoModelForCausalLM.from_config(config).float()


def _with_lora(model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(1)
    for name, p in lora.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the adapters a gradient path of their own
            torch.nn.init.normal_(p, std=0.05)
    return lora


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from agent_gym.trainers.packed_forward import packed_logprobs

    model.zero_grad(set_to_none=True)
    lengths = torch.tensor([40, 33, 37])
    prompts = torch.tensor([12, 12, 12])
    packed = packed_logprobs(model, ids, lengths, prompts, torch.zeros(3, dtype=torch.long))
    loss = -packed.logprobs.sum() / lengths.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rows() -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 101, (3, 40), generator=generator)
    ids[:, :12] = ids[0, :12]  # one group: a shared 12-token prompt
    return ids


def _saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of one forward (each storage once)."""
    from agent_gym.trainers.packed_forward import packed_logprobs

    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):  # parameters are held anyway
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    # (a recomputed MLP's checkpoint saves its input through these hooks too)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        packed = packed_logprobs(model, ids, torch.tensor([40, 33, 37]), torch.tensor([12, 12, 12]),
                                 torch.zeros(3, dtype=torch.long))
    packed.logprobs.sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train_weight", [False, True])
def test_lean_rmsnorm_is_hfs_forward_exactly_and_its_gradients_to_rounding(dtype, train_weight):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.5 + 1)
    norm.weight.requires_grad_(train_weight)
    x = (torch.randn(2, 9, 64) * 3).to(dtype)
    grad_out = torch.randn(2, 9, 64).to(dtype)

    def run(lean: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        norm.weight.grad = None
        inputs = x.clone().requires_grad_(True)
        restore = install_lean_activations(norm) if lean else (lambda: None)
        out = norm(inputs)
        out.backward(grad_out)
        restore()
        return out.detach(), inputs.grad, norm.weight.grad

    own, lean = run(False), run(True)
    assert lean[0].dtype == own[0].dtype and torch.equal(lean[0], own[0])
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(lean[1], own[1], **tolerance)
    if train_weight:
        torch.testing.assert_close(lean[2], own[2], **tolerance)
    else:
        assert lean[2] is None and own[2] is None


@pytest.mark.parametrize("lora", [False, True])
def test_lean_model_gives_the_same_loss_and_gradients_and_keeps_less(lora):
    model = _tiny_llama()
    model = _with_lora(model) if lora else model
    model.train()
    ids = _rows()
    loss, grads = _loss_and_grads(model, ids)
    kept = _saved_bytes(model, ids)

    restore = install_lean_activations(model)
    lean_loss, lean_grads = _loss_and_grads(model, ids)
    lean_kept = _saved_bytes(model, ids)

    torch.testing.assert_close(lean_loss, loss, rtol=1e-6, atol=1e-6)
    assert lean_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-4, atol=1e-6)
    # the MLPs' three wide intermediates and the norms' fp32 copies no longer kept (measured 0.4 here)
    assert lean_kept < 0.7 * kept

    restore()
    assert all("forward" not in module.__dict__ for module in model.modules())
    assert _saved_bytes(model, ids) == kept


def test_lean_activations_leave_no_grad_passes_and_the_state_dict_alone():
    model = _tiny_llama().eval()
    ids = _rows()
    keys = list(model.state_dict())
    with torch.no_grad():
        before = model(input_ids=ids).logits
    install_lean_activations(model)
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.equal(after, before)
    assert list(model.state_dict()) == keys


def test_an_architecture_without_known_norms_or_mlps_is_a_clear_error():
    from agent_gym.error import InvalidValue

    with pytest.raises(InvalidValue, match="neither"):
        install_lean_activations(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)))


def test_lean_activations_with_a_lora_critic_is_a_config_error():
    from agent_gym.trainers.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="lean_activations"):
        TrainConfig(model="m", algo="ppo", critic="lora", lora_rank=8, lean_activations=True).validate()
