"""The one token-episode builder: its layouts equal the ones the collector, verl's loop and SFT built by hand."""

from __future__ import annotations

import random
import string
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from agent_gym.models.chat_template import (
    encode_plain_text,
    render_delta,
    render_prompt,
    turn_stop_token_ids,
)
from agent_gym.models.model_init import train_tokenizer
from agent_gym.trainers.token_episode import SFTExample, TokenEpisode, tokenize_episode

CONVERSATIONS = [
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
     {"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "R"},
     {"role": "assistant", "content": "<answer>y</answer>"}],
    # a trailing env reply, two replies in a row, and a turn that writes the end-of-turn marker as text
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a <|im_end|> b"},
     {"role": "tool", "content": "R1"}, {"role": "user", "content": "R2"}, {"role": "assistant", "content": "c"},
     {"role": "tool", "content": "R3"}],
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7))) for _ in range(300)]
    return train_tokenizer([" ".join(rng.choices(words, k=30)) for _ in range(300)], vocab_size=600)


def sft_layout_by_hand(tokenizer: Any, messages: Sequence[dict]) -> SFTExample:
    """SFT's layout as warmstart/sft.py wrote it before the builder (the reference it must keep)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    input_ids = render_prompt(tokenizer, messages[:first])
    loss_mask = [0] * len(input_ids)
    index = first
    while index < len(messages):
        turn = encode_plain_text(tokenizer, messages[index]["content"]) + [tokenizer.eos_token_id]
        input_ids, loss_mask = input_ids + turn, loss_mask + [1] * len(turn)
        following = index + 1
        while following < len(messages) and messages[following]["role"] != "assistant":
            following += 1
        if following < len(messages) or following > index + 1:
            delta = render_delta(tokenizer, messages[index + 1 : following], tokenizer.eos_token,
                                 add_generation_prompt=following < len(messages))
            input_ids, loss_mask = input_ids + delta, loss_mask + [0] * len(delta)
        index = following
    return SFTExample(input_ids, loss_mask)


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_sft_layout_is_the_hand_written_one_token_for_token(tokenizer: Any, conversation: int) -> None:
    messages = CONVERSATIONS[conversation]
    assert tokenize_episode(tokenizer, messages) == sft_layout_by_hand(tokenizer, messages)


def test_a_sampled_turn_and_the_envs_reply_are_laid_out_as_the_collector_laid_them_out(tokenizer: Any) -> None:
    prompt = [{"role": "user", "content": "Q"}]
    reply = [{"role": "tool", "content": "R"}]
    turn = encode_plain_text(tokenizer, "abc") + [tokenizer.eos_token_id]
    episode = TokenEpisode(tokenizer, prompt)
    episode.add_model_turn(turn, [-0.5] * len(turn))
    episode.add_env_messages(reply)
    delta = render_delta(tokenizer, reply, tokenizer.decode([tokenizer.eos_token_id]))
    sample = episode.sample
    assert sample.prompt_ids == render_prompt(tokenizer, prompt)
    assert sample.response_ids == turn + delta
    assert sample.loss_mask == [1] * len(turn) + [0] * len(delta)
    assert sample.logprobs == [-0.5] * len(turn) + [0.0] * len(delta)


def test_a_turn_without_a_stop_token_gets_the_whole_turn_closing(tokenizer: Any) -> None:
    episode = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}])
    turn = encode_plain_text(tokenizer, "abc")
    episode.add_model_turn(turn)
    episode.add_env_messages([{"role": "tool", "content": "R"}])
    assert episode.sample.response_ids[len(turn):] == render_delta(tokenizer, [{"role": "tool", "content": "R"}], None)


def test_a_turn_is_cut_to_the_context_budget_and_a_full_context_cuts_the_episode(tokenizer: Any) -> None:
    episode = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}], max_context_tokens=30)
    room = 30 - len(episode.sample.prompt_ids)
    kept = episode.add_model_turn(list(range(5, 5 + room + 4)), finish_reason="length")
    assert kept == list(range(5, 5 + room)) and episode.finish_reasons == ["context"]
    assert episode.add_model_turn([7]) is None and episode.cut_reason == "context"


def test_a_reply_that_fills_the_response_budget_cuts_the_episode(tokenizer: Any) -> None:
    episode = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}], max_response_tokens=4)
    episode.add_model_turn([5, 6])
    assert episode.add_env_messages([{"role": "tool", "content": "a long tool result"}]) is False
    assert episode.cut_reason == "context" and episode.sample.response_ids == [5, 6] and episode.needs_truncation


def test_a_context_rewrite_starts_a_new_sample_unless_the_consumer_takes_one_sequence(tokenizer: Any) -> None:
    rewritten = [{"role": "user", "content": "Q"}, {"role": "user", "content": "summary"}]
    info = {"messages": rewritten, "new_messages": [{"role": "tool", "content": "R"}], "context_rewritten": True}
    split = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}])
    split.add_model_turn([5])
    split.add_env_reply(info)
    one = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}], new_sample_on_rewrite=False)
    one.add_model_turn([5])
    one.add_env_reply(info)
    assert len(split.samples) == 2 and split.sample.prompt_ids == render_prompt(tokenizer, rewritten)
    assert len(one.samples) == 1 and one.sample.response_ids[1:] == render_delta(tokenizer, info["new_messages"], None)


def test_rewards_go_on_the_last_turn_and_every_sample_shares_the_outcome(tokenizer: Any) -> None:
    episode = TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}])
    episode.add_model_turn([5])
    episode.pay(0.25)
    episode.add_env_reply({"messages": [{"role": "user", "content": "S"}], "context_rewritten": True})
    episode.add_model_turn([6, 7])
    episode.pay(1.0)
    episode.pay(-0.5)  # a truncation's reward
    first, second = episode.trajectories("g", {"task_id": "t"})
    assert (first.turn_rewards, second.turn_rewards) == ([0.25], [0.5])
    assert first.outcome == second.outcome == 0.75
    assert (first.info["sample_index"], second.info["num_samples"], second.info["task_id"]) == (0, 2, "t")


def test_the_default_stop_tokens_are_the_tokenizers(tokenizer: Any) -> None:
    assert TokenEpisode(tokenizer, [{"role": "user", "content": "Q"}]).stop_token_ids == set(
        turn_stop_token_ids(tokenizer))


def test_the_drills_take_their_layout_from_the_builder_not_from_sft() -> None:
    code = ("import sys, agent_gym.warmstart.copy_drills, agent_gym.warmstart.copy_skill; "
            "print('agent_gym.warmstart.sft' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
