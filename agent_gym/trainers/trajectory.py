"""Token-level trajectory records and their collation into padded training tensors.

A `Trajectory` is one step-level sample (Agent-R1 v0.1): a prompt, then a response made of the tokens the
policy sampled interleaved with the tokens the environment inserted (tool results rendered with the chat
template). Only model-sampled tokens carry `loss_mask = 1`; env tokens carry `loss_mask = 0` and a sampling
log-prob of 0.0. Rewards are per turn and are placed on the turn's last model token (docs/DESIGN.md §7).
`collate` pads trajectories into a `TokenBatch` (batch.py), the first record of the trainer's data path.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agent_gym.episode_summary import EpisodeSummary
from agent_gym.error import InvalidValue, KeyNotFound
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
        info: the sample's own metadata (``sample_index``, ``num_samples``, ``finish_reasons``...).
        episode: what the episode was (return, turns, tool calls, EM, how it ended, its task fields): the
            rollout collector's `EpisodeSummary`, shared by every sample of the episode. A trajectory built
            without one gets the little its tokens tell (return and turns).
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
    episode: EpisodeSummary | None = None

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
        if self.episode is None:
            self.episode = EpisodeSummary(reward=float(self.outcome), turns=self.num_turns, terminated=True)
        elif not isinstance(self.info, _SampleInfo):
            self.info = _SampleInfo(self.info, self.episode)

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
    """Deprecated: read ``trajectory.episode``, the collector's record of the episode, carried as it is."""
    return trajectory.episode


# The flat keys the collector wrote into `Trajectory.info` before the episode's record travelled whole, and where
# each now lives on `EpisodeSummary`. Read for one release, with a DeprecationWarning; a key whose value the episode
# does not report (em of an env without answers...) is absent, as it was.
_LEGACY_EPISODE_KEYS: dict[str, str] = {
    "task_id": "task_id", "turns": "turns", "truncated_by": "truncated_by", "task_fields": "task_fields",
    "answer": "answer", "gold_answers": "gold_answers", "episode_tool_calls": "tool_calls",
    "valid_tool_calls": "valid_tool_calls", "tool_call_validity": "tool_call_validity", "em": "em", "f1": "f1",
    "evidence_recall": "evidence_recall",
}
_ALWAYS_PRESENT = {"task_id", "turns", "truncated_by", "task_fields", "episode_tool_calls", "valid_tool_calls"}


class _SampleInfo(dict):
    """`Trajectory.info` of a collected sample: its own keys (``sample_index``, ``num_samples``,
    ``finish_reasons``), and for one release the old flat episode keys (``em``, ``turns``,
    ``episode_tool_calls``...) read through to ``trajectory.episode``."""

    def __init__(self, items: Mapping[str, Any], episode: EpisodeSummary) -> None:
        super().__init__(items)
        self.episode = episode

    def _legacy(self, key: Any) -> tuple[bool, Any]:
        name = _LEGACY_EPISODE_KEYS.get(key) if isinstance(key, str) else None
        if name is None:
            return False, None
        value = getattr(self.episode, name)
        if value is None and key not in _ALWAYS_PRESENT:
            return False, None
        warnings.warn(f"trajectory.info[{key!r}] is deprecated: read trajectory.episode.{name} (the "
                      "EpisodeSummary the collector made); the flat key goes in the next release",
                      DeprecationWarning, stacklevel=3)
        return True, value

    def __missing__(self, key: Any) -> Any:
        found, value = self._legacy(key)
        if not found:
            raise KeyNotFound(f"trajectory info has no key {key!r}")
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        found, value = self._legacy(key)
        return value if found else default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._legacy(key)[0]


def group_index(group_ids: Sequence[str]) -> torch.Tensor:
    """Map group keys (task ids) to contiguous integers ``[B]`` in order of first appearance."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> TokenBatch:
    """Pad trajectories into one `TokenBatch` for a causal-LM forward pass.

    Layout: RIGHT padding of the concatenation `prompt_ids + response_ids`, so row i holds its prompt at
    positions `[0, prompt_lengths[i])` and its response right after it, then padding. Every per-token tensor
    has the shape `[B, T]` of `input_ids` and is aligned with it (see batch.py). A trajectory's `loss_mask` is
    padded into the batch's `loss_mask`, its `outcome` into `episode_returns`, its `group_id` into `group_index`.
    """
    if not trajectories:
        raise InvalidValue("collate() needs at least one trajectory")
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    batch, width = len(trajectories), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width), dtype=torch.long)
    sampling_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    token_rewards = torch.zeros((batch, width), dtype=torch.float32)
    prompt_lengths = torch.zeros((batch,), dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        start, end = len(trajectory.prompt_ids), lengths[row]
        input_ids[row, :end] = torch.tensor(trajectory.prompt_ids + trajectory.response_ids, dtype=torch.long)
        attention_mask[row, :end] = 1
        response_mask[row, start:end] = 1
        loss_mask[row, start:end] = torch.tensor(trajectory.loss_mask, dtype=torch.long)
        sampling_logprobs[row, start:end] = torch.tensor(trajectory.sampling_logprobs, dtype=torch.float32)
        token_rewards[row, start:end] = torch.tensor(trajectory.token_rewards(), dtype=torch.float32)
        prompt_lengths[row] = start
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        loss_mask=loss_mask,
        sampling_logprobs=sampling_logprobs,
        token_rewards=token_rewards,
        prompt_lengths=prompt_lengths,
        episode_returns=torch.tensor([t.outcome for t in trajectories], dtype=torch.float32),
        group_index=group_index([t.group_id for t in trajectories]),
    )
