"""The one interface every generation backend implements: token ids in, token ids and log-probs out.

Log-prob convention (all backends): the log-prob of each sampled token under the *temperature-scaled*
distribution before top-p truncation, `log_softmax(logits / temperature)[token]` (plain `log_softmax(logits)`
when temperature is 0, i.e. greedy). That is what the trainer's forward pass must compute for PPO ratios to
start at exactly 1 (verl and TRL scale logits by the rollout temperature the same way). At temperature 1
it is the model's own log-prob.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agent_gym.error import AgentGymError, InvalidValue

FinishReason = Literal["stop", "length"]


class GenerationError(AgentGymError, RuntimeError):
    """A backend could not generate (bad request, engine failure, unreachable server)."""


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        token_ids: the sampled ids, including the stop token or the token that completed a stop string.
        logprobs: one log-prob per sampled id (see the module docstring for the convention).
        finish_reason: "stop" (a stop token / stop string / EOS was sampled) or "length" (max_new_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass(frozen=True)
class SamplingParams:
    """Backend-independent sampling settings of one `generate` call.

    Attributes:
        max_new_tokens: the most tokens sampled per prompt.
        temperature: 0 is greedy; log-probs are taken at this temperature (see the module docstring).
        top_p: nucleus mass (1.0 = off).
        stop_token_ids: ids that end a continuation (kept as its last token).
        stop_strings: texts that end a continuation (kept, with the token that completed them).
        seed: sampling seed, for reproducible samples (equal prompts of one call still get different ones).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if self.max_new_tokens < 1:
            raise InvalidValue(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise InvalidValue(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidValue(f"top_p must be in (0, 1], got {self.top_p}")


class GenerationBackend(abc.ABC):
    """Samples continuations of token-id prompts for the rollout collector."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Continue every prompt under `params`; one `Generation` per prompt, in order."""

    def sync_weights(self, model: torch.nn.Module) -> None:  # noqa: B027 - optional hook, no-op by default
        """Load the trainer's current weights (no-op for backends that share the trainer's model)."""

    def release_cache(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Drop state kept for sequences that may continue (a prefix cache): the rollout collector calls it when
        every episode of a batch has ended, so that the update does not run beside their dead keys and values."""

    def close(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release engines, processes and connections (idempotent)."""

    def __enter__(self) -> GenerationBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def split_stop_strings(tokenizer: Any, params: SamplingParams) -> tuple[set[int], list[str]]:
    """Stop ids (``params.stop_token_ids`` and stop strings that are one token), and the other stop strings.

    A stop string that is one *added* token (e.g. "</tool_call>" in Qwen2.5 and our tokenizers) is matched by
    id, which is exact because added tokens are never merged with text. Any other stop string may hide inside
    a longer token, so it is left to a check on decoded text.
    """
    stop_ids = set(params.stop_token_ids)
    text_stops: list[str] = []
    added = tokenizer.get_added_vocab() if params.stop_strings else {}
    for text in params.stop_strings:
        if text in added:
            stop_ids.add(added[text])
        else:
            text_stops.append(text)
    return stop_ids, text_stops


def validate_prompts(prompts: Sequence[Sequence[int]], vocab_size: int | None = None) -> None:
    """Raise a clear error for empty prompts or out-of-vocabulary ids."""
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise GenerationError(f"prompt {index} is empty")
        if vocab_size is not None and (min(prompt) < 0 or max(prompt) >= vocab_size):
            raise GenerationError(f"prompt {index} has token ids outside [0, {vocab_size})")
