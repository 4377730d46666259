"""`ModelPolicy`: a causal LM as a `Policy` for `agent-gym eval ID --model PATH`, one turn per act.

Each turn renders the env's whole context (`info["messages"]`) with the model's chat template and continues
it with the same generation backend the trainer's rollouts use, stopping on the env's stop strings or the end
of the turn. Text in, text out is fine here: nothing is trained on these tokens (the trainer's own
evaluation keeps exact token ids through `RolloutCollector`).

Decoding: greedy by default. With ``candidates=N`` it samples N turns and plays the best one, by
``select="logprob"`` (best-of-N by the policy's own log-likelihood of the turn) or ``select="value"``
(value-guided: the PPO critic's value at the turn's last token, the Agent-R1 announcement's claim that the
value function improves decoding).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agent_gym.contract import MESSAGES, STOP_STRINGS, TOOLS
from agent_gym.error import AgentGymError, InvalidValue
from agent_gym.models.chat_template import render_prompt, turn_stop_token_ids
from agent_gym.trainers.backends import GenerationBackend, SamplingParams, TransformersBackend

__all__ = ["SELECTIONS", "ModelPolicy", "ModelPolicyError", "best_candidate"]

SELECTIONS = ("logprob", "value")


class ModelPolicyError(AgentGymError, RuntimeError):
    """The env handed the policy no context to continue (it breaks docs/DESIGN.md §2's `info["messages"]`)."""


def best_candidate(scores: Sequence[float]) -> int:
    """Index of the highest score (the first of equal ones)."""
    if not scores:
        raise InvalidValue("best_candidate needs at least one score")
    return max(range(len(scores)), key=lambda index: (scores[index], -index))


class ModelPolicy:
    """A causal LM as a policy; speaks whatever wire format the env's system prompt teaches.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer, with a chat template.
        max_new_tokens: token budget of one turn.
        max_context_tokens: the prompt is cut to its last this-many tokens before generation would overflow.
        render_tools: render `info["tools"]` with the chat template (off: our envs describe the tools in their
            system prompt, as in training; see `TrainConfig.render_tools`).
        backend: a generation backend (default: a `TransformersBackend` over `model`).
        candidates: turns sampled per act; 1 is greedy decoding.
        select: how one of several candidates is chosen: ``logprob`` or ``value`` (needs ``critic``).
        critic: a :class:`~agent_gym.trainers.critic.ValueModel` trained beside this policy (PPO).
        temperature: sampling temperature of the candidates.
        seed: sampling seed (each act uses the next one).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_new_tokens: int = 256,
        max_context_tokens: int = 4096,
        render_tools: bool = False,
        backend: GenerationBackend | None = None,
        candidates: int = 1,
        select: str = "logprob",
        critic: Any = None,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        if candidates < 1:
            raise InvalidValue(f"candidates must be >= 1, got {candidates}")
        if select not in SELECTIONS:
            raise InvalidValue(f"select must be one of {SELECTIONS}, got {select!r}")
        if candidates > 1 and select == "value" and critic is None:
            raise InvalidValue("value-guided decoding needs a critic: train with --algo ppo, or pass critic=")
        if max_new_tokens < 1 or max_context_tokens <= max_new_tokens:
            raise InvalidValue(
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
        self.candidates, self.select, self.critic = candidates, select, critic
        self.temperature, self.seed = temperature, seed
        self.generated_tokens = 0  # every sampled token, the discarded candidates' included (the cost)
        self.generation_seconds = 0.0
        self._acts = 0

    @classmethod
    def from_pretrained(cls, path: str | Path, adapter: str | Path | None = None, dtype: torch.dtype = torch.float32,
                        progress: bool = True, **kwargs: Any) -> ModelPolicy:
        """Load a model directory (ours from `agent-gym model init` / `sft` / `train`, a known name such as
        ``smollm2-135m-instruct``, or a HF checkpoint), or a training run's directory (its ``final/``), with an
        optional LoRA ``adapter`` merged in. ``select="value"`` loads the critic saved beside the policy.
        ``progress=False`` loads without transformers' weights bar."""
        from agent_gym.models.model_init import ADAPTER_CONFIG, load_model_and_tokenizer
        from agent_gym.trainers.critic import CRITIC_FILE, ValueModel

        # Kept as given: Path() would drop a leading "./", and "./models/x" would then read as a hub id.
        if any((Path(path) / "final" / name).is_file() for name in ("config.json", ADAPTER_CONFIG)):
            path = Path(path) / "final"
        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, adapter=adapter, progress=progress)
        path = Path(path)
        if kwargs.get("select") == "value" and kwargs.get("candidates", 1) > 1 and kwargs.get("critic") is None:
            # A PPO run's final/ holds its critic beside the policy; a published adapter (experiments/checkpoints)
            # beside the adapter, in bf16. The adapter's own critic first: it was trained beside that adapter.
            places = ([Path(adapter)] if adapter is not None else []) + [path]
            found = next((place / CRITIC_FILE for place in places if (place / CRITIC_FILE).is_file()), None)
            if found is None:
                raise ModelPolicyError(
                    f"no {CRITIC_FILE} in {' or '.join(map(str, places))}: value-guided decoding needs the critic of "
                    "a PPO run (`agent-gym train --algo ppo` saves it in OUTPUT_DIR/final)")
            kwargs["critic"] = ValueModel.load(found, model)
        return cls(model, tokenizer, **kwargs)

    def begin(self, env: Any, observation: str, info: dict[str, Any]) -> None:
        """Start an episode: remember the tools and stop strings from `reset`'s info."""
        self.tools = list(info.get(TOOLS) or [])
        self.stop_strings = list(info.get(STOP_STRINGS) or [])

    def prompt_ids(self, info: dict[str, Any]) -> list[int]:
        """Token ids of the next turn's context: `info["messages"]` rendered with the chat template."""
        messages = info.get(MESSAGES)
        if not messages:
            raise ModelPolicyError("the env's info has no 'messages' to continue (docs/DESIGN.md §2)")
        ids = render_prompt(self.tokenizer, messages, self.tools if self.render_tools else None)
        budget = self.max_context_tokens - self.max_new_tokens
        return ids[-budget:]  # keep the newest context; the trainer's collector truncates the episode instead

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The model's next turn as text (special tokens dropped, as the collector hands the env)."""
        started = time.perf_counter()
        prompt = self.prompt_ids(info)
        greedy = self.candidates == 1
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=0.0 if greedy else self.temperature,
            stop_token_ids=self.stop_token_ids,
            stop_strings=self.stop_strings,
            seed=None if greedy else self.seed + self._acts,
        )
        self._acts += 1
        generations = self.backend.generate([prompt] * self.candidates, params)
        self.generated_tokens += sum(len(generation.token_ids) for generation in generations)
        if greedy:
            chosen = generations[0]
        elif self.select == "value":
            chosen = generations[best_candidate(self.critic.turn_values([prompt + g.token_ids for g in generations]))]
        else:  # the policy's own log-likelihood of the whole turn
            chosen = generations[best_candidate([sum(generation.logprobs) for generation in generations])]
        self.generation_seconds += time.perf_counter() - started
        return self.tokenizer.decode(chosen.token_ids, skip_special_tokens=True)
