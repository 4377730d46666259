"""Pretraining a from-scratch model to copy: the induction warm-up, pointer drills, and the resumable loop."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agent_gym.models.model_init import build_model, train_tokenizer
from agent_gym.retrieval_index.search_tool import first_hits
from agent_gym.trainers.token_episode import tokenize_episode
from agent_gym.warmstart.copy_drills import DrillSource, drill_row
from agent_gym.warmstart.induction import induction_rows, induction_vocab, install_previous_token_head
from agent_gym.warmstart.pretrain import PretrainConfig, Pretrainer
from agent_gym.warmstart.sft import SFTConfig, train_sft

SYNTH = {"num_pages": 60, "kinds": ["bridge"], "hops": [1, 2], "top_k": 2, "split": "all", "num_questions": 8}


@pytest.fixture(scope="module")
def tokenizer():
    from agent_gym.envs.synthetic_world import generate_world

    texts = [f"{page.title} {page.text}" for seed in range(3) for page in generate_world(num_pages=60, seed=seed).pages]
    return train_tokenizer(texts + ['{"name": "search", "arguments": {"query": "x"}}'], vocab_size=700)


def test_previous_token_head_attends_to_the_previous_position(tokenizer) -> None:
    model = build_model("tiny", tokenizer, seed=0)
    install_previous_token_head(model)
    model.config._attn_implementation = "eager"  # only eager attention returns its weights
    ids = torch.randint(300, len(tokenizer) - 20, (1, 64))
    attention = model(input_ids=ids, output_attentions=True).attentions[0][0, 0]
    assert attention.diagonal(-1).mean() > 0.9


def test_previous_token_head_needs_attention_biases(tokenizer) -> None:
    model = build_model("tiny", tokenizer, seed=0)
    model.model.layers[0].self_attn.q_proj.bias = None
    with pytest.raises(ValueError, match="biases"):
        install_previous_token_head(model)


def test_induction_rows_weight_exactly_the_tokens_a_copy_can_predict() -> None:
    rows = induction_rows(random.Random(0), list(range(100, 1000)), count=20, vocab=64, width=128)
    for row in rows:
        assert len(row.input_ids) == len(row.weights) == 128
        assert len(set(row.input_ids)) <= 64  # each row draws from a subset of its own
        weighted = [t for t, w in enumerate(row.weights) if w]
        assert weighted and min(weighted) >= 128 // 4
        for t in weighted:  # every weighted token continues a span that occurred earlier
            ids = row.input_ids
            assert any(ids[s : s + 2] == ids[t - 1 : t + 1] for s in range(t - 1))


def test_induction_vocabulary_holds_then_doubles_up_to_all_ids() -> None:
    ids = list(range(1000))
    sizes = [induction_vocab(step, ids, start=64, hold_steps=10, doubling_steps=5) for step in (0, 10, 15, 20, 99)]
    assert sizes == [64, 64, 128, 256, 1000]


def test_first_hits_cuts_a_result_list_and_leaves_other_text_alone() -> None:
    text = "Doc 1 (Title: A) a.\nDoc 2 (Title: B) b.\nDoc 3 (Title: C) c."
    assert first_hits(text, 1) == "Doc 1 (Title: A) a."
    assert first_hits(text, 2) == "Doc 1 (Title: A) a.\nDoc 2 (Title: B) b."
    assert first_hits("No results found.", 1) == "No results found."


def _oracle_messages() -> list[dict]:
    import gymnasium as gym

    from agent_gym.evaluation import run_episode
    from agent_gym.policies import make_policy

    env = gym.make("AgentR1-SynthHop-v0", **{**SYNTH, "hops": 2})
    play = run_episode(env, make_policy("oracle"), seed=0, options={"task_index": 0}, keep_messages=True)
    env.close()
    return play.messages


def test_drill_forms_keep_what_they_promise(tokenizer) -> None:
    messages = _oracle_messages()
    full = drill_row(tokenizer, messages, "full")
    first = drill_row(tokenizer, messages, "first_turn")
    one_hit = drill_row(tokenizer, messages, "one_hit")
    assert full.input_ids == tokenize_episode(tokenizer, messages).input_ids  # the env's own layout
    assert len(first.input_ids) < len(one_hit.input_ids) < len(full.input_ids)
    assert "Doc 2" not in tokenizer.decode(one_hit.input_ids) and "Doc 2" in tokenizer.decode(full.input_ids)
    first_text = tokenizer.decode(first.input_ids)
    assert messages[0]["content"][:40] not in first_text  # no system prompt
    assert first_text.count("<tool_call>") == 1
    assert set(full.weights) == {1.0, 0.1}  # assistant tokens 1, the rest the env-token weight


def test_drills_of_an_index_are_the_same_every_time_and_new_names_the_next(tokenizer) -> None:
    source = DrillSource(tokenizer, "AgentR1-SynthHop-v0", SYNTH, forms={"first_turn": 1.0})
    first, again, other = source.rows(0, 300), source.rows(0, 300), source.rows(1, 300)
    assert [row.input_ids for row in first] == [row.input_ids for row in again]
    assert sum(len(row.input_ids) for row in first) >= 300
    words = {tokenizer.decode(row.input_ids) for row in first}
    assert words.isdisjoint({tokenizer.decode(row.input_ids) for row in other})


def _pretrainer(tmp_path: Path, tokenizer, **overrides) -> Pretrainer:
    settings = dict(model="unused", output_dir=str(tmp_path), env_kwargs=SYNTH, induction_steps=2, drill_steps=2,
                    batch_tokens=256, induction_width=64, eval_every=0, save_every=2, eval_episodes=2,
                    eval_env_kwargs={"world_seed": 99, "hops": 2}, show_progress=False, torch_threads=1)
    settings.update(overrides)
    return Pretrainer(PretrainConfig(**settings), build_model("tiny", tokenizer, seed=0), tokenizer)


def test_pretraining_resumed_from_a_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(
    tmp_path, tokenizer
) -> None:
    straight = _pretrainer(tmp_path / "straight", tokenizer)
    straight.train()
    killed = _pretrainer(tmp_path / "resumed", tokenizer)
    real_rows = killed.rows

    def rows_until_killed(step):
        if step == 3:
            raise KeyboardInterrupt  # killed during step 3, after the step-2 checkpoint
        return real_rows(step)

    killed.rows = rows_until_killed
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    resumed = _pretrainer(tmp_path / "resumed", tokenizer)
    resumed.train()
    for name, tensor in straight.model.state_dict().items():
        assert torch.allclose(tensor, resumed.model.state_dict()[name], atol=1e-6), name


def test_pretraining_logs_the_copy_skill_it_measures(tmp_path, tokenizer) -> None:
    from agent_gym.trainers.metrics import read_metrics

    pretrainer = _pretrainer(tmp_path, tokenizer, eval_every=4)
    scores = pretrainer.train()
    assert {"copy/turn1_exact", "copy/turn2_exact", "copy/min_exact"} <= set(scores)
    assert read_metrics(tmp_path)[-1]["copy/min_exact"] == scores["copy/min_exact"]
    assert (tmp_path / "final" / "config.json").is_file()


def test_sft_resumed_from_a_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(
    tmp_path, tokenizer, monkeypatch
) -> None:
    import agent_gym.warmstart.lm_loss as lm_loss

    examples = [tokenize_episode(tokenizer, _oracle_messages())] * 6
    config = SFTConfig(epochs=2, batch_size=2, lr=1e-3, save_every=2, seed=3)
    straight = build_model("tiny", tokenizer, seed=0)
    straight_losses = train_sft(straight, tokenizer, examples, config, show_progress=False)

    real_loss, calls = lm_loss.weighted_lm_loss, []

    def loss_until_killed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # killed during step 4 of 6, after the step-2 checkpoint
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(lm_loss, "weighted_lm_loss", loss_until_killed)
    with pytest.raises(KeyboardInterrupt):
        train_sft(build_model("tiny", tokenizer, seed=0), tokenizer, examples, config, output_dir=tmp_path,
                  show_progress=False)
    monkeypatch.setattr(lm_loss, "weighted_lm_loss", real_loss)
    resumed = build_model("tiny", tokenizer, seed=0)
    losses = train_sft(resumed, tokenizer, examples, config, output_dir=tmp_path, show_progress=False)
    # it went on from the step-2 checkpoint, and its loss history is the whole run's (sft_summary reads it)
    assert len(losses) == 6 and losses == pytest.approx(straight_losses, abs=1e-5)
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(tensor, resumed.state_dict()[name], atol=1e-6), name


def test_sft_with_drills_needs_a_drill_source(tokenizer) -> None:
    examples = [tokenize_episode(tokenizer, _oracle_messages())]
    with pytest.raises(ValueError, match="DrillSource"):
        train_sft(build_model("tiny", tokenizer), tokenizer, examples, SFTConfig(drill_tokens=100), show_progress=False)


def test_sft_mixes_drills_into_every_step(tokenizer) -> None:
    calls = []

    class CountingDrills(DrillSource):
        def rows(self, index, tokens):
            calls.append(index)
            return super().rows(index, tokens)

    drills = CountingDrills(tokenizer, "AgentR1-SynthHop-v0", SYNTH, forms={"first_turn": 1.0})
    examples = [tokenize_episode(tokenizer, _oracle_messages())] * 4
    config = SFTConfig(epochs=1, batch_size=2, drill_tokens=100)
    train_sft(build_model("tiny", tokenizer), tokenizer, examples, config, drills=drills, show_progress=False)
    assert calls == [0, 1]


def test_a_head_set_to_offset_two_attends_two_tokens_back(tokenizer) -> None:
    model = build_model("tiny", tokenizer, seed=0)
    install_previous_token_head(model, head=1, offset=2)
    model.config._attn_implementation = "eager"
    ids = torch.randint(300, len(tokenizer) - 20, (1, 64))
    attention = model(input_ids=ids, output_attentions=True).attentions[0][0, 1]
    assert attention.diagonal(-2).mean() > 0.9


def test_pretrain_flags_read_the_offsets_as_integers() -> None:
    import argparse

    from agent_gym.cli.config_flags import add_dataclass_arguments, config_from_namespace

    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, PretrainConfig)
    config = config_from_namespace(parser.parse_args(["--model", "m", "--previous-token-offsets", "1", "2"]),
                                   PretrainConfig)
    assert config.previous_token_offsets == [1, 2]


def test_offsets_that_would_fix_every_head_of_the_first_layer_are_refused(tmp_path, tokenizer) -> None:
    from agent_gym.trainers.config import ConfigError

    with pytest.raises(ConfigError, match=r"would fix all 2 heads of the first layer; leave at least one free"):
        _pretrainer(tmp_path, tokenizer, previous_token_offsets=[1, 2])
    assert _pretrainer(tmp_path, tokenizer).config.previous_token_offsets == [1]


def test_drills_are_played_in_the_envs_own_fresh_worlds(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent_gym.make

    made: list[dict] = []

    class Made(Exception):
        pass

    def record(env_id: str, env_kwargs: dict) -> None:
        made.append(dict(env_kwargs))
        raise Made

    monkeypatch.setattr(agent_gym.make, "make_env", record)
    source = DrillSource(None, "AgentR1-SynthHop-v0", {"num_pages": 300, "world_seed": 0})
    for index in (0, 7):
        with pytest.raises(Made):
            source.rows(index, tokens=10)
    assert made == [{"num_pages": 300, "world_seed": 0, "fresh_world": 0},
                    {"num_pages": 300, "world_seed": 0, "fresh_world": 7}]
