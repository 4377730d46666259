"""Generation backends: the transformers backend's samples, log-probs, stops and padding."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agent_gym.models.model_init import build_model
from agent_gym.trainers.backends import GenerationError, SamplingParams, TransformersBackend, make_backend


def _prompts(tokenizer, count=5, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(10, len(tokenizer) - 10) for _ in range(rng.randint(3, 30))] for _ in range(count)]


def _forward_logprobs(model, prompt, generated, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)


def _assert_logprobs_match_forward_passes(model, prompts, generations):
    for prompt, generation in zip(prompts, generations, strict=True):
        expected = _forward_logprobs(model, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "model-forward"])
def test_sampled_logprobs_equal_a_forward_pass_at_temperature_one(tiny_model, fast_path):
    model, tokenizer = tiny_model
    backend = TransformersBackend(model, tokenizer, fast_path=fast_path)
    assert backend.uses_fast_path == fast_path
    prompts = _prompts(tokenizer)
    generations = backend.generate(prompts, SamplingParams(max_new_tokens=24, seed=1))
    _assert_logprobs_match_forward_passes(model, prompts, generations)


def test_logprobs_are_those_of_the_temperature_scaled_distribution(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=3)
    generations = TransformersBackend(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=10, temperature=0.7, seed=2)
    )
    for prompt, generation in zip(prompts, generations, strict=True):
        expected = _forward_logprobs(model, prompt, generation.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_fast_path_and_model_forward_sample_the_same_tokens_with_the_same_seed(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=4)
    params = SamplingParams(max_new_tokens=16, seed=5)
    fast = TransformersBackend(model, tokenizer, fast_path=True).generate(prompts, params)
    slow = TransformersBackend(model, tokenizer, fast_path=False).generate(prompts, params)
    assert [g.token_ids for g in fast] == [g.token_ids for g in slow]


def test_greedy_continuation_does_not_depend_on_the_other_prompts_in_the_batch(tiny_model):
    model, tokenizer = tiny_model
    backend = TransformersBackend(model, tokenizer)
    prompts = _prompts(tokenizer, count=6)
    batched = backend.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    alone = [
        backend.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0] for prompt in prompts
    ]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]


def test_greedy_picks_the_argmax_token(tiny_model):
    model, tokenizer = tiny_model
    prompt = _prompts(tokenizer, count=1)[0]
    token = (
        TransformersBackend(model, tokenizer)
        .generate([prompt], SamplingParams(max_new_tokens=1, temperature=0.0))[0]
        .token_ids
    )
    with torch.no_grad():
        assert token == [int(model(torch.tensor([prompt])).logits[0, -1].argmax())]


def test_tiny_top_p_keeps_only_the_most_likely_token(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=3)
    backend = TransformersBackend(model, tokenizer)
    nucleus = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=3))
    greedy = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]


def test_same_seed_gives_the_same_samples(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=3)
    backend = TransformersBackend(model, tokenizer)
    first = backend.generate(prompts, SamplingParams(max_new_tokens=10, seed=11))
    assert [g.token_ids for g in first] == [
        g.token_ids for g in backend.generate(prompts, SamplingParams(max_new_tokens=10, seed=11))
    ]


def test_generation_stops_at_the_first_stop_token_and_includes_it(tiny_model):
    model, tokenizer = tiny_model
    stop_ids = list(range(10, len(tokenizer), 3))  # a third of the vocabulary: every row stops early
    generations = TransformersBackend(model, tokenizer).generate(
        _prompts(tokenizer, count=8), SamplingParams(max_new_tokens=64, stop_token_ids=stop_ids, seed=0)
    )
    for generation in generations:
        assert generation.finish_reason == "stop"
        assert generation.token_ids[-1] in stop_ids
        assert not set(generation.token_ids[:-1]) & set(stop_ids)
        assert len(generation.logprobs) == len(generation.token_ids)


def test_rows_without_a_stop_run_to_max_new_tokens_with_finish_reason_length(tiny_model):
    model, tokenizer = tiny_model
    generations = TransformersBackend(model, tokenizer).generate(
        _prompts(tokenizer, count=3), SamplingParams(max_new_tokens=7, seed=0)
    )
    assert all(g.finish_reason == "length" and len(g.token_ids) == 7 for g in generations)


def test_added_token_stop_string_is_matched_by_id_and_plain_text_on_decoded_text(tiny_model):
    model, tokenizer = tiny_model
    backend = TransformersBackend(model, tokenizer)
    stop_ids, text_stops = backend._stop_sets(SamplingParams(stop_strings=("</tool_call>", "Answer:")))
    assert stop_ids == {tokenizer.convert_tokens_to_ids("</tool_call>")}
    assert text_stops == ["Answer:"]


def test_text_stop_string_stops_at_its_first_occurrence(tiny_model):
    model, tokenizer = tiny_model
    stop = "e"  # inside many merged tokens, so it must be matched on text
    generations = TransformersBackend(model, tokenizer).generate(
        _prompts(tokenizer, count=6), SamplingParams(max_new_tokens=64, stop_strings=[stop], seed=0)
    )
    for generation in generations:
        assert generation.finish_reason == "stop"
        assert stop in tokenizer.decode(generation.token_ids)
        assert stop not in tokenizer.decode(generation.token_ids[:-1])


def test_more_prompts_than_max_batch_size_keep_their_order(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=7)
    small_batches = TransformersBackend(model, tokenizer, max_batch_size=2).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0.0)
    )
    one_batch = TransformersBackend(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0.0)
    )
    assert [g.token_ids for g in small_batches] == [g.token_ids for g in one_batch]


def test_empty_prompt_is_a_clear_error(tiny_model):
    model, tokenizer = tiny_model
    with pytest.raises(GenerationError, match="prompt 1 is empty"):
        TransformersBackend(model, tokenizer).generate([[5], []], SamplingParams(max_new_tokens=2))


def test_out_of_vocabulary_id_is_a_clear_error(tiny_model):
    model, tokenizer = tiny_model
    with pytest.raises(GenerationError, match="outside"):
        TransformersBackend(model, tokenizer).generate([[len(tokenizer) + 100]], SamplingParams(max_new_tokens=2))


def test_bad_sampling_settings_are_clear_errors(tiny_model):
    model, tokenizer = tiny_model
    with pytest.raises(ValueError, match="top_p"):
        TransformersBackend(model, tokenizer).generate([[5]], SamplingParams(max_new_tokens=2, top_p=0.0))


def test_make_backend_rejects_unknown_names(tiny_model):
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_backend("tgi", *tiny_model)


def test_sync_weights_copies_another_models_parameters(tiny_model_copy):
    target, tokenizer = tiny_model_copy
    other = build_model("tiny", tokenizer, seed=99)
    backend = TransformersBackend(target, tokenizer)
    backend.sync_weights(other)
    assert torch.equal(target.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_next_turn_reuses_the_cached_prefix_and_still_matches_a_forward_pass(tiny_model):
    model, tokenizer = tiny_model
    backend = TransformersBackend(model, tokenizer)
    prompts = _prompts(tokenizer, count=4)
    first = backend.generate(prompts, SamplingParams(max_new_tokens=10, seed=0))
    assert len(backend.prefix_cache.entries) == 4
    env_tokens = [[17, 18, 19], [20], [21, 22], [23, 24, 25, 26, 27]]
    follow_ups = [p + g.token_ids + e for p, g, e in zip(prompts, first, env_tokens, strict=True)]
    second = backend.generate(follow_ups, SamplingParams(max_new_tokens=10, seed=1))
    assert len(backend.prefix_cache.entries) == 4  # the 4 used entries were replaced by the 4 new ones
    _assert_logprobs_match_forward_passes(model, follow_ups, second)


def test_a_repeated_prompt_is_encoded_once_and_every_copy_samples_from_the_right_distribution(tiny_model, monkeypatch):
    from agent_gym.trainers.backends import decoders

    model, tokenizer = tiny_model
    a, b, c = _prompts(tokenizer, count=3, seed=3)
    prompts = [a, a, b, a, b, c]  # two GRPO-like groups on their first turn, and a prompt of its own
    encoded = []
    forward = decoders.FastDecoder._forward

    def counting_forward(self, input_ids, *args, **kwargs):
        encoded.append(input_ids.numel())
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(decoders.FastDecoder, "_forward", counting_forward)
    params = SamplingParams(max_new_tokens=1, seed=0)  # one token: the forward passes are the prefills
    generations = TransformersBackend(model, tokenizer).generate(prompts[:5], params)
    shared_positions = sum(encoded)
    encoded.clear()
    TransformersBackend(model, tokenizer, prefix_cache_size=0).generate(prompts[:5], params)  # no sharing
    assert shared_positions < 0.6 * sum(encoded)
    # every copy's log-probs are those of its own forward pass, with a unique prompt beside them too
    generations = TransformersBackend(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=8, seed=4))
    _assert_logprobs_match_forward_passes(model, prompts, generations)


def test_prefix_cache_keeps_to_its_byte_budget_dropping_the_oldest_entries_first(tiny_model):
    model, tokenizer = tiny_model
    prompts = _prompts(tokenizer, count=4)
    unlimited = TransformersBackend(model, tokenizer, prefix_cache_mb=None)
    unlimited.generate(prompts, SamplingParams(max_new_tokens=10, seed=0))
    sizes = {key: entry.nbytes for key, entry in unlimited.prefix_cache.entries.items()}
    assert unlimited.prefix_cache.nbytes == sum(sizes.values()) > 0
    budget = sum(sorted(sizes.values())[-2:])  # room for the two largest, so for any two
    backend = TransformersBackend(model, tokenizer, prefix_cache_mb=budget / 2**20)
    backend.generate(prompts[:2], SamplingParams(max_new_tokens=10, seed=0))  # older: evicted first
    backend.generate(prompts[2:], SamplingParams(max_new_tokens=10, seed=0))
    assert backend.prefix_cache.nbytes <= budget

    def cached(prompt: list[int]) -> bool:
        return any(key[: len(prompt)] == tuple(prompt) for key in backend.prefix_cache.entries)

    assert all(cached(prompt) for prompt in prompts[2:])  # the newest entries (the live episodes) stay
    assert not any(cached(prompt) for prompt in prompts[:2])


def test_prefix_cache_is_dropped_when_the_weights_change(tiny_model_copy):
    model, tokenizer = tiny_model_copy
    backend = TransformersBackend(model, tokenizer)
    prompts = _prompts(tokenizer, count=2)
    first = backend.generate(prompts, SamplingParams(max_new_tokens=6, seed=0))
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3.0)  # an in-place update, as an optimizer step does
    follow_ups = [p + g.token_ids + [30] for p, g in zip(prompts, first, strict=True)]
    second = backend.generate(follow_ups, SamplingParams(max_new_tokens=6, seed=1))
    _assert_logprobs_match_forward_passes(model, follow_ups, second)


def test_large_batch_of_very_different_prompt_lengths_matches_a_forward_pass(tiny_model):
    model, tokenizer = tiny_model
    rng = random.Random(7)
    # 40 rows from 2 to 300 tokens: several prefill and decode-attention groups, each skipping its padding.
    prompts = [[rng.randrange(10, 500) for _ in range(length)] for length in range(2, 302, 7)]
    generations = TransformersBackend(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=5, seed=3))
    _assert_logprobs_match_forward_passes(model, prompts, generations)


def test_bf16_decoding_over_the_whole_cache_matches_a_bf16_forward_pass(tiny_model):
    # Decode attention reads every column of the preallocated cache (the unused ones and the padding masked),
    # where bf16 matmuls are fast: rows of very different lengths, some stopping early, must not see them.
    model, tokenizer = tiny_model
    half = copy.deepcopy(model).to(torch.bfloat16)
    rng = random.Random(11)
    prompts = [[rng.randrange(10, 500) for _ in range(length)] for length in (3, 40, 7, 120, 64, 2, 90, 15)]
    generations = TransformersBackend(half, tokenizer).generate(prompts, SamplingParams(max_new_tokens=12, seed=4))
    assert TransformersBackend(half, tokenizer).uses_fast_path
    for prompt, generation in zip(prompts, generations, strict=True):
        expected = _forward_logprobs(half, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=0.05), (len(prompt), generation)


def test_sampler_draws_tokens_with_the_temperature_scaled_probabilities():
    from agent_gym.trainers.backends.transformers_backend import _sample

    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])).repeat(40_000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = _sample(logits, SamplingParams(temperature=0.5), generator)
    expected = torch.softmax(logits[0] / 0.5, -1)
    assert torch.allclose(torch.bincount(tokens, minlength=4) / 40_000, expected, atol=0.01)
    assert torch.allclose(logprobs, expected.log()[tokens], atol=1e-6)


def test_sampler_never_draws_outside_the_top_p_nucleus():
    from agent_gym.trainers.backends.transformers_backend import _sample

    logits = torch.log(torch.tensor([0.05, 0.15, 0.3, 0.5])).repeat(20_000, 1)
    tokens, _ = _sample(logits, SamplingParams(top_p=0.75), torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=4) / 20_000
    assert counts[:2].sum() == 0  # 0.5 + 0.3 already reach 0.75
    assert torch.allclose(counts[2:], torch.tensor([0.375, 0.625]), atol=0.015)
