"""The records of one training step's data path, from padded tokens to advantages (docs/DESIGN.md §7).

    trajectories --collate()--> TokenBatch --Trainer.score()--> ScoredBatch --ESTIMATORS[algo]--> Advantages

Each record is a frozen dataclass of tensors whose first dimension is the batch row. A stage never edits the
record it reads: it builds the next one. `UpdateBatch` holds the three records an optimizer step reads, and
`rows(index)` / `trimmed()` cut every tensor of a record alike, for mini- and micro-batches.

Per-token tensors are ``[B, T]``, right-padded and aligned with ``input_ids`` position by position: the value
for the token at ``input_ids[i, t]`` sits at ``[i, t]``, and is zero on prompt and padding positions.

The masks have one name each, everywhere in agent_gym (the adapters map them to other libraries' names once):

- ``loss_mask``: 1 on the tokens the policy sampled, 0 on the tokens the env inserted (docs/DESIGN.md §7). It is
  verl's ``response_mask`` and TRL's ``env_mask`` (adapters/verl.py, adapters/trl.py).
- ``response_mask``: 1 on every response token, sampled or inserted (verl has no name for it).
- ``advantage_mask``: the tokens an estimator gives an advantage: ``loss_mask`` with Agent-R1's advantage mask on
  (the default), ``response_mask`` with it off (Table 4).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Self

import torch

__all__ = ["Advantages", "ScoredBatch", "TokenBatch", "UpdateBatch"]


class _Rows:
    """What the records share: every field is a tensor with the batch row first, None, or another record."""

    def _map(self, fn: Any) -> Self:
        changes = {}
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if isinstance(value, _Rows):
                changes[item.name] = value._map(fn)
            elif isinstance(value, torch.Tensor):
                changes[item.name] = fn(value)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def rows(self, index: torch.Tensor | slice) -> Self:
        """The same record for the rows ``index`` selects (a slice, or a tensor of row numbers)."""
        return self._map(lambda tensor: tensor[index])

    def narrowed(self, width: int) -> Self:
        """The same record with every per-token tensor cut to its first ``width`` positions."""
        return self._map(lambda tensor: tensor[:, :width] if tensor.dim() == 2 else tensor)

    def to(self, device: torch.device | str) -> Self:
        return self._map(lambda tensor: tensor.to(device))


@dataclass(frozen=True)
class TokenBatch(_Rows):
    """Trajectories padded into one batch by `collate`, for a causal-LM forward pass.

    Attributes:
        input_ids: ``[B, T]`` prompt then response tokens, right-padded.
        attention_mask: ``[B, T]`` 1 on real tokens, 0 on padding.
        response_mask: ``[B, T]`` 1 on every response token, sampled by the policy or inserted by the env.
        loss_mask: ``[B, T]`` 1 on the tokens the policy sampled (docs/DESIGN.md §7), 0 on env tokens: the
            trajectories' ``loss_mask``, padded.
        sampling_logprobs: ``[B, T]`` the sampler's log-prob of each model token (0 elsewhere). The log-prob of
            the token at position t comes from the logits at t - 1.
        token_rewards: ``[B, T]`` each turn's reward on that turn's last model token.
        prompt_lengths: ``[B]`` where each row's response starts.
        episode_returns: ``[B]`` the return of the episode a row belongs to (every step-level sample of an
            episode carries it).
        group_index: ``[B]`` the group of each row, numbered from 0: the episodes of one task in this batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    prompt_lengths: torch.Tensor
    episode_returns: torch.Tensor
    group_index: torch.Tensor

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def model_token_mask(self) -> torch.Tensor:
        """Deprecated name of `loss_mask` (kept for one release)."""
        warnings.warn("TokenBatch.model_token_mask is deprecated: read TokenBatch.loss_mask", DeprecationWarning,
                      stacklevel=2)
        return self.loss_mask

    def longest_row(self) -> int:
        """The length of the longest row, padding excluded."""
        return int(self.attention_mask.sum(dim=1).max())

    def trimmed(self) -> TokenBatch:
        """Cut to the longest row (right padding past it is waste in a forward pass)."""
        return self.narrowed(self.longest_row())


@dataclass(frozen=True)
class ScoredBatch(_Rows):
    """What the trainer computes on a `TokenBatch` before the update, without gradients (``[B, T]`` each).

    Attributes:
        old_logprobs: the policy's log-probs before this step's first optimizer step (the PPO ratio's
            denominator); None when the update's own first forward serves (one epoch, one mini-batch).
        ref_logprobs: the reference model's log-probs; None when no KL term needs them.
        values: the critic's V(state before each token); None without a critic.
    """

    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None


@dataclass(frozen=True)
class Advantages(_Rows):
    """What an advantage estimator returns (``[B, T]`` each, zero outside ``advantage_mask``).

    Attributes:
        advantages: the advantage of each token.
        advantage_mask: the tokens given an advantage: ``loss_mask`` (the model tokens), or every response token
            with the advantage mask off (Agent-R1 Table 4).
        returns: the critic's regression targets (PPO); None for critic-free estimators.
    """

    advantages: torch.Tensor
    advantage_mask: torch.Tensor
    returns: torch.Tensor | None = None

    @property
    def action_mask(self) -> torch.Tensor:
        """Deprecated name of `advantage_mask` (kept for one release)."""
        warnings.warn("Advantages.action_mask is deprecated: read Advantages.advantage_mask", DeprecationWarning,
                      stacklevel=2)
        return self.advantage_mask


@dataclass(frozen=True)
class UpdateBatch(_Rows):
    """Everything an optimizer step reads, sliced together."""

    tokens: TokenBatch
    scored: ScoredBatch
    targets: Advantages

    @property
    def size(self) -> int:
        return self.tokens.size

    def trimmed(self) -> UpdateBatch:
        """Cut to the longest row (right padding past it is waste in a forward pass)."""
        return self.narrowed(self.tokens.longest_row())
