"""GiGPO's anchor states: the turns of a batch, and which of them start from the same state.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978) adds
a step-level advantage to GRPO's episode-level one. Within a group (the episodes of one task), the turns that
start from the same environment state form an *anchor group*; their discounted returns-to-go are compared
with each other (`algorithms.gigpo_advantages` holds the formula). This module finds the turns and their
anchor groups in a `TokenBatch`, from the tokens alone:

- a **turn** is a run of model tokens in a row's response (the policy's tokens between two env replies);
- the **state** before a turn is what the agent has seen so far. ``"observations"`` (the default, GiGPO's
  environment state): the prompt and the env's replies before the turn, so two episodes that made the same
  search, in whatever words they reasoned, reach the same state. ``"context"``: every token before the turn,
  the agent's own tokens included (the exact context the policy conditioned on).

Every first turn of a group starts from the task's prompt, so the whole group is one anchor group there; a
later anchor group holds the episodes whose searches brought back the same pages (e.g. the same first search).
Returns are taken within a row: with a context policy that rewrites the context (several step-level samples
per episode, ``info["context_rewritten"]``), a turn's return counts the rewards of its own sample only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from agent_gym.error import InvalidValue

__all__ = ["ANCHOR_STATES", "AnchorState", "Turns", "find_turns"]

AnchorState = Literal["observations", "context"]
ANCHOR_STATES: tuple[str, ...] = ("observations", "context")


@dataclass(frozen=True)
class Turns:
    """The turns of a batch, one entry per turn, in row order then turn order.

    Attributes:
        row: ``[N]`` the batch row of each turn.
        start: ``[N]`` the position of the turn's first model token.
        end: ``[N]`` one past the last position of the turn's span: the next turn's start, or the row's end
            (the env reply after a turn belongs to its span, for the advantage mask's off setting).
        reward: ``[N]`` the turn's reward (the token rewards over its span).
        anchor: ``[N]`` the anchor group of each turn, numbered from 0: turns of one group (``group_index``)
            starting from the same state.
    """

    row: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    reward: torch.Tensor
    anchor: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.row.numel())

    def returns(self, gamma: float) -> torch.Tensor:
        """``[N]`` discounted return-to-go of each turn within its row: R_k = sum_{j >= k} gamma^(j-k) r_j."""
        returns = torch.zeros_like(self.reward)
        following, previous_row = 0.0, None
        for index in reversed(range(self.count)):
            row = int(self.row[index])
            if row != previous_row:  # the last turn of a row: nothing follows it
                following, previous_row = 0.0, row
            following = float(self.reward[index]) + gamma * following
            returns[index] = following
        return returns


def find_turns(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    token_rewards: torch.Tensor,
    group_index: torch.Tensor,
    state: AnchorState = "observations",
) -> Turns:
    """The turns of a right-padded batch and their anchor groups (see the module docstring)."""
    if state not in ANCHOR_STATES:
        raise InvalidValue(f"anchor state must be one of {ANCHOR_STATES}, got {state!r}")
    ids, model, lengths = input_ids.tolist(), loss_mask.tolist(), attention_mask.sum(dim=1).tolist()
    rewards, groups, prompts = token_rewards.float().cpu(), group_index.tolist(), prompt_lengths.tolist()
    rows, starts, ends, turn_rewards, anchors = [], [], [], [], []
    anchor_of: dict[tuple[int, tuple[int, ...]], int] = {}
    for row in range(len(ids)):
        length, prompt = int(lengths[row]), int(prompts[row])
        row_starts = [
            t for t in range(prompt, length) if model[row][t] and (t == prompt or not model[row][t - 1])
        ]
        for k, start in enumerate(row_starts):
            end = row_starts[k + 1] if k + 1 < len(row_starts) else length
            seen = ids[row][:start] if state == "context" else [
                token for t, token in enumerate(ids[row][:start]) if t < prompt or not model[row][t]
            ]
            key = (int(groups[row]), tuple(seen))
            rows.append(row)
            starts.append(start)
            ends.append(end)
            turn_rewards.append(float(rewards[row, start:end].sum()))
            anchors.append(anchor_of.setdefault(key, len(anchor_of)))
    return Turns(
        row=torch.tensor(rows, dtype=torch.long),
        start=torch.tensor(starts, dtype=torch.long),
        end=torch.tensor(ends, dtype=torch.long),
        reward=torch.tensor(turn_rewards, dtype=torch.float32),
        anchor=torch.tensor(anchors, dtype=torch.long),
    )
