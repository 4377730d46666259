"""Generation backends for tests: one that replays scripted turns, one that records what a real one saw."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agent_gym.models.chat_template import encode_text
from agent_gym.trainers.backends import Generation, GenerationBackend, SamplingParams


class ScriptedBackend(GenerationBackend):
    """Every prompt of the r-th ``generate`` call gets ``turns[r]`` (the last one repeats), ended by the eos token,
    with log-probability 0; ``before_round[r]`` runs first (a fault injection). ``prompts`` keeps every prompt."""

    def __init__(self, tokenizer: Any, turns: Sequence[str],
                 before_round: dict[int, Callable[[], None]] | None = None) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), 0
        self.before_round = before_round or {}
        self.prompts: list[list[int]] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.calls in self.before_round:
            self.before_round[self.calls]()
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        self.prompts.extend(list(prompt) for prompt in prompts)
        ids = encode_text(self.tokenizer, text) + [self.tokenizer.eos_token_id]
        return [Generation(list(ids), [0.0] * len(ids), "stop") for _ in prompts]


class RecordingBackend(GenerationBackend):
    """A real backend whose every prompt and generation is kept: ``calls`` holds (prompts, generations) per
    ``generate`` call, ``prompts`` every prompt in order."""

    def __init__(self, inner: GenerationBackend) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], list[Generation]]] = []

    @property
    def prompts(self) -> list[list[int]]:
        return [prompt for prompts, _ in self.calls for prompt in prompts]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        generations = self.inner.generate(prompts, params)
        self.calls.append(([list(prompt) for prompt in prompts], generations))
        return generations

    def release_cache(self) -> None:
        self.inner.release_cache()
