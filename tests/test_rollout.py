"""The rollout collector: token-in/token-out trajectories from an env that follows docs/DESIGN.md §2 only."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import pytest
import torch
from conftest import FACT_TASKS, FactLookup
from support.backends import RecordingBackend, ScriptedBackend

from agent_gym import register_tool_env
from agent_gym.env import ToolEnv
from agent_gym.models.chat_template import render_delta, render_prompt
from agent_gym.spaces import UnicodeText
from agent_gym.trainers.backends import TransformersBackend
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig, RolloutError, evaluate
from agent_gym.trainers.token_episode import tokenize_episode
from agent_gym.trainers.trajectory import collate
from agent_gym.warmstart.sft import SFTConfig, train_sft


class EchoToolEnv(gym.Env):
    """Every turn gets a tool response naming the turn; the episode ends after `num_turns` turns.

    Turn t pays 0.1 * t; the last turn pays 1.0 more. With `rewrite_at`, the step of that turn keeps only the
    system prompt, the question and a summary message, and flags `context_rewritten`.
    """

    metadata = {"render_modes": []}
    TOOLS = [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]

    def __init__(self, num_turns: int = 3, rewrite_at: int | None = None) -> None:
        self.observation_space = UnicodeText(max_length=10_000)
        self.action_space = UnicodeText(max_length=10_000)
        self.num_turns, self.rewrite_at = num_turns, rewrite_at
        self.actions: list[str] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.task_id = str((options or {}).get("task_id", "default"))
        self.turn = 0
        self.messages = [
            {"role": "system", "content": "Use the echo tool."},
            {"role": "user", "content": f"Question about {self.task_id}?"},
        ]
        self.actions = []
        return self.messages[-1]["content"], {
            "messages": [dict(m) for m in self.messages],
            "tools": self.TOOLS,
            "task_id": self.task_id,
            "tool_format": "hermes",
            "stop_strings": ["</tool_call>", "</answer>"],
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        self.actions.append(action)
        self.messages.append({"role": "assistant", "content": action})
        terminated = self.turn >= self.num_turns
        reward = 0.1 * self.turn + (1.0 if terminated else 0.0)
        rewritten = self.turn == self.rewrite_at
        observation = "" if terminated else f"echo result of turn {self.turn}"
        if not terminated:
            self.messages.append({"role": "tool", "content": observation})
        if rewritten:
            self.messages = self.messages[:2] + [
                {"role": "user", "content": f"Summary: {self.turn} turns so far."}
            ]
        info = {
            "messages": [dict(m) for m in self.messages],
            "task_id": self.task_id,
            "context_rewritten": rewritten,
            "reward_components": {"em": float(terminated), "f1": 0.5},
        }
        return observation, reward, terminated, False, info


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The suite's shared tiny model and tokenizer (conftest); tests here never change its weights."""
    return tiny_model


def _collector(tiny, envs, **config):
    model, tokenizer = tiny
    backend = RecordingBackend(TransformersBackend(model, tokenizer))
    config = {"max_new_tokens": 12, "show_progress": False, **config}
    return RolloutCollector(envs, backend, tokenizer, RolloutConfig(**config)), backend


def _runs(mask: list[int], value: int) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of `value` in `mask`."""
    runs, start = [], None
    for index, item in enumerate(mask + [1 - value]):
        if item == value and start is None:
            start = index
        elif item != value and start is not None:
            runs.append((start, index))
            start = None
    return runs


def test_response_holds_the_backends_generated_ids_verbatim(tiny):
    collector, backend = _collector(tiny, [EchoToolEnv()])
    [trajectory] = collector.collect(["t0"], seed=0)
    generations = [generations[0] for _, generations in backend.calls]
    model_runs = _runs(trajectory.loss_mask, 1)
    assert [trajectory.response_ids[a:b] for a, b in model_runs] == [g.token_ids for g in generations]
    assert [trajectory.sampling_logprobs[a:b] for a, b in model_runs] == [g.logprobs for g in generations]


def test_each_turn_is_sampled_from_the_exact_tokens_of_the_trajectory_so_far(tiny):
    collector, backend = _collector(tiny, [EchoToolEnv()])
    [trajectory] = collector.collect(["t0"], seed=0)
    full = trajectory.prompt_ids + trajectory.response_ids
    for (prompts, _), turn_end in zip(backend.calls, [-1] + trajectory.turn_end_indices[:-1], strict=True):
        boundary = len(trajectory.prompt_ids) + turn_end + 1
        assert prompts[0] == full[: len(prompts[0])]
        assert len(prompts[0]) >= boundary  # earlier model tokens are reused, never re-encoded


def test_the_backends_prefix_cache_serves_later_turns_and_is_empty_once_every_episode_ended(tiny):
    model, tokenizer = tiny
    inner = TransformersBackend(model, tokenizer)
    sizes: list[int] = []
    generate = inner.generate

    def generate_and_count(prompts, params):
        sizes.append(len(inner.prefix_cache.entries))  # what the turn can reuse
        return generate(prompts, params)

    inner.generate = generate_and_count
    collector = RolloutCollector([EchoToolEnv(), EchoToolEnv()], inner, tokenizer,
                                 RolloutConfig(max_new_tokens=12, show_progress=False))
    collector.collect(["t0", "t1"], seed=0)
    assert len(sizes) > 1 and sizes[0] == 0 and all(size > 0 for size in sizes[1:])
    assert len(inner.prefix_cache.entries) == 0 and inner.prefix_cache.nbytes == 0


def test_loss_mask_is_zero_exactly_on_the_rendered_env_observations(tiny):
    model, tokenizer = tiny
    env = EchoToolEnv()
    collector, backend = _collector(tiny, [env])
    [trajectory] = collector.collect(["t0"], seed=0)
    env_runs = _runs(trajectory.loss_mask, 0)
    assert len(env_runs) == 2  # after turns 1 and 2; the episode ends after turn 3
    for turn, (start, end) in enumerate(env_runs, 1):
        last_model_token = trajectory.response_ids[start - 1]
        ended = tokenizer.decode([last_model_token]) if last_model_token in collector.stop_token_ids else None
        expected = render_delta(
            tokenizer, [{"role": "tool", "content": f"echo result of turn {turn}"}], ended
        )
        assert trajectory.response_ids[start:end] == expected
        assert all(logprob == 0.0 for logprob in trajectory.sampling_logprobs[start:end])


def test_prompt_is_the_chat_template_rendering_of_the_reset_messages(tiny):
    model, tokenizer = tiny
    collector, _ = _collector(tiny, [EchoToolEnv()])
    [trajectory] = collector.collect(["t0"], seed=0)
    messages = [
        {"role": "system", "content": "Use the echo tool."},
        {"role": "user", "content": "Question about t0?"},
    ]
    assert trajectory.prompt_ids == render_prompt(tokenizer, messages)


def test_turn_end_indices_are_the_last_model_token_of_each_turn(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv()])
    [trajectory] = collector.collect(["t0"], seed=0)
    assert trajectory.turn_end_indices == [end - 1 for _, end in _runs(trajectory.loss_mask, 1)]


def test_turn_rewards_sit_on_each_turns_last_model_token(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv()])
    [trajectory] = collector.collect(["t0"], seed=0)
    rewards = trajectory.token_rewards()
    assert [rewards[index] for index in trajectory.turn_end_indices] == pytest.approx([0.1, 0.2, 1.3])
    assert sum(rewards) == pytest.approx(1.6)
    assert trajectory.outcome == pytest.approx(1.6)


def test_env_receives_the_decoded_model_tokens_of_each_turn(tiny):
    model, tokenizer = tiny
    env = EchoToolEnv()
    collector, backend = _collector(tiny, [env])
    collector.collect(["t0"], seed=0)
    decoded = [
        tokenizer.decode(generations[0].token_ids, skip_special_tokens=True)
        for _, generations in backend.calls
    ]
    assert env.actions == decoded


def test_context_rewrite_starts_a_new_sample_from_the_rewritten_messages(tiny):
    model, tokenizer = tiny
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=3, rewrite_at=1)])
    first, second = collector.collect(["t0"], seed=0)
    rewritten = [
        {"role": "system", "content": "Use the echo tool."},
        {"role": "user", "content": "Question about t0?"},
        {"role": "user", "content": "Summary: 1 turns so far."},
    ]
    assert first.num_turns == 1 and second.num_turns == 2
    assert second.prompt_ids == render_prompt(tokenizer, rewritten)
    assert first.group_id == second.group_id and first.outcome == second.outcome == pytest.approx(1.6)
    assert (first.info["sample_index"], second.info["sample_index"]) == (0, 1)


@pytest.mark.filterwarnings("ignore:trajectory.info:DeprecationWarning")
def test_the_collectors_episode_record_travels_whole_on_every_sample(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=3, rewrite_at=1)])
    first, second = collector.collect(["t0"], seed=0)
    assert first.episode is second.episode  # one EpisodeSummary, not a copy flattened into info
    assert (first.episode.turns, first.episode.task_id, first.episode.reward) == (3, "t0", pytest.approx(1.6))
    assert set(first.info) == {"sample_index", "num_samples", "finish_reasons"}
    with pytest.warns(DeprecationWarning, match="trajectory.episode.tool_calls"):
        assert first.info["episode_tool_calls"] == first.episode.tool_calls  # the old flat keys, one release
    assert (first.info.get("turns"), "evidence_recall" in first.info, first.info.get("evidence_recall", "-")) == (
        3, False, "-")  # a metric the episode does not report stays absent, as it was


def test_group_size_plays_each_task_that_many_times_under_one_group_id(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(), EchoToolEnv()], max_new_tokens=4)
    trajectories = collector.collect(["a", "b", "c"], group_size=3, seed=0)
    groups = [t.group_id for t in trajectories]
    assert len(trajectories) == 9 and len(set(groups)) == 3
    assert [t.episode.task_id for t in trajectories] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3


@pytest.mark.filterwarnings("ignore:EchoToolEnv has no truncate")
def test_max_turns_truncates_the_episode(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=5)], max_turns=2)
    [trajectory] = collector.collect(["t0"], seed=0)
    assert trajectory.num_turns == 2 and trajectory.episode.truncated_by == "max_turns"


@pytest.mark.filterwarnings("ignore:EchoToolEnv has no truncate")
def test_context_budget_bounds_the_whole_sample(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=10)], max_context_tokens=90)
    [trajectory] = collector.collect(["t0"], seed=0)
    assert len(trajectory.prompt_ids) + len(trajectory.response_ids) <= 90
    assert trajectory.episode.truncated_by == "context" and trajectory.episode.truncated


def test_reset_specs_pass_seed_and_options_to_the_env(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv()], max_new_tokens=4)
    [trajectory] = collector.collect([{"seed": 3, "options": {"task_id": "x"}}])
    assert trajectory.episode.task_id == "x"


def test_unknown_spec_keys_are_a_clear_error(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv()])
    with pytest.raises(ValueError, match="unknown keys"):
        collector.collect([{"task": "x"}])


def test_env_without_messages_is_a_clear_error(tiny):
    class Silent(EchoToolEnv):
        def reset(self, *, seed=None, options=None):
            observation, info = super().reset(seed=seed, options=options)
            return observation, {**info, "messages": []}

    collector, _ = _collector(tiny, [Silent()])
    with pytest.raises(RolloutError, match="no info\\['messages'\\]"):
        collector.collect(["t0"])


def test_sync_vector_env_is_driven_through_its_sub_envs(tiny):
    vector_env = gym.vector.SyncVectorEnv([EchoToolEnv, EchoToolEnv])
    collector, _ = _collector(tiny, vector_env, max_new_tokens=4)
    assert len(collector.collect(["a", "b"], seed=0)) == 2


def test_trajectories_collate_into_aligned_training_tensors(tiny):
    model, tokenizer = tiny
    collector, _ = _collector(tiny, [EchoToolEnv(), EchoToolEnv()])
    trajectories = collector.collect(["a", "b"], seed=0)
    batch = collate(trajectories, tokenizer.pad_token_id)
    for row, trajectory in enumerate(trajectories):
        start = len(trajectory.prompt_ids)
        end = start + len(trajectory.response_ids)
        assert batch.input_ids[row, start:end].tolist() == trajectory.response_ids
        assert batch.loss_mask[row, start:end].tolist() == trajectory.loss_mask
    # The stored sampling log-probs are what the policy's forward pass gives for the same tokens.
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logprobs = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:].bool()
    assert torch.allclose(logprobs[mask], batch.sampling_logprobs[:, 1:][mask], atol=1e-4)


def test_evaluate_reports_greedy_reward_and_em(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=1)], max_new_tokens=4)
    metrics, trajectories = evaluate(collector, ["a", "b"])
    assert metrics["reward"] == pytest.approx(1.1) and metrics["em"] == 1.0 and len(trajectories) == 2


def test_sft_tokenization_matches_the_collectors_layout_for_the_same_turns(tiny):
    model, tokenizer = tiny
    env = EchoToolEnv(num_turns=3)
    collector, _ = _collector(tiny, [env], max_new_tokens=12)
    [trajectory] = collector.collect(["t0"], seed=0)
    # Replay the sampled turns as text: SFT re-tokenizes them, so compare on turns that end with <|im_end|>.
    messages = list(env.messages)
    example = tokenize_episode(tokenizer, messages)
    assert example.input_ids[: len(trajectory.prompt_ids)] == trajectory.prompt_ids
    decoded = tokenizer.decode(example.input_ids)
    assert decoded.count("<|im_start|>assistant\n") == 3 and decoded.endswith("<|im_end|>")
    assert decoded.count("<tool_response>\necho result of turn") == 2


def test_sft_loss_mask_covers_exactly_the_assistant_turns_and_their_end_token(tiny):
    _, tokenizer = tiny
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<tool_call>x</tool_call>"},
        {"role": "tool", "content": "R"},
        {"role": "assistant", "content": "<answer>y</answer>"},
    ]
    example = tokenize_episode(tokenizer, messages)
    masked = [token for token, keep in zip(example.input_ids, example.loss_mask, strict=True) if keep]
    assert tokenizer.decode(masked) == "<tool_call>x</tool_call><|im_end|><answer>y</answer><|im_end|>"
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(example.input_ids) == rendered.removesuffix(
        "\n"
    )  # training stops at the last turn


def test_sft_lowers_the_loss_on_its_examples(tiny_model_copy):
    model, tokenizer = tiny_model_copy
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<answer>abc</answer>"}]
    losses = train_sft(
        model,
        tokenizer,
        [tokenize_episode(tokenizer, messages)] * 8,
        SFTConfig(epochs=10, batch_size=8, lr=3e-3, warmup_steps=1),
    )
    assert losses[-1] < 0.5 * losses[0]


def test_sft_episode_without_assistant_turn_is_a_clear_error(tiny):
    _, tokenizer = tiny
    with pytest.raises(ValueError, match="at least one assistant message"):
        tokenize_episode(tokenizer, [{"role": "user", "content": "Q"}])


@pytest.mark.slow
def test_sft_command_warm_starts_a_model_on_scripted_episodes(tiny_model_dir_for_synthhop, tmp_path, capsys):
    import argparse
    import json

    from agent_gym.cli.train import add_sft_arguments, run_sft

    model_dir = tiny_model_dir_for_synthhop
    parser = argparse.ArgumentParser()
    add_sft_arguments(parser)
    small_world = json.dumps({"num_pages": 2000, "num_questions": 50})
    ns = parser.parse_args(
        [
            "--env",
            "AgentR1-SynthHop-v0",
            "--env-kwargs",
            small_world,
            "--policy",
            "naive-rag",
            "--model",
            str(model_dir),
            "--out",
            str(tmp_path / "sft"),
            "--episodes",
            "4",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--max-length",
            "1024",
        ]
    )
    assert run_sft(ns) == 0
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert summary["episodes"] == 4 and summary["final_loss"] < summary["first_loss"]


def test_sft_skips_examples_cut_before_their_first_assistant_token(tiny_model_copy):
    model, tokenizer = tiny_model_copy
    long_prompt = [
        {"role": "user", "content": "word " * 100},
        {"role": "assistant", "content": "<answer>a</answer>"},
    ]
    short = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<answer>b</answer>"}]
    examples = [tokenize_episode(tokenizer, long_prompt), tokenize_episode(tokenizer, short)]
    with pytest.warns(UserWarning, match="1 SFT examples have no assistant token"):
        losses = train_sft(model, tokenizer, examples, SFTConfig(epochs=1, batch_size=2, max_length=40))
    assert all(loss == loss for loss in losses)  # no NaN


# ---------------------------------------------------------------------------------------------- ToolEnv turns


def _lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


def _scripted(tiny, envs, turns, **config) -> RolloutCollector:
    _, tokenizer = tiny
    config = {"max_context_tokens": 100_000, "show_progress": False, **config}
    return RolloutCollector(envs, ScriptedBackend(tokenizer, turns), tokenizer, RolloutConfig(**config))


def test_tool_envs_step_as_one_turn_batch(tiny):
    shared = FactLookup()
    envs = [ToolEnv(list(FACT_TASKS), [shared], max_turns=2) for _ in range(3)]
    _scripted(tiny, envs, [_lookup("France")]).collect(["capital-france"] * 3)
    assert shared.batches == [3, 3]


def test_native_vector_env_sub_envs_step_as_one_turn_batch(tiny):
    shared = FactLookup()
    register_tool_env("TestRolloutFacts-v0", tools=[shared], tasks=list(FACT_TASKS), max_turns=2)
    try:
        vector_env = gym.make_vec("TestRolloutFacts-v0", num_envs=2)
        _scripted(tiny, vector_env, [_lookup("Japan")]).collect(["capital-japan"] * 2)
    finally:
        gym.registry.pop("TestRolloutFacts-v0", None)
    assert shared.batches == [2, 2]


def test_the_collector_drives_a_native_vector_env_as_the_env_batch_it_is(tiny):
    register_tool_env("TestRolloutFacts-v0", tools=[FactLookup()], tasks=list(FACT_TASKS), max_turns=2)
    try:
        vector_env = gym.make_vec("TestRolloutFacts-v0", num_envs=2)
    finally:
        gym.registry.pop("TestRolloutFacts-v0", None)
    collector = _scripted(tiny, vector_env, [_lookup("Japan")])
    assert collector.env_batch is vector_env and len(collector.collect(["capital-japan"] * 2)) == 2


def test_episode_cut_at_max_turns_pays_what_the_envs_own_limit_pays(tiny):
    turns = [_lookup("France"), "no call"]
    [cut] = _scripted(tiny, [ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=8)], turns, max_turns=2).collect(
        ["capital-france"]
    )
    [own] = _scripted(tiny, [ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=2)], turns).collect(
        ["capital-france"]
    )
    assert (cut.episode.truncated_by, own.episode.truncated_by) == ("max_turns", "env")
    assert cut.turn_rewards == pytest.approx(own.turn_rewards)
    assert cut.outcome == pytest.approx(1 / 3 - 1.0)  # Agent-R1 Eq. 6: 1 well-formed turn of 3, minus 1
    assert cut.episode.em == own.episode.em == 0.0 and cut.episode.reward == pytest.approx(cut.outcome)


def test_tool_call_validity_is_the_share_of_calls_that_ran(tiny):
    bad_call = f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {}})}</tool_call>"
    env = ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=1)
    [trajectory] = _scripted(tiny, [env], [_lookup("France") + bad_call]).collect(["capital-france"])
    assert trajectory.episode.tool_call_validity == 0.5


def test_a_tool_env_under_another_wrapper_steps_through_the_wrapper(tiny):
    class Bonus(gym.RewardWrapper):
        def reward(self, reward):
            return reward + 10.0

    env = Bonus(ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=2))
    [trajectory] = _scripted(tiny, [env], [_lookup("France")]).collect(["capital-france"])
    assert all(reward >= 9.0 for reward in trajectory.turn_rewards)


def test_cutting_an_episode_of_an_env_without_truncate_warns_once(tiny):
    collector, _ = _collector(tiny, [EchoToolEnv(num_turns=5)], max_turns=1, max_new_tokens=4)
    with pytest.warns(UserWarning, match="no truncate") as warned:
        collector.collect(["a", "b"], seed=0)
    assert len(warned) == 1
