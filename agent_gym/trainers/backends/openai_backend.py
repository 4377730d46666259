"""Generation through an OpenAI-compatible `/v1/completions` server (`vllm serve`), token ids in and out.

Start the server so that its log-probs follow our convention (after temperature) and weights can be synced:

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32 \\
        --logprobs-mode processed_logprobs

Each prompt is its own request (sent concurrently; the server batches them), because one seed for a batch of
equal prompts, as in a GRPO group, would give equal samples. vLLM's `return_token_ids` returns the exact ids.
Weight sync (dev mode only) saves the model to `sync_dir` and asks the server to reload it; vLLM's path reload
leaves a tied LM head stale (measured, notes/vllm-cpu.md), so tied-embedding models are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from agent_gym.trainers.backends.base import (
    Generation,
    GenerationBackend,
    GenerationError,
    SamplingParams,
    validate_prompts,
)


class OpenAIBackend(GenerationBackend):
    """Client of an OpenAI-compatible completions endpoint that accepts token-id prompts (vLLM).

    Args:
        base_url: e.g. "http://127.0.0.1:8000/v1".
        model_name: the served model name (the server's --model, or --served-model-name).
        tokenizer: unused by requests; kept for symmetry with the other backends.
        timeout_s: per-request timeout.
        max_concurrency: requests in flight at once.
        sync_dir: a directory the server can read, for `sync_weights`.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        model_name: str | None = None,
        tokenizer: Any = None,
        timeout_s: float = 300.0,
        max_concurrency: int = 64,
        sync_dir: str | Path | None = None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.sync_dir = Path(sync_dir) if sync_dir else None
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=max_concurrency))
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency)
        self._closed = False

    def _post(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            response = self.client.post(url, json=payload)
        except httpx.HTTPError as error:
            raise GenerationError(f"cannot reach {url}: {error!r}") from error
        if response.status_code != 200:
            raise GenerationError(f"{url} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else {}

    def _complete(self, prompt: Sequence[int], params: SamplingParams, seed: int | None) -> Generation:
        payload = {
            "model": self.model_name,
            "prompt": list(prompt),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop_strings),
            "stop_token_ids": list(params.stop_token_ids),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "logprobs": 0,
            "return_token_ids": True,
            "seed": seed,
        }
        choice = self._post(f"{self.base_url}/completions", payload)["choices"][0]
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if token_ids is None or logprobs is None or len(token_ids) != len(logprobs):
            raise GenerationError("the server returned no token ids or log-probs; it must be vLLM >= 0.10")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(
            token_ids=list(token_ids), logprobs=[float(x) for x in logprobs], finish_reason=finish
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        validate_prompts(prompts)
        seeds = [None if params.seed is None else params.seed + index for index in range(len(prompts))]
        return list(
            self.pool.map(
                lambda args: self._complete(args[0], params, args[1]), zip(prompts, seeds, strict=True)
            )
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Save `model` to `sync_dir` and have the server (VLLM_SERVER_DEV_MODE=1) reload it."""
        if self.sync_dir is None:
            raise GenerationError(
                "OpenAIBackend.sync_weights needs sync_dir, a directory the server can read"
            )
        if getattr(model.config, "tie_word_embeddings", False):
            raise GenerationError(
                "the server's path reload keeps a tied LM head stale; use the in-process "
                "vllm backend, or a model with untied embeddings"
            )
        model.save_pretrained(self.sync_dir)
        root = self.base_url.removesuffix("/v1")
        self._post(
            f"{root}/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(self.sync_dir)}},
        )
        self._post(f"{root}/reset_prefix_cache", {})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.shutdown(wait=False)
        self.client.close()
