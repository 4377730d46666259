"""Prepacked CPU linears: the same numbers as F.linear, remade when a weight changes, and a clean fallback."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F

from agent_gym.trainers.backends import SamplingParams, TransformersBackend, packed_linear
from agent_gym.trainers.backends.decoders import FastDecoder
from agent_gym.trainers.backends.packed_linear import PackedLinears, packing_works


def _needs_packing(dtype: torch.dtype) -> None:
    if not packing_works(dtype):
        pytest.skip(f"this torch build has no working prepacked {dtype} CPU linears (F.linear is used instead)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_packed_linear_gives_what_f_linear_gives(dtype) -> None:
    _needs_packing(dtype)
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    linears = PackedLinears()
    linears.refresh([weight])
    assert linears.nbytes == weight.numel() * weight.element_size()
    for shape in [(1, 64), (7, 64), (4, 1, 64), (2, 33, 64)]:  # decode rows, a prefill group
        x = torch.randn(*shape, generator=generator).to(dtype)
        tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(linears.linear(x, weight, bias), F.linear(x, weight, bias), rtol=tolerance,
                                   atol=tolerance)
        torch.testing.assert_close(linears.linear(x, weight), F.linear(x, weight), rtol=tolerance, atol=tolerance)


def test_refresh_repacks_only_what_changed_and_drops_what_is_gone() -> None:
    _needs_packing(torch.float32)
    first, second, third = (torch.randn(8, 8) for _ in range(3))
    linears = PackedLinears()
    linears.refresh([first, second, third])
    packed_second = linears._packed[id(second)][1]
    x = torch.randn(2, 8)
    with torch.no_grad():
        first.mul_(2.0)  # in place, as an optimizer step or a weight sync
    linears.refresh([first, second])
    assert linears._packed[id(second)][1] is packed_second
    assert id(third) not in linears._packed
    torch.testing.assert_close(linears.linear(x, first), F.linear(x, first))
    linears.clear()
    assert linears.nbytes == 0
    torch.testing.assert_close(linears.linear(x, first), F.linear(x, first))  # nothing packed: F.linear


def test_ops_that_fail_leave_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_args, **_kwargs):
        raise RuntimeError("No such operator mkldnn::_reorder_linear_weight")

    monkeypatch.setattr(packed_linear, "_pack", missing)
    assert packing_works.__wrapped__(torch.float32) is False
    assert packing_works.__wrapped__(torch.float16) is False  # not a dtype it packs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_and_plain_backends_sample_the_same_tokens(tiny_model, dtype) -> None:
    _needs_packing(dtype)
    model, tokenizer = tiny_model
    model = copy.deepcopy(model).to(dtype)
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 500) for _ in range(length)] for length in (3, 40, 7, 120, 64, 2)]
    params = SamplingParams(max_new_tokens=12, seed=2)
    packed = TransformersBackend(model, tokenizer)
    plain = TransformersBackend(model, tokenizer, packed_weights=False)
    got, expected = packed.generate(prompts, params), plain.generate(prompts, params)
    assert packed.packed.nbytes > 0 and plain.packed is None
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-2 if dtype != torch.float32
                              else 1e-4)
    assert len(packed.packed._packed) == len(FastDecoder.linear_weights(model))
    packed.release_cache()  # the rollout is over: the copies go with the prefix cache
    assert packed.packed.nbytes == 0
