"""Host memory of training: a step's freed heap goes back to the OS, and SFT can trade time for activation
memory with gradient checkpointing without changing its updates."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from agent_gym.models.host_memory import release_freed_memory, resident_mb
from agent_gym.trainers.token_episode import tokenize_episode
from agent_gym.warmstart.sft import SFTConfig, prepare_sft_model, train_sft

# Freeing one 16 MB block lifts glibc's mmap threshold, so the 1 MB blocks after it come from the heap; every other
# one stays alive, so the freed ones sit between live blocks, where free() alone never returns them.
FRAGMENTED_HEAP = """
from agent_gym.models.host_memory import release_freed_memory, resident_mb
big = bytearray(16 * 2**20); del big
blocks = [bytearray(2**20 + 4096 * (i % 7)) for i in range(600)]
pinned = blocks[1::2]; del blocks
held = resident_mb(); released = release_freed_memory(); after = resident_mb()
print(held, after, released)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory is read from /proc (Linux)")
def test_released_memory_leaves_the_process_while_live_blocks_stay() -> None:
    completed = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, timeout=120)
    held, after, released = completed.stdout.split()
    if released != "True":
        pytest.skip("this C library has no malloc_trim (not glibc)")
    # about 300 MB of freed blocks were held; the 300 MB still referenced stay
    assert float(held) - float(after) > 200
    assert release_freed_memory() is True and resident_mb() > 0


def test_sft_with_gradient_checkpointing_makes_the_same_updates(tiny_model) -> None:
    import copy

    from agent_gym.trainers.head_logprobs import split_head

    model, tokenizer = tiny_model
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<answer>abc</answer>"}]
    examples = [tokenize_episode(tokenizer, messages)] * 4
    runs, forwards = {}, {}
    for checkpointing in (False, True):
        config = SFTConfig(epochs=3, batch_size=2, lr=3e-3, warmup_steps=1, lora_rank=4,
                           gradient_checkpointing=checkpointing)
        torch.manual_seed(0)  # the same LoRA A matrices in both runs
        lora_model = prepare_sft_model(copy.deepcopy(model), config)
        split_head(lora_model)  # checked once per model (two short forwards), before the counted training
        calls = []
        # the layer's MLP, not the layer: transformers >= 5.24 recomputes a layer's forward, not its __call__ (whose
        # hooks would then fire once), and the submodules it calls run through their hooks either way
        mlp = lora_model.base_model.model.model.layers[0].mlp
        mlp.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        runs[checkpointing] = (train_sft(lora_model, tokenizer, examples, config), lora_model)
        forwards[checkpointing] = len(calls)
    (plain, _), (recomputed, recomputed_model) = runs[False], runs[True]
    assert forwards == {False: 6, True: 12}  # 6 steps; checkpointing runs each layer again in the backward pass
    assert recomputed == pytest.approx(plain, rel=1e-4) and recomputed[-1] < plain[0]
    assert not recomputed_model.base_model.model.is_gradient_checkpointing  # the trained model plays as usual
    torch.testing.assert_close(
        {n: p for n, p in recomputed_model.named_parameters() if p.requires_grad},
        {n: p for n, p in runs[False][1].named_parameters() if p.requires_grad}, rtol=1e-4, atol=1e-5)
