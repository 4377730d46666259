"""The trainer's records: `collate` builds a `TokenBatch` once; `rows` and `narrowed` cut every tensor alike;
the estimator table maps each algo name to its estimator."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agent_gym.trainers.algorithms import ESTIMATORS, EstimatorInputs, gae_advantages, grpo_advantages
from agent_gym.trainers.batch import Advantages, ScoredBatch, TokenBatch, UpdateBatch
from agent_gym.trainers.trajectory import Trajectory, collate


def _trajectory(prompt: int, response: int, outcome: float, group_id: str) -> Trajectory:
    return Trajectory(
        prompt_ids=[1] * prompt,
        response_ids=[5] * response,
        loss_mask=[1] * response,
        sampling_logprobs=[-0.5] * response,
        turn_end_indices=[response - 1],
        turn_rewards=[outcome],
        outcome=outcome,
        group_id=group_id,
    )


def test_collate_numbers_groups_and_keeps_each_rows_episode_return():
    batch = collate([_trajectory(2, 3, 1.0, "b"), _trajectory(1, 2, 0.0, "a"), _trajectory(2, 1, 0.5, "b")], 0)
    assert batch.group_index.tolist() == [0, 1, 0]
    assert batch.episode_returns.tolist() == [1.0, 0.0, 0.5]


def test_token_batch_is_frozen():
    batch = collate([_trajectory(2, 3, 1.0, "g")], 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.loss_mask = batch.response_mask  # type: ignore[misc]


def test_rows_and_trimmed_cut_every_record_of_an_update_batch_alike():
    tokens = collate([_trajectory(2, 6, 1.0, "g"), _trajectory(1, 2, 0.0, "g"), _trajectory(1, 3, 0.0, "g")], 0)
    targets = Advantages(tokens.token_rewards * 2, tokens.loss_mask.float())
    batch = UpdateBatch(tokens, ScoredBatch(values=tokens.sampling_logprobs), targets)
    short = batch.rows(torch.tensor([2, 1])).trimmed()
    assert short.tokens.input_ids.shape == short.scored.values.shape == short.targets.advantages.shape == (2, 4)
    assert short.tokens.prompt_lengths.tolist() == [1, 1] and short.scored.old_logprobs is None
    assert torch.equal(short.targets.advantages, tokens.token_rewards[[2, 1], :4] * 2)


def _inputs(**overrides) -> EstimatorInputs:
    advantage_mask = torch.tensor([[0.0, 1.0, 1.0]] * 4)
    values = {
        "token_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]),
        "episode_returns": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "group_index": torch.tensor([0, 0, 1, 1]),
        "advantage_mask": advantage_mask,
        "values": torch.full((4, 3), 0.25),
    }
    values.update(overrides)
    # the batch itself, for estimators that read its tokens (GiGPO's anchor states): a one-token prompt, then a turn
    values.setdefault("tokens", TokenBatch(
        input_ids=torch.tensor([[1, 5, 6], [1, 5, 7], [2, 8, 9], [2, 8, 9]]), attention_mask=torch.ones(4, 3),
        response_mask=advantage_mask, loss_mask=advantage_mask, sampling_logprobs=torch.zeros(4, 3),
        token_rewards=values["token_rewards"], prompt_lengths=torch.ones(4, dtype=torch.long),
        episode_returns=values["episode_returns"], group_index=values["group_index"]))
    return EstimatorInputs(**values)


def test_estimator_table_runs_the_estimator_its_algo_names():
    inputs = _inputs()
    grpo = ESTIMATORS["grpo"](inputs)
    expected = grpo_advantages(inputs.episode_returns, inputs.group_index, inputs.advantage_mask)
    assert torch.equal(grpo.advantages, expected) and grpo.returns is None
    ppo = ESTIMATORS["ppo"](inputs)
    advantages, returns = gae_advantages(inputs.token_rewards, inputs.values, inputs.advantage_mask, 1.0, 1.0)
    assert torch.equal(ppo.advantages, advantages) and torch.equal(ppo.returns, returns)


@pytest.mark.parametrize("algo", sorted(ESTIMATORS))
def test_every_estimator_gives_no_advantage_outside_the_action_mask(algo):
    result = ESTIMATORS[algo](_inputs())
    assert result.advantages[:, 0].abs().sum() == 0 and torch.equal(result.advantage_mask, _inputs().advantage_mask)


def test_ppo_without_critic_values_is_a_clear_error():
    with pytest.raises(ValueError, match="critic"):
        ESTIMATORS["ppo"](_inputs(values=None))


# --- packed_forward: the shared prompt once per group, no padding (issue 26) ---


def _tiny_causal_lm(layers: int = 3) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return AutoModelForCausalLM.from_config(config).float()


def _grouped_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two groups of rows: each group's rows share a 24-token prompt, then differ; right-padded to 60."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([60, 41, 52, 33, 47])
    prompts = torch.tensor([26, 26, 26, 30, 30])
    groups = torch.tensor([0, 0, 0, 1, 1])
    ids = torch.zeros(5, 60, dtype=torch.long)
    shared = {0: torch.randint(1, 97, (30,), generator=generator), 1: torch.randint(1, 97, (30,), generator=generator)}
    for row in range(5):
        ids[row, : lengths[row]] = torch.randint(1, 97, (int(lengths[row]),), generator=generator)
        ids[row, :24] = shared[int(groups[row])][:24]  # rows of a group part after 24 tokens, inside the prompt
    return ids, lengths, prompts, groups


def _padded_logprobs(model: torch.nn.Module, ids: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    from agent_gym.trainers.losses import token_logprobs

    return token_logprobs(model(input_ids=ids).logits, ids)


def _response_mask(lengths: torch.Tensor, prompts: torch.Tensor, width: int) -> torch.Tensor:
    positions = torch.arange(width)[None]
    return ((positions >= prompts[:, None]) & (positions < lengths[:, None])).float()


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("split", [True, False], ids=["hidden-states", "logits"])
def test_packed_forward_gives_the_padded_passs_logprobs_and_gradients(monkeypatch, share, lora, split):
    # split: the log-probs from the decoder's hidden states (head_logprobs.py); else from the model's logits
    from agent_gym.trainers import packed_forward
    from agent_gym.trainers.packed_forward import packed_logprobs, shared_prefix_length

    model = _tiny_causal_lm()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    assert packed_forward.split_head(model) is not None
    if not split:
        monkeypatch.setattr(packed_forward, "split_head", lambda model: None)
    ids, lengths, prompts, groups = _grouped_rows()
    mask = _response_mask(lengths, prompts, ids.shape[1])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2)) * mask  # an advantage-like loss
    trained = [p for p in model.parameters() if p.requires_grad]

    padded = _padded_logprobs(model, ids, prompts)
    padded_grads = torch.autograd.grad((padded * weights).sum(), trained)
    packed = packed_logprobs(model, ids, lengths, prompts, groups if share else None, entropy=True)
    packed_grads = torch.autograd.grad((packed.logprobs * weights).sum(), trained)

    torch.testing.assert_close(packed.logprobs * mask, padded * mask, rtol=1e-5, atol=1e-5)
    assert (packed.logprobs[mask == 0] == 0).all() and packed.entropy is not None
    for packed_grad, padded_grad in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(packed_grad, padded_grad, rtol=1e-4, atol=1e-5)  # fp32 rounding
    assert shared_prefix_length(ids[:3], lengths[:3], prompts[:3]) == 24
    # the positions run: each row once (no padding), each group's 24 shared tokens once more than needed
    unshared = int(lengths.sum())
    assert packed.tokens_computed == (unshared - 24 * 2 - 24 * 1 if share else unshared)


@pytest.mark.parametrize("share", [True, False])
def test_the_lora_critics_packed_values_are_its_padded_values_with_the_same_gradients(share):
    # the critic read as the trainer reads it: one row at a time, a group's prompt once (issue 25's PPO OOM)
    from peft import LoraConfig, get_peft_model

    from agent_gym.trainers.critic import LoraValueModel

    policy = get_peft_model(_tiny_causal_lm(), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    critic = LoraValueModel(policy, rank=4)
    torch.nn.init.normal_(critic.value_head.weight)
    for name, parameter in critic.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)  # a trained critic: its adapters change the body's output
    ids, lengths, prompts, groups = _grouped_rows()
    mask = _response_mask(lengths, prompts, ids.shape[1])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3)) * mask
    trained = list(critic.parameters())

    padded = critic(ids)
    padded_grads = torch.autograd.grad((padded * weights).sum(), trained, allow_unused=True)
    packed = critic.packed(ids, lengths, prompts, groups if share else None)
    packed_grads = torch.autograd.grad((packed * weights).sum(), trained, allow_unused=True)

    assert packed.dtype == torch.float32 and packed.shape == padded.shape
    torch.testing.assert_close(packed * mask, padded * mask, rtol=1e-5, atol=1e-5)
    assert (packed[mask == 0] == 0).all()  # nothing before the response: GAE and the value loss never read it
    for packed_grad, padded_grad in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(packed_grad, padded_grad, rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in policy.parameters())  # the policy's weights stay out of the critic's graph


def test_packed_forward_shares_no_prefix_between_groups_or_short_prompts():
    from agent_gym.trainers.packed_forward import MIN_SHARED_PREFIX, shared_prefix_length

    ids, lengths, prompts, _ = _grouped_rows()
    assert shared_prefix_length(ids[[0, 3]], lengths[[0, 3]], prompts[[0, 3]]) < MIN_SHARED_PREFIX
    # capped one short of the shortest prompt: that position's logits predict the first response token
    same = ids[[0, 0]]
    assert shared_prefix_length(same, lengths[[0, 0]], torch.tensor([26, 20])) == 19


def test_packed_forward_under_gradient_checkpointing_runs_rows_whole_and_exact():
    # HF turns the prefix cache off when checkpointing in training, so each row runs whole (still unpadded)
    from agent_gym.trainers.packed_forward import packed_logprobs

    model = _tiny_causal_lm()
    model.gradient_checkpointing_enable()
    model.train()
    ids, lengths, prompts, groups = _grouped_rows()
    mask = _response_mask(lengths, prompts, ids.shape[1])
    packed = packed_logprobs(model, ids, lengths, prompts, groups)
    assert packed.tokens_computed == int(lengths.sum())
    torch.testing.assert_close(packed.logprobs * mask, _padded_logprobs(model, ids, prompts) * mask, rtol=1e-5,
                               atol=1e-5)


def test_one_mask_vocabulary_with_the_old_names_as_deprecated_aliases():
    tokens = collate([_trajectory(2, 3, 1.0, "g")], 0)
    assert set(tokens.__dataclass_fields__) >= {"loss_mask", "response_mask"}
    assert "model_token_mask" not in tokens.__dataclass_fields__
    assert tokens.loss_mask[0, 2:].tolist() == _trajectory(2, 3, 1.0, "g").loss_mask  # the trajectories' own mask
    targets = Advantages(tokens.token_rewards, tokens.loss_mask.float())
    with pytest.warns(DeprecationWarning, match="loss_mask"):
        assert tokens.model_token_mask is tokens.loss_mask
    with pytest.warns(DeprecationWarning, match="advantage_mask"):
        assert targets.action_mask is targets.advantage_mask
