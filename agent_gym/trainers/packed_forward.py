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

Only the positions from ``prompt_length - 1`` on meet the LM head (it skips the prompt, as ``logits_to_keep`` does
in the padded path), and where the model splits into decoder and plain head (head_logprobs.py) their log-probs and
entropies come from the hidden states in chunks, never as full-vocabulary logits. Outputs are ``[B, T]`` like the
padded path's, zero on prompt and padding positions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent_gym.trainers.head_logprobs import HeadSplit, head_logprobs, split_head
from agent_gym.trainers.losses import entropy_from_logits, token_logprobs

__all__ = ["PackedLogprobs", "packed_logprobs", "packed_values", "shared_prefix_length"]

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
    # transformers 5.x renamed the flag (the old name warns); either means the layers are checkpointed
    flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return not (model.training and getattr(base, flag, False))


def cache_keyword(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the cache argument ``cache`` (``past_key_values`` is deprecated)."""
    return "cache" if "cache" in _base_forward(model).parameters else "past_key_values"


def _units(model: torch.nn.Module, group_index: torch.Tensor | None, batch: int) -> list[list[int]]:
    """The rows that may share a prefix: each group's (``group_index``), or each row alone."""
    if group_index is None or not _can_share(model):
        return [[row] for row in range(batch)]
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(group_index.tolist()):
        groups.setdefault(int(group), []).append(row)
    return list(groups.values())


def _shared_prefix(
    model: torch.nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor, prompt_lengths: torch.Tensor,
    rows: list[int],
) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
    """The prefix the ``rows`` share, run once: its length and keys/values (``0, None`` when too short to pay)."""
    if len(rows) < 2:
        return 0, None
    index = torch.tensor(rows, device=input_ids.device)
    shared = shared_prefix_length(input_ids[index], lengths[index], prompt_lengths[index])
    if shared < MIN_SHARED_PREFIX:
        return 0, None
    return shared, _prefix_keys_values(model, input_ids[rows[0] : rows[0] + 1, :shared])


def _prefix_keys_values(model: torch.nn.Module, prefix: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``prefix`` (``[1, P]``) once; its per-layer keys and values (still in the autograd graph). ``model`` is a
    causal LM or a bare decoder (a critic's body)."""
    split = split_head(model)
    if split is not None:  # no LM head at all
        output = split.decoder(input_ids=prefix, use_cache=True)
    else:
        supported = "logits_to_keep" in _base_forward(model).parameters
        output = model(input_ids=prefix, use_cache=True, **({"logits_to_keep": 1} if supported else {}))
    cache = getattr(output, "past_key_values", None)
    if cache is None:
        cache = output.cache
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_kwargs(
    module: torch.nn.Module, config: object, keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None
) -> dict[str, object]:
    if keys_values is None:
        return {}
    from transformers import DynamicCache

    # A fresh cache per suffix: DynamicCache.update concatenates into new tensors, so the shared prefix tensors
    # are read, never changed, and every suffix's gradient flows back into the same ones.
    return {cache_keyword(module): DynamicCache(ddp_cache_data=keys_values, config=config), "use_cache": True}


def _suffix_logits(
    model: torch.nn.Module,
    suffix: torch.Tensor,
    keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None,
    keep: int,
) -> torch.Tensor:
    supported = "logits_to_keep" in _base_forward(model).parameters
    kwargs: dict[str, object] = {"logits_to_keep": keep} if supported else {}
    logits = model(input_ids=suffix, **kwargs, **_cache_kwargs(model, model.config, keys_values)).logits
    return logits if supported else logits[:, -keep:]


def _suffix_scores(
    model: torch.nn.Module,
    split: HeadSplit | None,
    suffix: torch.Tensor,
    keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None,
    targets: torch.Tensor,
    temperature: float,
    entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[keep]`` log-probs (and entropies) of one row's ``targets`` (its tokens from ``prompt_length - 1`` on; the
    first gets 0, as ``token_logprobs`` aligns them), from the suffix run against the prefix's keys and values."""
    keep = targets.shape[0]
    if split is None:
        logits = _suffix_logits(model, suffix, keys_values, keep)
        logprobs = token_logprobs(logits, targets[None], temperature)[0]
        if not entropy:
            return logprobs, None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            return logprobs, entropy_from_logits(logits, temperature)[0]
    hidden = split.decoder(input_ids=suffix, **_cache_kwargs(split.decoder, model.config, keys_values))
    # position t predicts token t + 1: the last hidden state predicts nothing here
    states = hidden.last_hidden_state[0, -keep:-1]
    logprobs, entropies = head_logprobs(states, split.weight, targets[1:], temperature, entropy=entropy,
                                        entropy_grad=entropy_grad and torch.is_grad_enabled())
    return F.pad(logprobs, (1, 0)), F.pad(entropies, (1, 0)) if entropy else None


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
    split = split_head(model)
    for rows in _units(model, group_index, batch):
        shared, keys_values = _shared_prefix(model, input_ids, lengths, prompt_lengths, rows)
        computed += shared
        for row in rows:
            length, first = int(lengths[row]), max(int(prompt_lengths[row]) - 1, 0)
            suffix = input_ids[row : row + 1, shared:length]
            computed += suffix.shape[1]
            logprobs, entropies = _suffix_scores(model, split, suffix, keys_values, input_ids[row, first:length],
                                                 temperature, entropy, entropy_grad)
            pad = (first, width - length)
            logprob_rows[row] = F.pad(logprobs, pad)
            if entropies is not None:
                entropy_rows[row] = F.pad(entropies, pad)
    logprobs = torch.stack(logprob_rows)  # type: ignore[arg-type]
    entropies = torch.stack(entropy_rows) if entropy else None  # type: ignore[arg-type]
    return PackedLogprobs(logprobs=logprobs, entropy=entropies, tokens_computed=computed)


def packed_values(
    body: torch.nn.Module,
    head: Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    prompt_lengths: torch.Tensor,
    group_index: torch.Tensor | None,
) -> torch.Tensor:
    """A critic's ``[B, T]`` values of ``input_ids`` (right-padded to ``lengths``) without padding, a group's shared
    prefix once: ``values[:, t] = head(h[t - 1])`` for the response positions ``prompt_length <= t < length``, 0
    elsewhere, where GAE and the value loss never read (they read action tokens only).

    ``body`` is the decoder without an LM head; ``head`` maps ``[n, H]`` hidden states to ``[n]`` values. A padded
    ``[B, T]`` pass through SmolLM2 kept a ``T x T`` attention map a row and layer for the backward pass (a PPO run
    of the real model was OOM-killed at 17 GB, issue 25); one row at a time runs causal attention without a mask.
    """
    batch, width = input_ids.shape
    value_rows: list[torch.Tensor | None] = [None] * batch
    for rows in _units(body, group_index, batch):
        shared, keys_values = _shared_prefix(body, input_ids, lengths, prompt_lengths, rows)
        for row in rows:
            length, first = int(lengths[row]), max(int(prompt_lengths[row]) - 1, 0)
            suffix = input_ids[row : row + 1, shared:length]
            hidden = body(input_ids=suffix, **_cache_kwargs(body, body.config, keys_values)).last_hidden_state
            values = head(hidden[0, first - shared : length - shared - 1])  # h[first .. length - 2]
            value_rows[row] = F.pad(values, (first + 1, width - length))
    return torch.stack(value_rows)  # type: ignore[arg-type]
