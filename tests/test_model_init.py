"""Model init: a locally trained byte-level BPE tokenizer, the Qwen2.5 chat template, a saved Qwen2 model."""

from __future__ import annotations

import argparse
import json
import random
import string

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_gym.cli.model import add_model_init_arguments, run_model_init
from agent_gym.models.chat_template import assistant_turn_suffix, render_delta, render_prompt
from agent_gym.models.model_init import (
    PRESETS,
    SPECIAL_TOKENS,
    ModelInitError,
    build_model,
    count_parameters,
    init_model,
    load_model_and_tokenizer,
    texts_from_env,
    train_tokenizer,
)
from agent_gym.spaces import UnicodeText

CORPUS = [
    "Herman Melville wrote Moby Dick in 1851. He was born in New York City.",
    "Paris is the capital of France; Tokyo is the capital of Japan.",
    'Call {"name": "search", "arguments": {"query": "capital of France"}} to search the corpus.',
] * 20
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "Answer with <answer>...</answer>."},
    {"role": "user", "content": "Where was the author of Moby Dick born?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "search", "arguments": {"query": "Moby Dick"}}\n</tool_call>',
    },
    {"role": "tool", "content": "Moby Dick is a novel by Herman Melville."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=512)


def test_tokenizer_round_trips_any_text_exactly(tokenizer):
    text = "naïve café 12345 — ünïcödé \t tabs\n\nnewlines <answer>Paris</answer> 日本"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.parametrize("token", SPECIAL_TOKENS)
def test_every_special_token_is_a_single_id(tokenizer, token):
    assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1


def test_markup_tokens_survive_decoding_without_special_tokens(tokenizer):
    ids = tokenizer("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_and_tool_responses_qwen_style(tokenizer):
    text = tokenizer.decode(render_prompt(tokenizer, MESSAGES, TOOLS))
    assert text.startswith("<|im_start|>system\nAnswer with <answer>...</answer>.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    assert (
        "<|im_start|>user\n<tool_response>\nMoby Dick is a novel by Herman Melville.\n</tool_response>"
        in text
    )
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_prompt_plus_sampled_turn_plus_delta_equals_the_full_rendering(tokenizer):
    sampled_turn = tokenizer(MESSAGES[2]["content"], add_special_tokens=False)["input_ids"]
    delta = render_delta(tokenizer, MESSAGES[3:], model_ended_turn_with=None)
    assert render_prompt(tokenizer, MESSAGES[:2]) + sampled_turn + delta == render_prompt(tokenizer, MESSAGES)


def test_render_delta_skips_the_turn_closing_the_model_already_sampled(tokenizer):
    closing = assistant_turn_suffix(tokenizer)
    assert closing == "<|im_end|>\n"
    delta = render_delta(tokenizer, MESSAGES[3:], model_ended_turn_with="<|im_end|>")
    assert tokenizer.decode(delta).startswith("\n<|im_start|>user\n<tool_response>")


def test_empty_corpus_is_a_clear_error():
    with pytest.raises(ModelInitError, match="non-empty corpus"):
        train_tokenizer(["", ""], vocab_size=512)


def test_tiny_preset_has_one_to_three_million_parameters():
    rng = random.Random(0)
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) for _ in range(5000)
    ]
    tokenizer = train_tokenizer(
        [" ".join(rng.choices(words, k=50)) for _ in range(2000)], vocab_size=PRESETS["tiny"].vocab_size
    )
    assert len(tokenizer) == PRESETS["tiny"].vocab_size
    assert 1e6 <= count_parameters(build_model("tiny", tokenizer)) <= 3e6


def test_unknown_preset_is_a_clear_error(tokenizer):
    with pytest.raises(ModelInitError, match="unknown preset"):
        build_model("huge", tokenizer)


def test_saved_model_loads_with_auto_classes_and_gives_the_same_logits(tmp_path):
    out = init_model(CORPUS, tmp_path / "model", preset="tiny", vocab_size=512, seed=3)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    assert tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False).startswith(
        "<|im_start|>system"
    )
    reference = build_model("tiny", train_tokenizer(CORPUS, vocab_size=512), seed=3)
    ids = torch.tensor([render_prompt(tokenizer, MESSAGES)])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)


def test_load_model_and_tokenizer_pads_left_and_has_a_pad_token(tmp_path):
    out = init_model(CORPUS, tmp_path / "model", preset="tiny", vocab_size=512)
    _, tokenizer = load_model_and_tokenizer(out)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token == "<|im_end|>"


def test_saved_weights_are_as_readable_as_the_config_beside_them(tmp_path):
    out = init_model(CORPUS, tmp_path / "model", preset="tiny", vocab_size=512)
    config_mode = (out / "config.json").stat().st_mode & 0o777
    assert config_mode & 0o044  # the umask's usual 0644, readable by the group and others
    assert (out / "model.safetensors").stat().st_mode & 0o777 == config_mode


def test_a_saved_lora_adapter_is_as_readable_as_its_config(tmp_path):
    from peft import LoraConfig, get_peft_model

    from agent_gym.models.model_init import save_model

    adapter = get_peft_model(build_model("tiny", train_tokenizer(CORPUS, vocab_size=512)),
                             LoraConfig(r=2, target_modules="all-linear"))
    out = save_model(adapter, None, tmp_path / "adapter")
    assert ((out / "adapter_model.safetensors").stat().st_mode & 0o777
            == (out / "adapter_config.json").stat().st_mode & 0o777)


def test_load_model_of_a_missing_path_says_how_to_build_one(tmp_path):
    with pytest.raises(ModelInitError, match="agent-gym model init"):
        load_model_and_tokenizer(tmp_path / "nothing-here")


def test_model_init_command_builds_from_a_corpus_file(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "title": "T", "text": text}) + "\n" for i, text in enumerate(CORPUS)
        )
    )
    parser = argparse.ArgumentParser()
    add_model_init_arguments(parser)
    ns = parser.parse_args(["--corpus", str(corpus), "--out", str(tmp_path / "m"), "--vocab-size", "400"])
    assert run_model_init(ns) == 0
    assert (tmp_path / "m" / "config.json").is_file()
    assert "saved tiny model" in capsys.readouterr().out


class CorpusEnv(gym.Env):
    """A minimal docs/DESIGN.md §2 env whose unwrapped object offers `corpus_texts()`."""

    def __init__(self, question: str = "Who founded Zorblax Industries?") -> None:
        self.observation_space = self.action_space = UnicodeText(max_length=1000)
        self.question = question

    def corpus_texts(self) -> list[str]:
        return ["Zorblax Industries was founded by Quentin Vrill in 1901."] * 50

    def reset(self, *, seed=None, options=None):
        messages = [
            {"role": "system", "content": "Use the search tool."},
            {"role": "user", "content": self.question},
        ]
        return self.question, {"messages": messages, "tools": TOOLS}


def test_tokenizer_from_env_learns_its_corpus_and_prompts(tmp_path):
    gym.register("AgentGymTest/Corpus-v0", entry_point=CorpusEnv)
    try:
        texts = texts_from_env(
            "AgentGymTest/Corpus-v0", num_prompts=2, env_kwargs={"question": "Who is Vrill?"}
        )
    finally:
        gym.registry.pop("AgentGymTest/Corpus-v0")
    assert "Zorblax Industries was founded by Quentin Vrill in 1901." in texts
    assert "Who is Vrill?" in texts and json.dumps(TOOLS[0]) in texts
    tokenizer = train_tokenizer(texts, vocab_size=400)
    assert len(tokenizer(" Zorblax", add_special_tokens=False)["input_ids"]) <= 2  # a learned merge


def test_unknown_env_id_is_a_clear_error():
    with pytest.raises(ModelInitError, match="cannot make env"):
        texts_from_env("AgentGymTest/NoSuchEnv-v0")


def test_letters_pre_tokenizer_gives_a_name_the_same_ids_in_prose_and_in_json() -> None:
    corpus = [f"Doc {i} (Title: Hikric Brunourk) Hikric Brunourk was born in Touzalm." for i in range(50)]
    name_ids = {}
    for split in ("letters", "qwen2"):
        tokenizer = train_tokenizer(corpus, vocab_size=400, pre_tokenizer=split)
        name = tokenizer("Hikric Brunourk", add_special_tokens=False)["input_ids"]
        prose = tokenizer("He met Hikric Brunourk there.", add_special_tokens=False)["input_ids"]
        query = tokenizer('{"query": "Hikric Brunourk"}', add_special_tokens=False)["input_ids"]
        contains = [any(ids[i : i + len(name)] == name for i in range(len(ids))) for ids in (prose, query)]
        name_ids[split] = all(contains)
    assert name_ids == {"letters": True, "qwen2": False}


def test_unknown_pre_tokenizer_is_refused_naming_the_choices() -> None:
    with pytest.raises(ModelInitError, match="letters"):
        train_tokenizer(CORPUS, vocab_size=512, pre_tokenizer="words")


def test_search_tool_reports_its_corpus_texts_to_a_tokenizer_trainer() -> None:
    from agent_gym.envs.synthetic_world import generate_world

    env = gym.make("AgentR1-SynthHop-v0", num_pages=60)
    texts = env.unwrapped.corpus_texts()
    env.close()
    pages = generate_world(num_pages=60, seed=0).pages
    assert all(f"{page.title} {page.text}" in texts for page in pages)
