"""One episode as exact token ids: the one place that lays out prompts, model turns and env replies (docs/DESIGN.md §7).

`TokenEpisode` is driven turn by turn: it starts from the env's first context (reset's ``info["messages"]``,
rendered with the chat template), takes each model turn as the ids and log-probs the policy sampled
(``loss_mask = 1``, never re-encoded), takes each env reply as a chat-template delta (``loss_mask = 0``), is cut
when a budget is spent, is paid per turn (a truncation's reward too, on the last turn), and emits `Trajectory`
records. The rollout collector, verl's agent loop and the SFT data layout (`tokenize_episode`, which the pointer
drills and the copy-skill metric use too) all build their token sequences here, so a model is fine-tuned on the
very layout it later samples in. The rules that live here once:

- **budget**: a turn is cut to the room left under ``max_context_tokens`` (prompt + response of one sample) and
  ``max_response_tokens`` (the response alone); a turn with no room left, or an env reply that would fill the
  budget, cuts the episode (``cut_reason = "context"``);
- **stop token**: when a turn ends with a stop token (e.g. ``<|im_end|>``), the reply's delta skips the part of
  the template's turn closing the model already wrote;
- **context rewrite**: when the env rewrote its context (``info["context_rewritten"]``), the episode goes on as a
  new step-level sample whose prompt is the rewritten ``info["messages"]`` (Agent-R1 v0.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gym.contract import CONTEXT_REWRITTEN, MESSAGES, new_messages
from agent_gym.episode_summary import EpisodeSummary
from agent_gym.error import InvalidValue
from agent_gym.models.chat_template import encode_plain_text, render_delta, render_prompt, turn_stop_token_ids
from agent_gym.trainers.trajectory import Trajectory

__all__ = ["SFTExample", "TokenEpisode", "TokenSample", "tokenize_episode"]


@dataclass
class SFTExample:
    """A conversation as one training row: its token ids, and 1 on the assistant tokens."""

    input_ids: list[int]
    loss_mask: list[int]


@dataclass
class TokenSample:
    """One step-level sample: a prompt, then model tokens and env tokens in order (see `Trajectory`)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_end_indices: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def append(self, token_ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Model tokens with their log-probs; env tokens (``logprobs=None``) with log-prob 0 and loss mask 0."""
        self.response_ids.extend(token_ids)
        if logprobs is None:
            self.loss_mask.extend([0] * len(token_ids))
            self.logprobs.extend([0.0] * len(token_ids))
        else:
            self.loss_mask.extend([1] * len(token_ids))
            self.logprobs.extend(logprobs)


class TokenEpisode:
    """The token layout of one episode, built turn by turn (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer, with a chat template.
        messages: the first context (reset's ``info["messages"]``).
        tools: tool schemas for the template to render (None: the env's system prompt holds them already).
        stop_token_ids: ids that end a turn (default: the tokenizer's, `turn_stop_token_ids`).
        max_context_tokens: the most prompt + response tokens of one sample (None: no limit).
        max_response_tokens: the most response tokens of one sample (None: no limit).
        new_sample_on_rewrite: a context rewrite starts a new sample; False appends the reply as if the env
            had not rewritten (for a consumer that takes one sequence per episode).
    """

    def __init__(self, tokenizer: Any, messages: Sequence[Mapping[str, Any]], *,
                 tools: Sequence[Mapping[str, Any]] | None = None, stop_token_ids: Sequence[int] | None = None,
                 max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                 new_sample_on_rewrite: bool = True) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools is not None else None
        self.stop_token_ids = set(turn_stop_token_ids(tokenizer) if stop_token_ids is None else stop_token_ids)
        self.max_context_tokens = max_context_tokens
        self.max_response_tokens = max_response_tokens
        self.new_sample_on_rewrite = new_sample_on_rewrite
        self.samples = [TokenSample(prompt_ids=render_prompt(tokenizer, list(messages), self.tools))]
        self.turns = 0
        self.finish_reasons: list[str] = []
        self.cut_reason: str | None = None  # why the episode was cut outside the env ("context", "max_turns", ...)
        self._ended_with: str | None = None  # the last turn's last token, decoded, when it is a stop token

    @property
    def sample(self) -> TokenSample:
        """The sample the next turn goes into."""
        return self.samples[-1]

    @property
    def room(self) -> int | None:
        """Tokens the next model turn may hold under the budgets; None when there is no budget."""
        limits = []
        if self.max_context_tokens is not None:
            limits.append(self.max_context_tokens - self.sample.length)
        if self.max_response_tokens is not None:
            limits.append(self.max_response_tokens - len(self.sample.response_ids))
        return max(0, min(limits)) if limits else None

    def add_model_turn(self, token_ids: Sequence[int], logprobs: Sequence[float] | None = None,
                       finish_reason: str = "stop") -> list[int] | None:
        """Append a sampled turn, cut to the room left; return the ids kept (decode them for the env only).

        With no room left the episode is cut (``"context"``) and None is returned. ``logprobs`` default to 0.0
        (a turn that was written, not sampled: SFT data).
        """
        room = self.room
        kept = list(token_ids if room is None else token_ids[:room])
        if not kept:  # the context is full before the turn starts
            self.cut("context")
            return None
        sample = self.sample
        sample.append(kept, [0.0] * len(kept) if logprobs is None else list(logprobs[: len(kept)]))
        sample.turn_end_indices.append(len(sample.response_ids) - 1)
        sample.turn_rewards.append(0.0)
        self.turns += 1
        self.finish_reasons.append(finish_reason if len(kept) == len(token_ids) else "context")
        # Only a stop token can be the start of the template's turn closing (e.g. <|im_end|>).
        self._ended_with = self.tokenizer.decode([kept[-1]]) if kept[-1] in self.stop_token_ids else None
        return kept

    def pay(self, reward: float) -> None:
        """Add ``reward`` to the last turn (a step's reward, or what a truncation paid)."""
        samples = [sample for sample in self.samples if sample.turn_end_indices]
        if not samples:
            raise InvalidValue("an episode with no model turn cannot be paid")
        samples[-1].turn_rewards[-1] += float(reward)

    def add_env_reply(self, info: Mapping[str, Any]) -> bool:
        """Append the env's reply of a step's ``info``; False when it does not fit (the episode is cut)."""
        if info.get(CONTEXT_REWRITTEN) and self.new_sample_on_rewrite:
            self.samples.append(TokenSample(prompt_ids=render_prompt(self.tokenizer, list(info[MESSAGES]), self.tools)))
            if not self._fits(0):
                self.cut("context")
                return False
            return True
        return self.add_env_messages(new_messages(info))

    def add_env_messages(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> bool:
        """Append ``messages`` (what the env appended after the last turn) as a chat-template delta, then the
        prompt of the next turn unless ``add_generation_prompt`` is False; False when they do not fit (cut)."""
        delta = render_delta(self.tokenizer, list(messages), self._ended_with, add_generation_prompt)
        if not self._fits(len(delta)):
            self.cut("context")
            return False
        self.sample.append(delta, None)
        return True

    def _fits(self, tokens: int) -> bool:
        """Whether ``tokens`` more env tokens leave room for a model token under both budgets."""
        sample = self.sample
        if self.max_context_tokens is not None and sample.length + tokens >= self.max_context_tokens:
            return False
        return self.max_response_tokens is None or len(sample.response_ids) + tokens < self.max_response_tokens

    def cut(self, reason: str) -> None:
        """End the episode outside the env (its budget, a turn cap); see `needs_truncation`."""
        self.cut_reason = reason

    @property
    def needs_truncation(self) -> bool:
        """Cut with at least one turn played: the env's ``truncate()`` should pay (nothing to pay without one)."""
        return self.cut_reason is not None and any(sample.turn_end_indices for sample in self.samples)

    @property
    def outcome(self) -> float:
        """The episode's return: the sum of its turn rewards."""
        return sum(reward for sample in self.samples for reward in sample.turn_rewards)

    def trajectories(self, group_id: str, info: Mapping[str, Any] | None = None,
                     episode: EpisodeSummary | None = None) -> list[Trajectory]:
        """The episode's step-level samples with a turn, each with ``info`` plus its ``sample_index``,
        ``num_samples`` and ``finish_reasons``; all share the episode's outcome, its group and its record
        (``episode``, the driver's `EpisodeSummary`, carried as it is)."""
        outcome = self.outcome
        samples = [sample for sample in self.samples if sample.turn_end_indices]
        return [
            Trajectory(
                prompt_ids=sample.prompt_ids,
                response_ids=sample.response_ids,
                loss_mask=sample.loss_mask,
                sampling_logprobs=sample.logprobs,
                turn_end_indices=sample.turn_end_indices,
                turn_rewards=sample.turn_rewards,
                outcome=outcome,
                group_id=group_id,
                info={**(info or {}), "sample_index": index, "num_samples": len(samples),
                      "finish_reasons": list(self.finish_reasons)},
                episode=episode,
            )
            for index, sample in enumerate(samples)
        ]

    def sft_example(self) -> SFTExample:
        """The first sample as one training row: its prompt and response, loss on the model tokens."""
        sample = self.samples[0]
        return SFTExample(sample.prompt_ids + sample.response_ids, [0] * len(sample.prompt_ids) + sample.loss_mask)


def tokenize_episode(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> SFTExample:
    """Token ids and loss mask of a finished conversation, laid out as the rollout collector lays out contexts.

    Each assistant turn is its content as plain text (a turn's ``<|im_end|>`` is not the end of the turn: only
    the template's markers are) followed by the end-of-turn token, as a model samples it.
    """
    first_assistant = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first_assistant is None:
        raise InvalidValue("an SFT episode needs at least one assistant message")
    episode = TokenEpisode(tokenizer, messages[:first_assistant], tools=tools)
    index = first_assistant
    while index < len(messages):
        episode.add_model_turn(
            encode_plain_text(tokenizer, str(messages[index].get("content") or "")) + [tokenizer.eos_token_id])
        following = index + 1
        while following < len(messages) and messages[following].get("role") != "assistant":
            following += 1
        if following < len(messages) or following > index + 1:
            episode.add_env_messages(messages[index + 1 : following], add_generation_prompt=following < len(messages))
        index = following
    return episode.sft_example()
