"""The update's forward pass without repeated or wasted tokens: a group's shared prompt once, no padding.

The G samples of a GRPO group start with the same system prompt and question (about 300 of SmolLM2's ~830
tokens an episode of 2-hop SynthHop). A padded ``[B, T]`` forward computes that prefix G times and computes
every row's right padding. Here:

- **shared prefix**: the rows of one group that start with the same tokens run that common prefix once (batch
  1, ``use_cache``); each row then runs only its own suffix against the prefix's keys and values (HF
  ``past_key_values``). Every suffix reads the *same* key/value tensors, so autograd sums their gradients
  into one backward through the prefix: the loss and gradients are those of the padded forward, to float
  rounding (tests/test_batch.py checks both in fp32).
- **no padding**: each row (or suffix) runs at its own length, batch 1. On a CPU a matmul over one row's
  ~500 tokens is already large, so batch 1 costs nothing in throughput, and no token is computed for padding.

Only the positions from ``prompt_length - 1`` on produce logits (the LM head and softmax skip the prompt, as
``logits_to_keep`` does in the padded path). Outputs are ``[B, T]`` like the padded path's, zero on prompt and
padding positions.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent_gym.trainers.losses import entropy_from_logits, token_logprobs

__all__ = ["PackedLogprobs", "packed_logprobs", "shared_prefix_length"]

# A shared prefix shorter than this is not worth a separate forward (its keys/values are computed anyway).
MIN_SHARED_PREFIX = 16


@dataclass(frozen=True)
class PackedLogprobs:
    """Per-token log-probs (with grad where enabled) and, when asked, entropies: ``[B, T]`` each."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    tokens_computed: int  # positions the model ran, prefixes once: the work a padded pass would multiply


def shared_prefix_length(rows: torch.Tensor, lengths: torch.Tensor, prompt_lengths: torch.Tensor) -> int:
    """Tokens every row of ``rows`` (``[n, T]``) starts with, capped so each row keeps the position before its
    first response token in its own suffix (that position's logits predict the first response token)."""
    cap = int(torch.minimum(lengths, prompt_lengths).min()) - 1
    if cap <= 0:
        return 0
    same = (rows[:, :cap] == rows[:1, :cap]).all(dim=0)
    differs = (~same).nonzero()
    return int(differs[0]) if differs.numel() else cap


def _base_forward(model: torch.nn.Module) -> inspect.Signature:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # see through PEFT
    return inspect.signature(base.forward)


def _can_share(model: torch.nn.Module) -> bool:
    """A prefix cache needs ``use_cache``, which HF turns off under gradient checkpointing in training."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return not (model.training and getattr(base, "is_gradient_checkpointing", False))


def _cache_keyword(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the cache argument ``cache`` (``past_key_values`` is deprecated)."""
    return "cache" if "cache" in _base_forward(model).parameters else "past_key_values"


def _prefix_keys_values(model: torch.nn.Module, prefix: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``prefix`` (``[1, P]``) once; its per-layer keys and values (still in the autograd graph)."""
    supported = "logits_to_keep" in _base_forward(model).parameters
    output = model(input_ids=prefix, use_cache=True, **({"logits_to_keep": 1} if supported else {}))
    cache = getattr(output, "past_key_values", None)
    if cache is None:
        cache = output.cache
    return [(layer.keys, layer.values) for layer in cache.layers]


def _suffix_logits(
    model: torch.nn.Module,
    suffix: torch.Tensor,
    keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None,
    keep: int,
) -> torch.Tensor:
    supported = "logits_to_keep" in _base_forward(model).parameters
    kwargs: dict[str, object] = {"logits_to_keep": keep} if supported else {}
    if keys_values is not None:
        from transformers import DynamicCache

        # A fresh cache per suffix: DynamicCache.update concatenates into new tensors, so the shared prefix
        # tensors are read, never changed, and every suffix's gradient flows back into the same ones.
        kwargs[_cache_keyword(model)] = DynamicCache(ddp_cache_data=keys_values, config=model.config)
        kwargs["use_cache"] = True
    logits = model(input_ids=suffix, **kwargs).logits
    return logits if supported else logits[:, -keep:]


def packed_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    prompt_lengths: torch.Tensor,
    group_index: torch.Tensor | None,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> PackedLogprobs:
    """Log-probs of ``input_ids`` (``[B, T]``, right-padded to ``lengths``) per row, without padding.

    Rows with the same ``group_index`` (None: no sharing) that share a prefix of at least
    :data:`MIN_SHARED_PREFIX` tokens run it once. ``entropy`` adds the next-token entropies (with a graph
    only if ``entropy_grad``).
    """
    batch, width = input_ids.shape
    logprob_rows: list[torch.Tensor | None] = [None] * batch
    entropy_rows: list[torch.Tensor | None] = [None] * batch
    computed = 0
    units: list[list[int]]
    if group_index is None or not _can_share(model):
        units = [[row] for row in range(batch)]
    else:
        groups: dict[int, list[int]] = {}
        for row, group in enumerate(group_index.tolist()):
            groups.setdefault(int(group), []).append(row)
        units = list(groups.values())
    for rows in units:
        shared = 0
        if len(rows) > 1:
            index = torch.tensor(rows, device=input_ids.device)
            shared = shared_prefix_length(input_ids[index], lengths[index], prompt_lengths[index])
        keys_values = None
        if shared >= MIN_SHARED_PREFIX:
            keys_values = _prefix_keys_values(model, input_ids[rows[0] : rows[0] + 1, :shared])
            computed += shared
        else:
            shared = 0
        for row in rows:
            length, first = int(lengths[row]), max(int(prompt_lengths[row]) - 1, 0)
            suffix = input_ids[row : row + 1, shared:length]
            computed += suffix.shape[1]
            logits = _suffix_logits(model, suffix, keys_values, keep=length - first)
            targets = input_ids[row : row + 1, first:length]
            pad = (first, width - length)
            logprob_rows[row] = F.pad(token_logprobs(logits, targets, temperature), pad)[0]
            if entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    entropy_rows[row] = F.pad(entropy_from_logits(logits, temperature), pad)[0]
    logprobs = torch.stack(logprob_rows)  # type: ignore[arg-type]
    entropies = torch.stack(entropy_rows) if entropy else None  # type: ignore[arg-type]
    return PackedLogprobs(logprobs=logprobs, entropy=entropies, tokens_computed=computed)
