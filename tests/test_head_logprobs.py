"""head_logprobs: log-probs and entropies from hidden states in chunks, equal to autograd through log_softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agent_gym.trainers import head_logprobs as module
from agent_gym.trainers.head_logprobs import head_logprobs, split_head


def _reference(hidden, weight, targets, temperature):
    log_p = F.log_softmax((hidden @ weight.t()).float() / temperature, dim=-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_log_probs_entropies_and_every_gradient_match_autograd_across_chunks(monkeypatch, temperature, entropy_grad):
    monkeypatch.setattr(module, "CHUNK_BYTES", 8 * 4 * 13)  # 8 rows a chunk, 19 rows: the last one short
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(19, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (19,), generator=generator)
    g_lp, g_h = torch.randn(19, generator=generator), torch.randn(19, generator=generator)

    logprobs, entropy = head_logprobs(hidden, weight, targets, temperature, entropy=True, entropy_grad=entropy_grad)
    ref_logprobs, ref_entropy = _reference(hidden, weight, targets, temperature)
    torch.testing.assert_close(logprobs, ref_logprobs.float())
    torch.testing.assert_close(entropy, ref_entropy.float())

    loss = (logprobs * g_lp).sum() + ((entropy * g_h).sum() if entropy_grad else 0)
    ref_loss = (ref_logprobs * g_lp).sum() + ((ref_entropy * g_h).sum() if entropy_grad else 0)
    grads = torch.autograd.grad(loss, (hidden, weight))
    ref_grads = torch.autograd.grad(ref_loss, (hidden, weight))
    for got, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_entropy_without_entropy_grad_carries_no_gradient_and_zeros_without_entropy():
    hidden = torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(5, 4)
    logprobs, entropy = head_logprobs(hidden, weight, torch.tensor([0, 1, 4]), entropy=True)
    assert logprobs.requires_grad and not entropy.requires_grad
    assert (entropy > 0).all()
    _, none = head_logprobs(hidden, weight, torch.tensor([0, 1, 4]))
    assert (none == 0).all()


def test_under_bf16_autocast_the_head_runs_in_bf16_and_gradients_keep_their_dtypes():
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 16, generator=generator, requires_grad=True)
    weight = torch.randn(32, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 32, (6,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = head_logprobs(hidden, weight, targets)
        reference = F.log_softmax(F.linear(hidden, weight).float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, reference)  # both from the same bf16 logits
    logprobs.sum().backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32


def _tiny_llama(**config_overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         **config_overrides)
    return AutoModelForCausalLM.from_config(config).float()


def test_split_head_cuts_a_plain_causal_lm_and_sees_through_lora():
    from peft import LoraConfig, get_peft_model

    model = _tiny_llama(tie_word_embeddings=True)
    split = split_head(model)
    assert split is not None and split.weight is model.get_input_embeddings().weight
    lora = get_peft_model(_tiny_llama(), LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    split = split_head(lora)
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():  # the adapters are in the decoder's path: hidden @ W^T is the adapted model's logits
        torch.testing.assert_close(F.linear(split.decoder(input_ids=ids).last_hidden_state, split.weight),
                                   lora(input_ids=ids).logits)


def test_split_head_refuses_a_head_whose_logits_are_not_hidden_times_weight():
    model = _tiny_llama()
    model.lm_head.bias = torch.nn.Parameter(torch.ones(61))  # a bias: not a plain head
    assert split_head(model) is None
    scaled = _tiny_llama()
    original = scaled.forward

    def forward(*args, **kwargs):  # a model that scales its logits after the head (as Cohere does)
        output = original(*args, **kwargs)
        output.logits = output.logits * 0.5
        return output

    scaled.forward = forward
    assert split_head(scaled) is None
