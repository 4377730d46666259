"""Batched, KV-cached sampling with a transformers causal LM, in our own decoding loop.

Why not `model.generate`: it cannot drop finished sequences from the batch or reuse the KV of the previous
turn, and it runs its generic mask, cache and logits-processor machinery on every step. This module holds
the sampling loop; the decoders it drives live in `decoders.py` (a lean functional decoder for the Qwen2 /
Llama family, the model's own forward for any other model). The loop adds:
- compaction of the batch as sequences finish;
- a prefix cache: the KV of each finished sequence is kept, so the next turn of a multi-turn episode
  encodes only the env's new tokens (dropped whenever the weights change; fast decoder only);
- a repeated prompt encoded once: the G samples of a GRPO group start from the same prompt, so on their first
  turn it is encoded for one of them and its KV copied to the others (fast decoder only).
Both paths return log-probs as documented in `base.py`.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from agent_gym.error import InvalidValue
from agent_gym.trainers.backends.base import (
    Generation,
    GenerationBackend,
    SamplingParams,
    split_stop_strings,
    validate_prompts,
)
from agent_gym.trainers.backends.decoders import CachedPrefix, FastDecoder, ModelForwardDecoder
from agent_gym.trainers.backends.packed_linear import PackedLinears

# Compact the batch once this share of its rows has finished: the copy of the KV cache then costs less
# than running the dead rows to the end.
_COMPACT_FRACTION = 0.25


def _sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens, their log-probs under log_softmax(logits / T))."""
    logits = logits.float()
    if params.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logprobs.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        sorted_probs, sorted_index = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token is always kept).
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, sorted_index, sorted_probs)
    # Inverse-CDF sampling: one uniform per row. (measured: torch.multinomial draws one exponential per
    # vocabulary entry, 10 ms per step at 64 x 4096 on one core; this takes a fraction of a millisecond.)
    cdf = probs.cumsum(dim=-1)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, uniform, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = True
    return input_ids, attention_mask


class _PrefixCache:
    """KV caches of recently generated sequences, keyed by their exact token ids.

    In multi-turn rollouts the next turn's prompt starts with the previous prompt and the sampled tokens;
    reusing their KV means only the env's new tokens are encoded. Entries are used once (an episode moves on),
    evicted least-recently-stored first when there are more than ``capacity`` or they hold more than
    ``max_bytes``, and all dropped when the model's weights change (tracked through the parameters' in-place
    version counters, so an optimizer step invalidates them without any call).

    The byte budget matters in long evals: an episode's last turn is stored too (the backend cannot know it was
    the last) and never used, so without it a 512-episode eval ends with 256 dead entries: at SmolLM2's 23 KB of
    KV a token and ~800-token contexts, about 4.6 GB (the sweep's pass@8 process was seen at 7.7 GB RSS). The
    live entries, one per running episode, are always the newest.
    """

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self.lengths: dict[int, int] = {}  # length -> number of entries of that length
        self.nbytes = 0
        self.weights_version: tuple[int, ...] | None = None

    def validate(self, model: Any) -> None:
        version = tuple(parameter._version for parameter in model.parameters())
        if version != self.weights_version:
            self.entries.clear()
            self.lengths.clear()
            self.nbytes = 0
            self.weights_version = version

    def put(self, tokens: tuple[int, ...], prefix: CachedPrefix) -> None:
        if self.capacity <= 0 or tokens in self.entries:
            return
        self.entries[tokens] = prefix
        self.lengths[len(tokens)] = self.lengths.get(len(tokens), 0) + 1
        self.nbytes += prefix.nbytes
        while len(self.entries) > self.capacity or (self.max_bytes is not None and self.nbytes > self.max_bytes):
            self._forget(next(iter(self.entries)))

    def pop_longest_prefix(self, prompt: Sequence[int]) -> CachedPrefix | None:
        """The cached KV of the longest stored strict prefix of `prompt` (removed from the store)."""
        for length in sorted(self.lengths, reverse=True):
            if length < len(prompt) and (key := tuple(prompt[:length])) in self.entries:
                prefix = self.entries[key]
                self._forget(key)
                return prefix
        return None

    def _forget(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
        self.lengths[len(key)] -= 1
        if not self.lengths[len(key)]:
            del self.lengths[len(key)]


class TransformersBackend(GenerationBackend):
    """Generation with an in-process transformers model (shares the trainer's weights: nothing to sync).

    Args:
        model: a causal LM (any `AutoModelForCausalLM`; the Qwen2/Llama family takes the fast path).
        tokenizer: needed only for stop strings that are not single tokens, and for the pad id.
        max_batch_size: prompts per decoding batch (longer lists are split, sorted by length).
        fast_path: allow the functional decoder when the model supports it.
        prefix_cache_size: finished sequences whose KV is kept for the next turn (fast path; 0 disables).
        prefix_cache_mb: the most memory those KV copies may hold (None: no limit); the oldest go first.
        packed_weights: on a CPU, run the fast path's linears through weights prepacked for oneDNN
            (`packed_linear.py`), wherever those ops work for the model's dtype; remade when the weights change,
            dropped with the prefix cache. They hold a second copy of the linear weights.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        max_batch_size: int = 64,
        fast_path: bool = True,
        prefix_cache_size: int = 256,
        prefix_cache_mb: float | None = 1024,
        packed_weights: bool = True,
    ) -> None:
        self.model = model
        self.packed = PackedLinears() if packed_weights else None
        max_bytes = None if prefix_cache_mb is None else int(prefix_cache_mb * 2**20)
        self.prefix_cache = _PrefixCache(prefix_cache_size, max_bytes)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.fast_path = fast_path
        pad_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad_id if pad_id is not None else (getattr(model.config, "pad_token_id", None) or 0)

    @property
    def uses_fast_path(self) -> bool:
        return self.fast_path and FastDecoder.supports(self.model)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s weights (a LoRA policy's with its adapters merged) into this backend's model; a no-op
        when both are the same object. Cached prefixes of the old weights are dropped."""
        if model is self.model:
            return
        from agent_gym.models.lora_weights import merged_tensors

        state = dict(merged_tensors(model))
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                if name in state:
                    tensor.copy_(state[name])
        self.release_cache()

    def release_cache(self) -> None:
        """Drop every cached prefix (their episodes ended, or the weights changed) and the packed weights."""
        self.prefix_cache = _PrefixCache(self.prefix_cache.capacity, self.prefix_cache.max_bytes)
        if self.packed is not None:
            self.packed.clear()

    def _stop_sets(self, params: SamplingParams) -> tuple[set[int], list[str]]:
        """Stop ids, and the stop strings that need a text check (see `split_stop_strings`)."""
        if params.stop_strings and self.tokenizer is None:
            raise InvalidValue("stop strings need a tokenizer: pass one to TransformersBackend")
        return split_stop_strings(self.tokenizer, params)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        validate_prompts(prompts, self.model.get_input_embeddings().num_embeddings)
        device = self.model.get_input_embeddings().weight.device
        seed = params.seed
        generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        self.prefix_cache.validate(self.model)
        if self.packed is not None and self.uses_fast_path:
            self.packed.refresh(FastDecoder.linear_weights(self.model))
        stop_ids, multi_token_stops = self._stop_sets(params)
        order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                generations = self._generate_batch(
                    [prompts[i] for i in chunk], params, stop_ids, multi_token_stops, generator, device
                )
                for index, generation in zip(chunk, generations, strict=True):
                    results[index] = generation
        finally:
            self.model.train(was_training)
        return [generation for generation in results if generation is not None]

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop_ids: set[int],
        multi_token_stops: list[str],
        generator: torch.Generator | None,
        device: torch.device,
    ) -> list[Generation]:
        input_ids, attention_mask = _left_pad(prompts, self.pad_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        batch = len(prompts)
        if self.uses_fast_path:
            decoder: Any = FastDecoder(
                self.model, batch, input_ids.shape[1] + params.max_new_tokens, device, self.packed
            )
        else:
            decoder = ModelForwardDecoder(self.model, self.pad_id)
        use_cache = isinstance(decoder, FastDecoder) and self.prefix_cache.capacity > 0
        width = input_ids.shape[1]
        stop_tensor = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        tokens_out = torch.zeros((batch, params.max_new_tokens), dtype=torch.long, device=device)
        logprobs_out = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)
        lengths = torch.zeros((batch,), dtype=torch.long, device=device)
        stopped = torch.zeros((batch,), dtype=torch.bool, device=device)
        active = torch.arange(batch, device=device)  # original row of each decoder row
        alive = torch.ones((batch,), dtype=torch.bool, device=device)  # decoder rows still sampling
        if use_cache:
            cached = [self.prefix_cache.pop_longest_prefix(p) for p in prompts]
            logits = decoder.prefill(input_ids, attention_mask, self._share_repeated_prompts(prompts, cached, device))
        else:
            logits = decoder.prefill(input_ids, attention_mask)
        for step in range(params.max_new_tokens):
            tokens, logprobs = _sample(logits, params, generator)
            rows = active[alive]
            tokens_out[rows, step] = tokens[alive]
            logprobs_out[rows, step] = logprobs[alive]
            lengths[rows] = step + 1
            done = torch.isin(tokens, stop_tensor) & alive
            if multi_token_stops:
                done |= self._multi_token_stop(tokens_out, active, alive, step, multi_token_stops)
            stopped[active[done]] = True
            last_step = step == params.max_new_tokens - 1
            if use_cache:
                self._store_finished(
                    decoder, prompts, tokens_out, active, alive if last_step else done, step, width
                )
            alive &= ~done
            live_count = int(alive.sum())
            if live_count == 0 or last_step:
                break
            if live_count <= (1 - _COMPACT_FRACTION) * alive.numel():
                keep = alive.nonzero().squeeze(-1)
                decoder.keep(keep)
                active, tokens = active[keep], tokens[keep]
                alive = torch.ones((keep.numel(),), dtype=torch.bool, device=device)
            logits = decoder.step(tokens)
        lengths_list, stopped_list = lengths.tolist(), stopped.tolist()
        return [
            Generation(
                token_ids=tokens_out[row, : lengths_list[row]].tolist(),
                logprobs=logprobs_out[row, : lengths_list[row]].tolist(),
                finish_reason="stop" if stopped_list[row] else "length",
            )
            for row in range(batch)
        ]

    def _share_repeated_prompts(
        self, prompts: Sequence[Sequence[int]], cached: list[CachedPrefix | None], device: torch.device
    ) -> list[CachedPrefix | None]:
        """``cached`` with one KV for every prompt that several rows share and none has cached: each such prompt
        but its last token is encoded once, in one batch, and every row of it gets a copy (the prefill then
        encodes one token for them). A GRPO group's first turn: G rows, one prompt."""
        rows_of: defaultdict[tuple[int, ...], list[int]] = defaultdict(list)
        for row, (prompt, prefix) in enumerate(zip(prompts, cached, strict=True)):
            if prefix is None and len(prompt) > 1:
                rows_of[tuple(prompt)].append(row)
        repeated = sorted((prompt for prompt, rows in rows_of.items() if len(rows) > 1), key=len)
        if not repeated:
            return cached
        input_ids, attention_mask = _left_pad([prompt[:-1] for prompt in repeated], self.pad_id)
        width = input_ids.shape[1]
        decoder = FastDecoder(self.model, len(repeated), width, device, self.packed)
        decoder.prefill(input_ids.to(device), attention_mask.to(device))
        shared = list(cached)
        for index, prompt in enumerate(repeated):
            prefix = decoder.export(index, width - (len(prompt) - 1))
            for row in rows_of[prompt]:
                shared[row] = prefix
        return shared

    def _store_finished(
        self,
        decoder: FastDecoder,
        prompts: Sequence[Sequence[int]],
        tokens_out: torch.Tensor,
        active: torch.Tensor,
        finished: torch.Tensor,
        step: int,
        width: int,
    ) -> None:
        """Keep the KV of finished rows: their prompt and every sampled token but the last (not yet fed)."""
        for index in finished.nonzero().squeeze(-1).tolist():
            row = int(active[index])
            tokens = tuple(prompts[row]) + tuple(tokens_out[row, :step].tolist())
            self.prefix_cache.put(tokens, decoder.export(index, width - len(prompts[row])))

    def _multi_token_stop(
        self, tokens_out: torch.Tensor, active: torch.Tensor, alive: torch.Tensor, step: int, stops: list[str]
    ) -> torch.Tensor:
        """Rows whose last few tokens decode to text containing a stop string that spans several tokens."""
        window = max(len(stop.encode()) for stop in stops) + 1  # every token holds at least one byte
        found = torch.zeros_like(alive)
        for index in alive.nonzero().squeeze(-1).tolist():
            row = int(active[index])
            tail = self.tokenizer.decode(tokens_out[row, max(0, step + 1 - window) : step + 1].tolist())
            found[index] = any(stop in tail for stop in stops)
        return found
