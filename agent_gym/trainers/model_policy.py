"""`ModelPolicy`: a causal LM as a `Policy` for `agent-gym eval ID --model PATH` (greedy, one turn per act).

Each turn renders the env's whole context (`info["messages"]`) with the model's chat template and continues
it greedily with the same generation backend the trainer's rollouts use, stopping on the env's stop strings
or the end of the turn. Text in, text out is fine here: nothing is trained on these tokens (the trainer's own
evaluation keeps exact token ids through `RolloutCollector`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agent_gym.error import AgentGymError
from agent_gym.trainers.backends import GenerationBackend, SamplingParams, TransformersBackend
from agent_gym.trainers.chat_template import render_prompt, turn_stop_token_ids

__all__ = ["ModelPolicy", "ModelPolicyError"]


class ModelPolicyError(AgentGymError, RuntimeError):
    """The env handed the policy no context to continue (it breaks DESIGN §2's `info["messages"]`)."""


class ModelPolicy:
    """Greedy policy of a causal LM; speaks whatever wire format the env's system prompt teaches.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer, with a chat template.
        max_new_tokens: token budget of one turn.
        max_context_tokens: the prompt is cut to its last this-many tokens before generation would overflow.
        render_tools: render `info["tools"]` with the chat template (off: our envs describe the tools in their
            system prompt, as in training; see `TrainConfig.render_tools`).
        backend: a generation backend (default: a `TransformersBackend` over `model`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_new_tokens: int = 256,
        max_context_tokens: int = 4096,
        render_tools: bool = False,
        backend: GenerationBackend | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_context_tokens <= max_new_tokens:
            raise ValueError(
                f"need max_new_tokens >= 1 and max_context_tokens > max_new_tokens, got {max_new_tokens}, "
                f"{max_context_tokens}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_context_tokens = max_context_tokens
        self.render_tools = render_tools
        self.backend = backend if backend is not None else TransformersBackend(model, tokenizer)
        self.stop_token_ids = turn_stop_token_ids(tokenizer)
        self.tools: list[dict] = []
        self.stop_strings: list[str] = []

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> ModelPolicy:
        """Load a model directory (ours from `agent-gym model init` / `sft` / `train`, or a HF checkpoint)."""
        from agent_gym.trainers.model_init import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(path)
        return cls(model, tokenizer, **kwargs)

    def begin(self, env: Any, observation: str, info: dict[str, Any]) -> None:
        """Start an episode: remember the tools and stop strings from `reset`'s info."""
        self.tools = list(info.get("tools") or [])
        self.stop_strings = list(info.get("stop_strings") or [])

    def prompt_ids(self, info: dict[str, Any]) -> list[int]:
        """Token ids of the next turn's context: `info["messages"]` rendered with the chat template."""
        messages = info.get("messages")
        if not messages:
            raise ModelPolicyError("the env's info has no 'messages' to continue (DESIGN §2)")
        ids = render_prompt(self.tokenizer, messages, self.tools if self.render_tools else None)
        budget = self.max_context_tokens - self.max_new_tokens
        return ids[-budget:]  # keep the newest context; the trainer's collector truncates the episode instead

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The model's next turn, greedy, as text (special tokens dropped, as the collector hands the env)."""
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=0.0,
            stop_token_ids=self.stop_token_ids,
            stop_strings=self.stop_strings,
        )
        (generation,) = self.backend.generate([self.prompt_ids(info)], params)
        return self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
