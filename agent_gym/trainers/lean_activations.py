"""Keep less for the update's backward pass: each MLP recomputed from its input, each RMSNorm keeping its input
in the model's precision and one scale a token.

What one micro-batch of the RL update keeps for its backward was counted on SmolLM2-135M with LoRA r16 on every
layer in bf16 (benchmarks/README.md): 2.10 GB, of which the MLPs' gate, SiLU and up outputs and the down
projection's input take about 0.86 GB and the RMSNorms' fp32 copies of the residual stream 0.32 GB. The step's peak
memory is the update's. Here:

- **MLP recompute**: each decoder layer's MLP runs under non-reentrant ``torch.utils.checkpoint``, so the backward
  keeps only its input and runs its three projections again. With a frozen base the backward computes no weight
  gradients, so this adds about a third to the update's matmul work (two thirds of a layer's forward FLOPs are its
  MLP's); measured on SmolLM2 (AMD EPYC, one thread), 1.0 GB less at 0.92x the update's speed.
  Attention is left alone: its keys and values are what the group's shared prompt passes to every sample
  (packed_forward.py).
- **Lean RMSNorm**: the same function as HF's Llama / Qwen2 / Qwen3 / Mistral RMSNorm, ``w * (x * rsqrt(mean(x^2) +
  eps)).to(x.dtype)`` computed in fp32, but its backward keeps ``x`` as it came (bf16) and ``rsqrt`` ([T, 1])
  instead of an fp32 copy of ``x``; the gradient, ``rstd * (g - y * mean(g * y))`` with ``y = x * rstd`` and
  ``g`` the gradient reaching the fp32 normalized value, is HF's to float rounding.

Both apply only where autograd records (the update; the MLP recompute in training mode too); rollouts and evals
run without grad and are untouched. ``install_lean_activations`` returns a function that restores the model's own
forwards.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from agent_gym.error import InvalidValue

__all__ = ["LEAN_NORMS", "install_lean_activations"]

# HF RMSNorm classes whose forward is exactly the formula above (Gemma's adds 1 to its weight: not here).
LEAN_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})


class _RMSNorm(torch.autograd.Function):
    """``weight * (x * rstd).to(x.dtype)``, ``rstd = rsqrt(mean(x^2) + eps)`` in fp32, saving ``x`` and ``rstd``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # noqa: ANN001
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:  # noqa: ANN001
        x, weight, rstd = ctx.saved_tensors
        y = x.float() * rstd
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            # HF's autograd: the product's gradient in the output dtype, then the cast's back to fp32.
            g = (grad_out * weight).float()
            grad_x = (rstd * (g - y * (g * y).mean(-1, keepdim=True))).to(x.dtype)
        if ctx.needs_input_grad[1]:  # a full fine-tune trains the norm's weight
            grad_weight = (grad_out * y.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        return grad_x, grad_weight, None


def _lean_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, hidden_states)
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _recomputed_mlp_forward(self: torch.nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
    own = type(self).forward
    if not (torch.is_grad_enabled() and self.training):
        return own(self, *args, **kwargs)
    return checkpoint(own, self, *args, use_reentrant=False, **kwargs)


def _decoder_mlps(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MLP of every decoder layer: a module named ``mlp`` whose class names an MLP (LlamaMLP, Qwen2MLP, ...)."""
    return [module for name, module in model.named_modules()
            if name.rsplit(".", 1)[-1] == "mlp" and type(module).__name__.endswith("MLP")]


def install_lean_activations(model: torch.nn.Module) -> Callable[[], None]:
    """Recompute every decoder MLP in the backward and swap every known RMSNorm for the lean one (instance forwards,
    so parameters, state-dict keys and saved adapters are unchanged). Returns a function that restores them.

    Raises ``InvalidValue`` if the model has neither (an architecture this does not know)."""
    norms = [module for module in model.modules() if type(module).__name__ in LEAN_NORMS]
    mlps = _decoder_mlps(model)
    if not norms and not mlps:
        raise InvalidValue(
            f"lean activations know decoder MLPs named `mlp` and the RMSNorms {sorted(LEAN_NORMS)}; "
            f"{type(model).__name__} has neither"
        )
    for module in norms:
        module.forward = types.MethodType(_lean_norm_forward, module)
    for module in mlps:
        module.forward = types.MethodType(_recomputed_mlp_forward, module)

    def restore() -> None:
        for module in (*norms, *mlps):
            module.__dict__.pop("forward", None)

    return restore
