"""The hand-written decoders behind `TransformersBackend`: prefill a batch of prompts, then one token per step.

Both decoders have the same three methods: `prefill(input_ids, attention_mask)` returns the logits of each
row's last prompt token, `step(tokens)` feeds one sampled token per live row and returns the next logits, and
`keep(rows)` drops finished rows from the batch.

- `FastDecoder` (Qwen2 / Llama family): a functional decoder that reads the model's own parameter tensors (so
  there is nothing to sync after an optimizer step), with a preallocated KV cache; prompts encoded in
  length-sorted groups, each as wide as its longest prompt; decode attention as two matmuls over the whole
  (packed) cache, unused columns masked; its linears through prepacked weights on a CPU where given
  (`packed_linear.py`); and `export` of a row's KV for the backend's prefix cache.
- `ModelForwardDecoder`: any other model (or a PEFT-wrapped one), through its own forward and a
  `DynamicCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agent_gym.trainers.backends.packed_linear import PackedLinears

__all__ = ["CachedPrefix", "FastDecoder", "ModelForwardDecoder"]

_FAST_PATH_MODEL_TYPES = ("qwen2", "llama")
_ALL_ROWS = slice(None)
# Rows per prefill group: small enough that sorted prompts waste little padding, large enough for big matmuls.
_PREFILL_GROUP = 16


@dataclass
class CachedPrefix:
    """The KV cache of one sequence: per layer [kv_heads, length, head_dim] keys and values."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in (*self.keys, *self.values))


class FastDecoder:
    """Functional Qwen2/Llama decoder over the model's parameters with a preallocated KV cache."""

    def __init__(
        self, model: Any, batch_size: int, max_length: int, device: torch.device, linears: PackedLinears | None = None
    ) -> None:
        config = model.config
        self.model = model
        self._linear = linears.linear if linears is not None else F.linear
        self.decoder = model.model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        dtype = self.decoder.embed_tokens.weight.dtype
        shape = (batch_size, self.num_kv_heads, max_length, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.decoder.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.decoder.layers]
        self.valid = torch.zeros((batch_size, max_length), dtype=torch.bool, device=device)
        self.positions = torch.zeros((batch_size,), dtype=torch.long, device=device)
        self.length = 0

    @staticmethod
    def supports(model: Any) -> bool:
        config = getattr(model, "config", None)
        decoder = getattr(model, "model", None)
        if (
            config is None
            or decoder is None
            or getattr(config, "model_type", None) not in _FAST_PATH_MODEL_TYPES
        ):
            return False
        if getattr(config, "use_sliding_window", False) or getattr(config, "hidden_act", "silu") != "silu":
            return False
        if not hasattr(decoder, "rotary_emb") or not hasattr(decoder, "layers"):
            return False
        # Exactly nn.Linear: LoRA / quantised layers carry extra computation this decoder would skip.
        return all(type(linear) is torch.nn.Linear for linear in FastDecoder._linears(model))

    @staticmethod
    def _linears(model: Any) -> list[torch.nn.Module]:
        linears = [model.lm_head]
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            linears += [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
            linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        return linears

    @staticmethod
    def linear_weights(model: Any) -> list[torch.Tensor]:
        """The weight of every linear layer this decoder multiplies by (what `PackedLinears` packs)."""
        return [linear.weight for linear in FastDecoder._linears(model)]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attn_mask: torch.Tensor,
        rows: slice = _ALL_ROWS,
        start: int | None = None,
        key_start: int = 0,
    ) -> torch.Tensor:
        """Run the decoder on `input_ids` [b, T] of cache rows `rows`, placed at columns [start, start + T),
        attending to cache columns [key_start, start + T) under `attn_mask` (bool for SDPA; additive float
        for one-token decoding). `start` None: right after the cache (`self.length`)."""
        batch, steps = input_ids.shape
        start = self.length if start is None else start
        end = start + steps
        x = self.decoder.embed_tokens(input_ids)
        cos, sin = self.decoder.rotary_emb(x, position_ids)
        cos, sin = cos[:, None], sin[:, None]
        for index, layer in enumerate(self.decoder.layers):
            attention = layer.self_attn
            h = self._norm(x, layer.input_layernorm.weight)
            q = self._linear(h, attention.q_proj.weight, attention.q_proj.bias)
            k = self._linear(h, attention.k_proj.weight, attention.k_proj.bias)
            v = self._linear(h, attention.v_proj.weight, attention.v_proj.bias)
            q = self._rotate(q.view(batch, steps, self.num_heads, self.head_dim).transpose(1, 2), cos, sin)
            k = self._rotate(k.view(batch, steps, self.num_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            self.keys[index][rows, :, start:end] = k
            self.values[index][rows, :, start:end] = v.view(
                batch, steps, self.num_kv_heads, self.head_dim
            ).transpose(1, 2)
            if attn_mask.dtype != torch.bool:  # one token a row: every row, the whole cache (see below)
                out = self._decode_attention(q, self.keys[index], self.values[index], attn_mask)
            else:
                keys = self.keys[index][rows, :, key_start:end]
                values = self.values[index][rows, :, key_start:end]
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=attn_mask, enable_gqa=self.num_heads != self.num_kv_heads
                )
            out = out.transpose(1, 2).reshape(batch, steps, self.num_heads * self.head_dim)
            x = x + self._linear(out, attention.o_proj.weight, attention.o_proj.bias)
            h = self._norm(x, layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            gated = F.silu(self._linear(h, mlp.gate_proj.weight)) * self._linear(h, mlp.up_proj.weight)
            x = x + self._linear(gated, mlp.down_proj.weight)
        self.length = max(self.length, end)
        last = self._norm(x[:, -1], self.decoder.norm.weight)
        return self._linear(last, self.model.lm_head.weight, self.model.lm_head.bias)

    def _decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, additive_mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one query per row as two batched matmuls over the whole preallocated cache, its unused
        and padding columns masked (measured: torch's CPU flash kernel takes ~3.6 ms per call for a 64 x 1-token
        query, the matmuls a fraction of that).

        Why the whole cache, not the columns in use: a slice along the columns is a batch of matrices that are not
        packed (each row's lie ``max_length`` apart), and torch's bf16 CPU matmul takes a slow path for it: 2.28 ms
        against 0.35 for the same [16, 3, 900, 64] keys packed (one Xeon thread, 2026-11-28). The cache is only
        ``max_new_tokens`` wider than the prompts, so the masked columns cost less than that path; an RL rollout
        of SmolLM2 (16 episodes, 2-hop SynthHop) ran 1.41x faster in bf16, the same in fp32 (whose matmul takes
        strided batches at full speed)."""
        batch, _, _, head_dim = q.shape
        group = self.num_heads // self.num_kv_heads
        # Query heads that share a KV head become rows of one matmul: [B, kv, group, D] x [B, kv, D, L].
        grouped = q.reshape(batch, self.num_kv_heads, group, head_dim)
        scores = torch.matmul(grouped, keys.transpose(-1, -2)) * head_dim**-0.5 + additive_mask
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(values.dtype), values)
        return out.reshape(batch, self.num_heads, 1, head_dim)

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cached: Sequence[CachedPrefix | None] | None = None,
    ) -> torch.Tensor:
        """Encode left-padded prompts; return the logits of each row's last token.

        Rows sorted by length (as `TransformersBackend` sends them) are encoded in groups, each only as wide
        as its longest prompt, so short prompts do not pay for the padding of long ones. A row with a cached
        prefix gets that KV copied in, and only the tokens after it are encoded (with the group's longest
        suffix setting the width; re-encoded cached tokens give the same KV).
        """
        batch, width = input_ids.shape
        device = input_ids.device
        self.valid[:, :width] = attention_mask
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self.positions = attention_mask.long().sum(-1)
        lengths = self.positions.tolist()
        cached = list(cached) if cached is not None else [None] * batch
        for row, prefix in enumerate(cached):
            if prefix is not None:
                first = width - lengths[row]
                for layer in range(len(self.keys)):
                    self.keys[layer][row, :, first : first + prefix.length] = prefix.keys[layer]
                    self.values[layer][row, :, first : first + prefix.length] = prefix.values[layer]
        groups = [(0, batch)]
        if lengths == sorted(lengths):
            groups = [(a, min(batch, a + _PREFILL_GROUP)) for a in range(0, batch, _PREFILL_GROUP)]
        logits = []
        for first, last in groups:
            suffix = max(
                1, max(lengths[r] - (cached[r].length if cached[r] else 0) for r in range(first, last))
            )
            query_start, key_start = width - suffix, width - max(1, max(lengths[first:last]))
            query_columns = torch.arange(query_start, width, device=device)
            key_columns = torch.arange(key_start, width, device=device)
            causal = key_columns[None, :] <= query_columns[:, None]
            # A padding query sees itself, so no softmax row is empty (its output is never used).
            itself = key_columns[None, :] == query_columns[:, None]
            group_mask = (causal & attention_mask[first:last, None, None, key_start:]) | itself
            logits.append(
                self._forward(
                    input_ids[first:last, query_start:],
                    position_ids[first:last, query_start:],
                    group_mask,
                    rows=slice(first, last),
                    start=query_start,
                    key_start=key_start,
                )
            )
        self.length = width
        return torch.cat(logits)

    def export(self, row: int, first_column: int) -> CachedPrefix:
        """A copy of one row's KV from `first_column` to the end of the cache."""
        return CachedPrefix(
            keys=[cache[row, :, first_column : self.length].clone() for cache in self.keys],
            values=[cache[row, :, first_column : self.length].clone() for cache in self.values],
        )

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.valid[:, self.length] = True
        mask = torch.zeros(
            self.valid.shape[0], 1, 1, self.valid.shape[1], dtype=self.keys[0].dtype, device=tokens.device
        )
        mask.masked_fill_(~self.valid[:, None, None, :], torch.finfo(mask.dtype).min)
        logits = self._forward(tokens[:, None], self.positions[:, None], mask)
        self.positions = self.positions + 1
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        self.keys = [cache.index_select(0, rows) for cache in self.keys]
        self.values = [cache.index_select(0, rows) for cache in self.values]
        self.valid = self.valid.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)


class ModelForwardDecoder:
    """Generic path: the model's own forward with a DynamicCache (no batch compaction)."""

    def __init__(self, model: Any, pad_id: int) -> None:
        self.model = model
        self.pad_id = pad_id
        self.cache: Any = None
        self.attention_mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.attention_mask = attention_mask.long()
        position_ids = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
        self.positions = self.attention_mask.sum(-1)
        self.rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        output = self.model(
            input_ids=input_ids, attention_mask=self.attention_mask, position_ids=position_ids, use_cache=True
        )
        self.cache = output.past_key_values
        return output.logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.attention_mask is not None and self.positions is not None and self.rows is not None
        full_tokens = torch.full(
            (self.attention_mask.shape[0],), self.pad_id, dtype=torch.long, device=tokens.device
        )
        full_tokens[self.rows] = tokens
        self.attention_mask = torch.cat(
            [self.attention_mask, torch.ones_like(self.attention_mask[:, :1])], -1
        )
        output = self.model(
            input_ids=full_tokens[:, None],
            attention_mask=self.attention_mask,
            position_ids=self.positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = output.past_key_values
        self.positions = self.positions + 1
        return output.logits[self.rows, -1]

    def keep(self, rows: torch.Tensor) -> None:
        assert self.rows is not None
        self.rows = self.rows[rows]
