"""Token log-probs and entropies straight from the decoder's hidden states, never holding ``[tokens, vocab]`` logits.

A policy-gradient update needs, for every response token, ``log pi(token)`` (and, as a statistic or a bonus, the
entropy of the next-token distribution). The usual route materialises the logits of every position, upcasts them to
fp32, divides by the temperature, takes ``log_softmax`` twice (once for the log-probs, once for the entropy) and keeps
the fp32 copies for the backward pass. With SmolLM2's 49,152-token vocabulary that route measured about a third of
an update's CPU time (profile of one 530-token row, Intel Xeon, one thread: the LM head as a ``bmm`` over a copied
``[1, 576, 49152]`` weight because the sliced hidden states are not contiguous, six passes over ``[520, 49152]``
tensors, 0.4 GB kept per row for the backward): 9 of 29 s there, 2.2 of 24 s with this module.

Here the LM head is one 2-D matmul over the response positions only, in chunks of rows (:data:`CHUNK_BYTES` of
fp32 logits each); for each chunk, with ``z = (h W^T) / T`` and ``lse = logsumexp(z)``:

    log pi(y) = z_y - lse                    H = lse - sum_j p_j z_j,   p = exp(z - lse)

Nothing of size ``vocab`` is kept: the backward recomputes each chunk's logits (one more matmul) and applies

    dL/dz_j = g_lp (1[j = y] - p_j)  -  g_H p_j (log p_j + H)          dL/dh = (dL/dz / T) W,  dL/dW = (dL/dz / T)^T h

so memory is ``O(chunk x vocab)`` and the result equals autograd through ``log_softmax`` to float rounding
(tests/test_head_logprobs.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["CHUNK_BYTES", "HeadSplit", "head_logprobs", "split_head"]

# The fp32 logits of one chunk of rows (128 rows of SmolLM2's 49,152 tokens): under glibc's largest mmap threshold
# (32 MiB), so each chunk's buffers are reused from the heap. Chunks of 100 MB were mapped afresh each time, and
# the page faults on first touch made every pass over them 3-4x slower (profiled on an Intel Xeon).
CHUNK_BYTES = 24 * 2**20


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The matmul's dtype: the autocast dtype where autocast is on (as the model's own LM head would run)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


class _HeadLogprobs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (log-probs [N], entropies [N])``, both fp32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
        with_entropy: bool, entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, and costs no pass
        dtype = _compute_dtype(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            logprobs = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
            entropy = torch.zeros_like(logprobs)
            lse = torch.empty_like(logprobs)
            for rows in _chunks(h.shape[0], w.shape[0]):
                z = _chunk_logits(h[rows], w, temperature)
                lse[rows] = torch.logsumexp(z, dim=-1)
                log_p = z.sub_(lse[rows, None])
                logprobs[rows] = log_p.gather(-1, targets[rows, None]).squeeze(-1)
                if with_entropy:  # H = -sum p log p
                    entropy[rows] = -log_p.exp().mul_(log_p).sum(dim=-1)
        ctx.save_for_backward(h, w, targets, lse, entropy)
        ctx.temperature, ctx.dtype = temperature, dtype
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        h, w, targets, lse, entropy = ctx.saved_tensors
        needs_hidden, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(h) if needs_hidden else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if needs_weight else None
        g_lp = grad_logprobs if grad_logprobs is not None else torch.zeros_like(lse)
        with torch.autocast(h.device.type, enabled=False):
            for rows in _chunks(h.shape[0], w.shape[0]):
                log_p = _chunk_logits(h[rows], w, ctx.temperature).sub_(lse[rows, None])
                p = log_p.exp()
                # dL/dz = g_lp (onehot(y) - p) - g_H p (log p + H) = onehot(y) g_lp - p (g_lp + g_H (log p + H))
                if grad_entropy is not None:
                    scale = log_p.add_(entropy[rows, None]).mul_(grad_entropy[rows, None]).add_(g_lp[rows, None])
                    grad_z = p.mul_(scale).neg_()
                else:
                    grad_z = p.mul_(-g_lp[rows, None])
                grad_z.scatter_add_(-1, targets[rows, None], g_lp[rows, None])
                if ctx.temperature != 1.0:
                    grad_z.div_(ctx.temperature)
                grad_z = grad_z.to(ctx.dtype)
                if grad_h is not None:
                    grad_h[rows] = grad_z @ w
                if grad_w is not None:
                    grad_w.add_(grad_z.t() @ h[rows])
        return (
            grad_h.to(ctx.hidden_dtype) if grad_h is not None else None,
            grad_w.to(ctx.weight_dtype) if grad_w is not None else None,
            None, None, None, None,
        )


def _chunks(rows: int, vocab: int) -> list[slice]:
    """Row slices whose fp32 logits stay under :data:`CHUNK_BYTES`."""
    step = max(8, CHUNK_BYTES // (4 * vocab))
    return [slice(start, start + step) for start in range(0, rows, step)]


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    z = (h @ w.t()).float()
    return z.div_(temperature) if temperature != 1.0 else z


def head_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
    entropy: bool = False, entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets[i]`` under ``softmax(hidden[i] @ weight.T / temperature)`` and, with ``entropy``, that
    distribution's entropy (zeros without), for ``hidden [N, H]``, ``weight [V, H]`` (the LM head's), ``targets [N]``.

    Both are fp32 ``[N]``; gradients flow to ``hidden`` and ``weight`` through the log-probs, and through the
    entropies only with ``entropy_grad``. The matmuls run in the autocast dtype where autocast is on.
    """
    return _HeadLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), temperature,
                               entropy, entropy_grad)


@dataclass(frozen=True)
class HeadSplit:
    """A causal LM cut before its LM head: ``decoder(input_ids=...)`` gives the last hidden states and
    ``weight`` is the head's, so that ``logits = hidden @ weight.T`` exactly as the model computes them."""

    decoder: torch.nn.Module
    weight: torch.Tensor


_SPLITS: weakref.WeakKeyDictionary[torch.nn.Module, HeadSplit | None] = weakref.WeakKeyDictionary()


def split_head(model: torch.nn.Module) -> HeadSplit | None:
    """The model's decoder and plain LM head weight, or None where its logits are not ``hidden @ W^T``.

    HF models expose ``get_decoder()`` and ``get_output_embeddings()``, but some scale or soft-cap their logits
    after the head, and a head may carry a bias or an adapter; so the split is used only if it reproduces the
    model's own logits on a few tokens (checked once per model, without gradients).
    """
    if model in _SPLITS:
        return _SPLITS[model]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # see through PEFT
    split = None
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if decoder is not None and type(head) is torch.nn.Linear and head.bias is None:
        split = HeadSplit(decoder=decoder, weight=head.weight)
        if not _reproduces_logits(model, split):
            split = None
    _SPLITS[model] = split
    return split


def _reproduces_logits(model: torch.nn.Module, split: HeadSplit) -> bool:
    ids = torch.arange(1, 9, device=split.weight.device)[None] % split.weight.shape[0]
    with torch.no_grad():
        expected = model(input_ids=ids).logits.float()
        hidden = split.decoder(input_ids=ids).last_hidden_state
        got = F.linear(hidden, split.weight).float()
    return expected.shape == got.shape and torch.allclose(expected, got, rtol=1e-3, atol=1e-3)
