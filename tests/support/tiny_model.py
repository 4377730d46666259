"""A 2-layer Qwen2 model and its tokenizer, built in about a second, for trainer tests that need a real model."""

from __future__ import annotations

from typing import Any

import torch


def tiny_model_and_tokenizer(texts: list[str], hidden_size: int = 32, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """A random model and a BPE tokenizer trained on ``texts`` (fp32, on the CPU)."""
    from agent_gym.models.model_init import ModelPreset, build_model, train_tokenizer

    tokenizer = train_tokenizer(texts * 4, vocab_size=320)
    preset = ModelPreset(320, hidden_size, 2 * hidden_size, 2, 2, 1, 1024)
    return build_model(preset, tokenizer, seed=seed), tokenizer
