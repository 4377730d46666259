"""Next-token loss of weighted rows: the one supervised loss of pretraining and SFT.

A row carries a loss weight per token: 1 on the tokens to imitate (assistant turns, the copied part of a
drill), 0 on pure context, something in between where the context is worth a little practice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent_gym.error import InvalidValue
from agent_gym.trainers.head_logprobs import head_logprobs, split_head

__all__ = ["WeightedRow", "weighted_lm_loss"]


@dataclass(frozen=True)
class WeightedRow:
    """One training row: token ids, and the loss weight of predicting each of them (0: context only)."""

    input_ids: list[int]
    weights: list[float]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.weights):
            raise InvalidValue(f"input_ids ({len(self.input_ids)}) and weights ({len(self.weights)}) differ in length")


def weighted_lm_loss(model: torch.nn.Module, rows: Sequence[WeightedRow], pad_id: int,
                     max_length: int | None = None) -> torch.Tensor:
    """sum_t w_t * -log p(x_t | x_<t) / sum_t w_t over the rows, right-padded into one batch.

    No attention mask: in a causal model no real token attends to the padding after it, and SDPA keeps its
    causal fast path (the trainer does the same, see ``Trainer._response_logits``).
    """
    width = max(len(row.input_ids) for row in rows)
    width = min(width, max_length) if max_length else width
    device = next(model.parameters()).device
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(rows), width), dtype=torch.float32)
    for index, row in enumerate(rows):
        length = min(len(row.input_ids), width)
        input_ids[index, :length] = torch.tensor(row.input_ids[:length])
        weights[index, :length] = torch.tensor(row.weights[:length])
    input_ids, weights = input_ids.to(device), weights.to(device)
    split = split_head(model)
    if split is not None:
        # Only the (row, position) pairs that predict a weighted token meet the LM head, in chunks, never as
        # full-vocabulary logits (head_logprobs.py)
        rows_at, positions_at = (weights[:, 1:] > 0).nonzero(as_tuple=True)
        hidden = split.decoder(input_ids=input_ids).last_hidden_state[rows_at, positions_at]
        logprobs, _ = head_logprobs(hidden, split.weight, input_ids[rows_at, positions_at + 1])
        picked_weights = weights[rows_at, positions_at + 1]
        return -(logprobs * picked_weights).sum() / picked_weights.sum().clamp(min=1e-9)
    # Only positions that predict a weighted token go through the LM head: an agent's context is mostly prompt and
    # tool output, and full-vocabulary logits of every position dominated SFT's memory (9 GB for 4 SmolLM2 rows).
    positions = (weights[:, 1:] > 0).any(0).nonzero().squeeze(-1)
    if _supports_logits_to_keep(model):
        logits = model(input_ids=input_ids, logits_to_keep=positions).logits.float()
    else:
        logits = model(input_ids=input_ids).logits[:, positions].float()
    targets, target_weights = input_ids[:, positions + 1], weights[:, positions + 1]  # predicting t+1 from t
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    target_weights = target_weights.reshape(-1)
    return (nll * target_weights).sum() / target_weights.sum().clamp(min=1e-9)


def _supports_logits_to_keep(model: torch.nn.Module) -> bool:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # see through PEFT
    return "logits_to_keep" in inspect.signature(base.forward).parameters
