"""A LoRA-wrapped policy's weights with its adapters folded in, computed without touching the policy.

Samplers (our fast decoder, vLLM) run a plain model: per step that is far cheaper than peft's extra adapter
matmuls, and it keeps the decoder's fused fast path and prefix cache. peft's own ``merge_adapter()`` followed by
``unmerge_adapter()`` adds and subtracts the delta in place, which in a bf16 base drifts the frozen weights by
a rounding error every sync; here the merged copy is computed aside, ``W0 + scale * B @ A`` in fp32, then cast.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["is_peft_model", "merged_tensors"]


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


@torch.no_grad()
def merged_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in the plain model's checkpoint naming, each adapter's delta added to its base weight;
    a model without adapters yields its own state dict."""
    if not is_peft_model(model):
        yield from ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        return
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        get_delta = getattr(module, "get_delta_weight", None)
        if callable(get_delta) and hasattr(module, "base_layer") and module.active_adapters:
            delta = sum(get_delta(adapter).float() for adapter in module.active_adapters if adapter in module.lora_A)
            deltas[f"{name}.weight"] = delta
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        delta = deltas.get(plain)
        yield plain, tensor.detach() if delta is None else (tensor.float() + delta).to(tensor.dtype)
