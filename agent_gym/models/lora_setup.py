"""Fresh LoRA adapters for a model, the one recipe RL (`Trainer`) and SFT (`SFTTrainer`) share.

``top_layers`` puts the adapters on the top N decoder layers only: nothing below the lowest of them needs a
gradient, so autograd records no graph there and the backward pass stops at that layer (no ``torch.no_grad``
needed: the hidden states below require no grad). peft takes ``layers_to_transform`` only with named target
modules, so ``all-linear`` is spelled out as the decoder layers' linear module names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agent_gym.error import InvalidValue

__all__ = ["add_lora", "lora_config"]


def lora_config(model: torch.nn.Module, *, rank: int, alpha: int, dropout: float = 0.0,
                targets: str | Sequence[str] = "all-linear", top_layers: int = 0) -> Any:
    """peft's ``LoraConfig`` for ``model``: rank, alpha, dropout, target modules, and optionally the top layers."""
    from peft import LoraConfig

    modules: Any = "all-linear" if list(targets) == ["all-linear"] or targets == "all-linear" else list(targets)
    layers = None
    if top_layers:
        total = int(model.config.num_hidden_layers)
        if not 0 < top_layers <= total:
            raise InvalidValue(f"lora_layers={top_layers} must be between 1 and the model's {total} layers")
        layers = list(range(total - top_layers, total))
        if modules == "all-linear":
            modules = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                              if isinstance(module, torch.nn.Linear) and ".layers." in name})
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=modules,
                      layers_to_transform=layers, task_type="CAUSAL_LM")


def add_lora(model: torch.nn.Module, **settings: Any) -> torch.nn.Module:
    """``model`` wrapped with fresh trainable adapters (`lora_config`'s settings); its own weights frozen."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(model, **settings))
