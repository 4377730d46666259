"""Advantage estimators for multi-turn, token-level RL (docs/DESIGN.md §7).

Every function is plain tensor code on padded ``[B, T]`` tensors with an explicit mask, so it can be checked
against its paper line by line. Shapes and conventions shared by all estimators:

- ``advantage_mask[b, t] = 1`` on the tokens that receive an advantage. With the advantage mask on (Agent-R1's
  default) these are the model-sampled tokens (``TokenBatch.loss_mask``); with it off (Agent-R1
  Table 4 ablation) they are all response tokens, env observation tokens included (``advantage_token_mask``).
- ``token_rewards[b, t]`` holds each turn's reward on that turn's last model token (docs/DESIGN.md §7).
- ``outcomes[b]`` is the episode return, ``group_index[b]`` the integer group of episodes sharing a task.
- Outputs are zero wherever ``advantage_mask`` is zero.

``ESTIMATORS`` (at the end) names each estimator the trainer can run: an `Estimator` record, a function from
`EstimatorInputs` to `Advantages` with what it needs (groups, a critic, token rewards), so ``config.algo``
picks one by lookup and the config and trainer read its needs from the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agent_gym.error import InvalidValue
from agent_gym.trainers.batch import Advantages, TokenBatch
from agent_gym.trainers.gigpo import AnchorState, find_turns
from agent_gym.trainers.losses import masked_mean
from agent_gym.trainers.trajectory import group_index

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "EstimatorInputs",
    "advantage_token_mask",
    "discounted_returns",
    "gae_advantages",
    "gigpo_advantages",
    "group_index",
    "grpo_advantages",
    "kl_penalized_rewards",
    "masked_mean",
    "masked_whiten",
    "reinforce_pp_advantages",
    "rloo_advantages",
]


def advantage_token_mask(
    loss_mask: torch.Tensor, response_mask: torch.Tensor, use_advantage_mask: bool
) -> torch.Tensor:
    """Tokens given an advantage: model tokens only (on), or all response tokens (off, Agent-R1 Table 4)."""
    return (loss_mask if use_advantage_mask else response_mask).to(torch.float32)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions of the whole batch; zero outside the mask."""
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def _group_stats(
    outcomes: torch.Tensor, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-episode group sum, group size, and unbiased group std (0 for singleton groups)."""
    num_groups = int(groups.max().item()) + 1 if groups.numel() else 0
    outcomes = outcomes.to(torch.float32)
    groups = groups.to(outcomes.device)
    zeros = torch.zeros(num_groups, device=outcomes.device)
    sums = zeros.clone().index_add_(0, groups, outcomes)
    counts = zeros.clone().index_add_(0, groups, torch.ones_like(outcomes))
    means = sums / counts.clamp(min=1.0)
    sq = zeros.clone().index_add_(0, groups, (outcomes - means[groups]) ** 2)
    stds = torch.sqrt(sq / (counts - 1).clamp(min=1.0))
    return sums[groups], counts[groups], stds[groups]


def grpo_advantages(
    outcomes: torch.Tensor,
    groups: torch.Tensor,
    advantage_mask: torch.Tensor,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-normalised outcome advantage, broadcast to every action token.

    GRPO (Shao et al. 2024, DeepSeekMath, outcome supervision):
        A_i = (R_i - mean_group(R)) / (std_group(R) + eps)
    Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"), ``scale_by_std=False``:
        A_i = R_i - mean_group(R)      (the std division up-weights too-easy / too-hard groups).
    Dr.GRPO also drops GRPO's 1/|o_i| length normalisation; that lives in the loss aggregation, so pair it
    with ``seq-mean-token-sum-norm`` (or ``seq-mean-token-sum``) in ``losses.aggregate``.
    std is the unbiased sample std (torch.std's default, as in verl's GRPO).
    """
    sums, counts, stds = _group_stats(outcomes, groups)
    advantage = outcomes.to(torch.float32) - sums / counts
    if scale_by_std:
        advantage = advantage / (stds + eps)
    return advantage[:, None].to(advantage_mask.device) * advantage_mask.to(torch.float32)


def rloo_advantages(outcomes: torch.Tensor, groups: torch.Tensor, advantage_mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE Leave-One-Out, broadcast to every action token.

    RLOO (Kool et al. 2019 "Buy 4 REINFORCE samples"; Ahmadian et al. 2024 "Back to Basics"):
        A_i = R_i - 1/(k-1) * sum_{j != i} R_j        for a group of k samples of the same task.
    A singleton group has no other sample to compare with, so its advantage is 0.
    """
    sums, counts, _ = _group_stats(outcomes, groups)
    outcomes = outcomes.to(torch.float32)
    baseline = (sums - outcomes) / (counts - 1).clamp(min=1.0)
    advantage = torch.where(counts > 1, outcomes - baseline, torch.zeros_like(outcomes))
    return advantage[:, None].to(advantage_mask.device) * advantage_mask.to(torch.float32)


def kl_penalized_rewards(
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantage_mask: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """KL-in-reward with the k1 estimator (Ouyang et al. 2022, InstructGPT Eq. 2; Schulman's "k1"):
    r'_t = r_t - beta * (log pi(a_t|s_t) - log pi_ref(a_t|s_t)) on every action token.
    """
    kl = (logprobs - ref_logprobs) * advantage_mask.to(logprobs.dtype)
    return token_rewards - kl_coef * kl


def discounted_returns(token_rewards: torch.Tensor, advantage_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return over action tokens only: G_t = r_t + gamma * G_{next action token}.

    Non-action tokens (env observations, padding) are skipped: they neither discount nor reset the return, so
    credit flows from a later turn's reward back across the env segment to earlier turns (Agent-R1).
    A reward sitting on a non-action token is credited, undiscounted, to the preceding action token.
    """
    return gae_advantages(token_rewards, torch.zeros_like(token_rewards), advantage_mask, gamma, lam=1.0)[0]


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    advantage_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE computed over action tokens only (Agent-R1's "advantage alignment" across turns).

    GAE (Schulman et al. 2016, Eq. 16), "next" meaning the next *action* token t' > t of the same sequence
    (env tokens and padding are skipped, V = 0 after the last action token):
        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A_{t'}
        returns = A + V                         (the critic's regression target)
    Returns ``(advantages, returns)``, both zero outside ``advantage_mask``.
    """
    mask = advantage_mask.to(torch.float32)
    rewards = token_rewards.to(torch.float32)
    values = values.detach().to(torch.float32)
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(batch)  # V(t') of the next action token; 0 past the end of the episode
    next_advantage = rewards.new_zeros(batch)
    pending_reward = rewards.new_zeros(batch)  # rewards found on skipped tokens, paid to the preceding action
    for t in reversed(range(length)):
        is_action = mask[:, t]
        reward = rewards[:, t] + pending_reward
        delta = reward + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage_t * is_action
        # On an action token the carried quantities move to this token; on a skipped token they pass through.
        next_value = torch.where(is_action > 0, values[:, t], next_value)
        next_advantage = torch.where(is_action > 0, advantage_t, next_advantage)
        pending_reward = torch.where(is_action > 0, torch.zeros_like(reward), reward)
    returns = (advantages + values) * mask
    return advantages, returns


def reinforce_pp_advantages(
    token_rewards: torch.Tensor,
    advantage_mask: torch.Tensor,
    gamma: float = 1.0,
    outcomes: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): token-level discounted return, then batch whitening.

        G_t = sum_{k >= t, k action} gamma^(k - t) * r_k      (r may include the k1 KL penalty)
        A_t = (G_t - mean_batch(G)) / std_batch(G)             over all action tokens of the batch
    With a group baseline (REINFORCE++-baseline, same paper), each episode's group-mean outcome is
    subtracted from the reward on its last action token before the return is taken, so
    G_t = ... + gamma^(...) * (R_i - mean_group(R)); whitening follows as above.
    """
    mask = advantage_mask.to(torch.float32)
    rewards = token_rewards.to(torch.float32).clone()
    if groups is not None:
        if outcomes is None:
            raise InvalidValue("reinforce_pp_advantages: a group baseline needs the episode outcomes")
        sums, counts, _ = _group_stats(outcomes, groups)
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last_action = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
        has_action = last_action >= 0
        rows = torch.arange(mask.shape[0], device=mask.device)[has_action]
        rewards[rows, last_action[has_action]] -= (sums / counts).to(mask.device)[has_action]
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask)


def gigpo_advantages(
    tokens: TokenBatch,
    advantage_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    step_weight: float = 1.0,
    step_gamma: float = 0.95,
    anchor_state: AnchorState = "observations",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO (Feng et al. 2025, arXiv 2505.10978): GRPO's episode advantage plus a step advantage.

        A^E(tau_i)   = (R(tau_i) - mean_group(R)) / std_group(R)          GRPO, on every action token
        R_t^(i)      = sum_{k >= t} gamma^(k-t) r_k^(i)                    return-to-go of turn t (turn rewards)
        A^S(a_t^(i)) = (R_t^(i) - mean_anchor(R)) / std_anchor(R)          over the turns of the same anchor
                                                                           state (gigpo.py), std unbiased
        A            = A^E + omega * A^S                                   on the tokens of turn t
    omega = ``step_weight`` (1 in GiGPO), gamma = ``step_gamma`` (0.95, GiGPO's runs); the norm is the std (the
    paper allows std or 1). An anchor group of one turn, or of equal returns, gives A^S = 0, as `grpo_advantages`
    gives a singleton group (verl-agent instead gives a singleton its return, by verl's mean-0/std-1 convention
    for groups of one). ``token_rewards`` default to
    ``tokens.token_rewards``; a turn's reward is the sum over its span (its tokens and the env reply after it).
    """
    rewards = tokens.token_rewards if token_rewards is None else token_rewards
    episode = grpo_advantages(tokens.episode_returns, tokens.group_index, advantage_mask, eps=eps)
    turns = find_turns(
        tokens.input_ids, tokens.loss_mask, tokens.attention_mask, tokens.prompt_lengths, rewards,
        tokens.group_index, anchor_state,
    )
    if turns.count == 0:
        return episode
    step = grpo_advantages(turns.returns(step_gamma), turns.anchor, torch.ones(turns.count, 1), eps=eps)[:, 0]
    step_tokens = torch.zeros_like(episode)
    for index in range(turns.count):  # broadcast each turn's A^S over its span
        row, start, end = int(turns.row[index]), int(turns.start[index]), int(turns.end[index])
        step_tokens[row, start:end] = float(step[index])
    return episode + step_weight * step_tokens * advantage_mask.to(episode.dtype)


# ---------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class EstimatorInputs:
    """What every estimator may read; each uses the fields its paper needs.

    Attributes:
        token_rewards: ``[B, T]`` per-turn rewards on each turn's last model token (KL-penalised when the
            trainer folds a KL into the rewards).
        episode_returns: ``[B]`` the return of each row's episode (outcome estimators).
        group_index: ``[B]`` the group of each row (GRPO, RLOO, REINFORCE++-baseline).
        advantage_mask: ``[B, T]`` the tokens that get an advantage (see the module docstring).
        values: ``[B, T]`` critic values (PPO); None without a critic.
        gamma, lam: discount and GAE lambda over action tokens.
        tokens: the batch itself, for estimators that read its tokens (GiGPO's anchor states).
        step_weight, step_gamma, anchor_state: GiGPO's omega, its turn-level discount, and what a state is
            (see `gigpo_advantages` and gigpo.py).
    """

    token_rewards: torch.Tensor
    episode_returns: torch.Tensor
    group_index: torch.Tensor
    advantage_mask: torch.Tensor
    values: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    tokens: TokenBatch | None = None
    step_weight: float = 1.0
    step_gamma: float = 0.95
    anchor_state: AnchorState = "observations"


def _grpo(x: EstimatorInputs) -> Advantages:
    return Advantages(grpo_advantages(x.episode_returns, x.group_index, x.advantage_mask), x.advantage_mask)


def _dr_grpo(x: EstimatorInputs) -> Advantages:
    advantages = grpo_advantages(x.episode_returns, x.group_index, x.advantage_mask, scale_by_std=False)
    return Advantages(advantages, x.advantage_mask)


def _rloo(x: EstimatorInputs) -> Advantages:
    return Advantages(rloo_advantages(x.episode_returns, x.group_index, x.advantage_mask), x.advantage_mask)


def _reinforce_pp(x: EstimatorInputs) -> Advantages:
    return Advantages(reinforce_pp_advantages(x.token_rewards, x.advantage_mask, x.gamma), x.advantage_mask)


def _reinforce_pp_baseline(x: EstimatorInputs) -> Advantages:
    advantages = reinforce_pp_advantages(x.token_rewards, x.advantage_mask, x.gamma, x.episode_returns, x.group_index)
    return Advantages(advantages, x.advantage_mask)


def _ppo(x: EstimatorInputs) -> Advantages:
    if x.values is None:
        raise InvalidValue("ppo needs the critic's values (EstimatorInputs.values)")
    advantages, returns = gae_advantages(x.token_rewards, x.values, x.advantage_mask, x.gamma, x.lam)
    return Advantages(advantages, x.advantage_mask, returns)


def _gigpo(x: EstimatorInputs) -> Advantages:
    if x.tokens is None:
        raise InvalidValue("gigpo needs the batch's tokens (EstimatorInputs.tokens) to find its anchor states")
    advantages = gigpo_advantages(
        x.tokens, x.advantage_mask, x.token_rewards, x.step_weight, x.step_gamma, x.anchor_state
    )
    return Advantages(advantages, x.advantage_mask)


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator and what it needs, so the config and the trainer read it here, not from a list.

    Attributes:
        compute: `EstimatorInputs` -> `Advantages`; calling the record calls it.
        needs_groups: compares the episodes of one task with each other (the config needs group_size >= 2).
        needs_critic: reads a value model's values (the trainer builds and trains a critic).
        reads_token_rewards: uses per-turn token rewards; False for outcome-only estimators, which would ignore a
            KL folded into those rewards.
    """

    compute: Callable[[EstimatorInputs], Advantages]
    needs_groups: bool = False
    needs_critic: bool = False
    reads_token_rewards: bool = True

    def __call__(self, inputs: EstimatorInputs) -> Advantages:
        return self.compute(inputs)


#: algo name -> estimator. Agent-R1 compares PPO, GRPO, REINFORCE++ and RLOO; dr_grpo and
#: reinforce_pp_baseline are the variants described in grpo_advantages and reinforce_pp_advantages; gigpo adds
#: step-level credit to GRPO (gigpo_advantages; verl-agent's and Agent-R1's current releases have it).
ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(_grpo, needs_groups=True, reads_token_rewards=False),
    "gigpo": Estimator(_gigpo, needs_groups=True),
    "dr_grpo": Estimator(_dr_grpo, needs_groups=True, reads_token_rewards=False),
    "ppo": Estimator(_ppo, needs_critic=True),
    "reinforce_pp": Estimator(_reinforce_pp),
    "reinforce_pp_baseline": Estimator(_reinforce_pp_baseline, needs_groups=True),
    "rloo": Estimator(_rloo, needs_groups=True, reads_token_rewards=False),
}
