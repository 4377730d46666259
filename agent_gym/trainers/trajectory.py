"""Token-level trajectory records and their collation into padded training tensors.

A `Trajectory` is one step-level sample (Agent-R1 v0.1): a prompt, then a response made of the tokens the
policy sampled interleaved with the tokens the environment inserted (tool results rendered with the chat
template). Only model-sampled tokens carry `loss_mask = 1`; env tokens carry `loss_mask = 0` and a sampling
log-prob of 0.0. Rewards are per turn and are placed on the turn's last model token (docs/DESIGN.md §7).
`collate` pads trajectories into a `TokenBatch` (batch.py), the first record of the trainer's data path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agent_gym.contract import ANSWER, EVIDENCE_RECALL, GOLD_ANSWERS, REWARD_COMPONENTS, TASK_ID
from agent_gym.episode_summary import EpisodeSummary, as_number
from agent_gym.error import InvalidValue
from agent_gym.trainers.batch import TokenBatch


@dataclass
class Trajectory:
    """One sampled (multi-turn) episode segment, as exact token ids.

    Attributes:
        prompt_ids: the context the first turn was sampled from (chat-template rendered, generation prompt
            included).
        response_ids: model-sampled tokens and env observation tokens, in order.
        loss_mask: 1 for model-sampled tokens, 0 for env-inserted tokens; same length as `response_ids`.
        sampling_logprobs: log-prob of each sampled token under the sampling policy (0.0 on env tokens).
        turn_end_indices: index in `response_ids` of each turn's last model token.
        turn_rewards: the env reward of each turn, aligned with `turn_end_indices`.
        outcome: the episode's return, the sum of its turn rewards (every step-level sample of the episode
            carries the same value).
        group_id: GRPO group key (all episodes of one task in one batch share it).
        info: free-form metadata (task_id, finish reasons, reward components, number of tool calls, ...).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    turn_end_indices: list[int]
    turn_rewards: list[float]
    outcome: float
    group_id: str
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.sampling_logprobs) != n:
            raise InvalidValue(
                f"response_ids ({n}), loss_mask ({len(self.loss_mask)}) and sampling_logprobs "
                f"({len(self.sampling_logprobs)}) must have the same length"
            )
        if len(self.turn_end_indices) != len(self.turn_rewards):
            raise InvalidValue(
                f"turn_end_indices ({len(self.turn_end_indices)}) and turn_rewards "
                f"({len(self.turn_rewards)}) must have the same length"
            )
        for index in self.turn_end_indices:
            if not 0 <= index < n or self.loss_mask[index] != 1:
                raise InvalidValue(f"turn_end_index {index} is not a model token of the response")

    @property
    def num_turns(self) -> int:
        return len(self.turn_end_indices)

    def token_rewards(self) -> list[float]:
        """Per-response-token rewards: each turn's reward on its last model token, 0 elsewhere."""
        rewards = [0.0] * len(self.response_ids)
        for index, reward in zip(self.turn_end_indices, self.turn_rewards, strict=True):
            rewards[index] += reward
        return rewards


def episode_summary(trajectory: Trajectory) -> EpisodeSummary:
    """The `EpisodeSummary` of a trajectory's episode, read back from its info (the collector writes the keys:
    ``turns``, ``episode_tool_calls``, ``valid_tool_calls``, ``em``, ``f1``, ``truncated_by``...; ``em``/``f1``
    fall back on the env's ``reward_components``). The return is the trajectory's ``outcome``."""
    info = trajectory.info
    components = info.get(REWARD_COMPONENTS) or {}
    em, f1 = (as_number(info.get(key, components.get(key))) for key in ("em", "f1"))
    return EpisodeSummary(
        task_id=str(info.get(TASK_ID) or ""), reward=float(trajectory.outcome),
        turns=int(info.get("turns", trajectory.num_turns)), tool_calls=int(info.get("episode_tool_calls", 0)),
        valid_tool_calls=int(info.get("valid_tool_calls", 0)), em=em, f1=f1, answer=info.get(ANSWER),
        gold_answers=list(info.get(GOLD_ANSWERS) or []), evidence_recall=as_number(info.get(EVIDENCE_RECALL)),
        terminated=info.get("truncated_by") is None, truncated=info.get("truncated_by") is not None,
    )


def group_index(group_ids: Sequence[str]) -> torch.Tensor:
    """Map group keys (task ids) to contiguous integers ``[B]`` in order of first appearance."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> TokenBatch:
    """Pad trajectories into one `TokenBatch` for a causal-LM forward pass.

    Layout: RIGHT padding of the concatenation `prompt_ids + response_ids`, so row i holds its prompt at
    positions `[0, prompt_lengths[i])` and its response right after it, then padding. Every per-token tensor
    has the shape `[B, T]` of `input_ids` and is aligned with it (see batch.py). A trajectory's `loss_mask`
    becomes `model_token_mask`, its `outcome` `episode_returns`, its `group_id` `group_index`.
    """
    if not trajectories:
        raise InvalidValue("collate() needs at least one trajectory")
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    batch, width = len(trajectories), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.long)
    model_token_mask = torch.zeros((batch, width), dtype=torch.long)
    sampling_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    token_rewards = torch.zeros((batch, width), dtype=torch.float32)
    prompt_lengths = torch.zeros((batch,), dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        start, end = len(trajectory.prompt_ids), lengths[row]
        input_ids[row, :end] = torch.tensor(trajectory.prompt_ids + trajectory.response_ids, dtype=torch.long)
        attention_mask[row, :end] = 1
        response_mask[row, start:end] = 1
        model_token_mask[row, start:end] = torch.tensor(trajectory.loss_mask, dtype=torch.long)
        sampling_logprobs[row, start:end] = torch.tensor(trajectory.sampling_logprobs, dtype=torch.float32)
        token_rewards[row, start:end] = torch.tensor(trajectory.token_rewards(), dtype=torch.float32)
        prompt_lengths[row] = start
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        model_token_mask=model_token_mask,
        sampling_logprobs=sampling_logprobs,
        token_rewards=token_rewards,
        prompt_lengths=prompt_lengths,
        episode_returns=torch.tensor([t.outcome for t in trajectories], dtype=torch.float32),
        group_index=group_index([t.group_id for t in trajectories]),
    )
