"""Generation backends behind one interface (`GenerationBackend`): transformers, vLLM, OpenAI-compatible HTTP.

The vLLM and HTTP backends are imported lazily, so `vllm` and `httpx` stay optional.
"""

from __future__ import annotations

from typing import Any

from agent_gym.error import InvalidValue
from agent_gym.trainers.backends.base import Generation, GenerationBackend, GenerationError, SamplingParams
from agent_gym.trainers.backends.transformers_backend import TransformersBackend

__all__ = [
    "BACKENDS",
    "Generation",
    "GenerationBackend",
    "GenerationError",
    "SamplingParams",
    "TransformersBackend",
    "make_backend",
]

BACKENDS = ("transformers", "vllm", "openai")


def make_backend(name: str, model: Any = None, tokenizer: Any = None, **kwargs: Any) -> GenerationBackend:
    """Build a backend by name.

    - "transformers": `TransformersBackend(model, tokenizer, **kwargs)` (shares the trainer's model).
    - "vllm": `VLLMBackend(model_path, tokenizer, **kwargs)`; `model` is the HF directory vLLM loads.
    - "openai": `OpenAIBackend(base_url, model_name, **kwargs)`; `model` is the served model name.
    """
    if name == "transformers":
        return TransformersBackend(model, tokenizer, **kwargs)
    if name == "vllm":
        from agent_gym.trainers.backends.vllm_backend import VLLMBackend

        return VLLMBackend(model, tokenizer=tokenizer, **kwargs)
    if name == "openai":
        from agent_gym.trainers.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(model_name=model, tokenizer=tokenizer, **kwargs)
    raise InvalidValue(f"unknown generation backend {name!r}; choose one of {', '.join(BACKENDS)}")
