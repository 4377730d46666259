"""bf16_autocast: the update's autocast without peft's fp32 round trip of every adapted layer's input."""

from __future__ import annotations

import torch

from agent_gym.models.precision import bf16_autocast


def _bf16_lora_model() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    # adapters in fp32 on a bf16 base, as peft makes them (and as the trainer trains them)
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))


def _logits_grads_and_saved_bytes(model, context):
    saved: dict[int, int] = {}  # distinct storages kept for the backward pass: their bytes

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.tensor([[5, 9, 13, 2, 7, 11, 3]])
    trained = [p for p in model.parameters() if p.requires_grad]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), context:
        logits = model(input_ids=ids).logits.float()
    grads = torch.autograd.grad(logits.square().mean(), trained)
    return logits, grads, sum(saved.values())


def test_bf16_autocast_gives_bit_identical_results_with_less_saved_for_backward():
    model = _bf16_lora_model()
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    plain = _logits_grads_and_saved_bytes(model, torch.autocast("cpu", dtype=torch.bfloat16))
    ours = _logits_grads_and_saved_bytes(model, bf16_autocast(model, "cpu"))
    assert torch.equal(plain[0], ours[0])
    for a, b in zip(plain[1], ours[1], strict=True):
        assert torch.equal(a, b)
    assert ours[2] < plain[2]  # adapters read the input the base layer keeps, rather than a copy of it


def test_bf16_autocast_restores_peft_input_casting_on_exit():
    # outside autocast a bf16 input must still be cast to the fp32 adapters (generation runs without autocast)
    model = _bf16_lora_model()
    with bf16_autocast(model, "cpu"):
        pass
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()
