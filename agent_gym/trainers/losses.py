"""Policy, value, entropy and KL losses, and how per-token losses are aggregated (docs/DESIGN.md §7).

All per-token tensors are ``[B, T]``; ``mask`` selects the tokens that contribute. With the loss mask on
(Agent-R1's default) it is ``TokenBatch.loss_mask`` (the model-sampled tokens); with it off (Agent-R1 Table 4
ablation) it is ``response_mask``, every response token, env observation tokens included. Each loss returns a
scalar already aggregated.

``normalizer`` lets a micro-batch use the token / sequence count of its whole mini-batch, so gradient
accumulation over micro-batches gives exactly the gradient of the full mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent_gym.error import InvalidValue

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "PolicyLossOutput",
    "aggregate",
    "aggregation_normalizer",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "token_logprobs",
    "value_loss",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregation_normalizer(mask: torch.Tensor, mode: str) -> float:
    """What ``aggregate`` divides by for a (mini-)batch: its token count, or its sequence count."""
    if mode == "token-mean":
        return float(mask.sum().clamp(min=1.0).item())
    if mode in AGGREGATIONS:
        return float(max(mask.shape[0], 1))
    raise InvalidValue(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}")


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    normalizer: float | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``token-mean``: sum over all masked tokens / number of them (DAPO, Yu et al. 2025, token-level loss):
      every token weighs the same, so long responses are not down-weighted.
    - ``seq-mean-token-mean``: mean over each sequence's tokens, then mean over sequences (original GRPO,
      Shao et al. 2024, Eq. 3: the 1/|o_i| factor).
    - ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences (REINFORCE-style).
    - ``seq-mean-token-sum-norm``: token sum divided by a constant ``norm_length`` (the max response length),
      then mean over sequences (Dr.GRPO, Liu et al. 2025: no per-response length bias).
    ``normalizer`` overrides the denominator (token or sequence count) for gradient accumulation.
    """
    mask = mask.to(loss_mat.dtype)
    masked = loss_mat * mask
    denominator = normalizer if normalizer is not None else aggregation_normalizer(mask, mode)
    if mode == "token-mean":
        return masked.sum() / denominator
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).sum() / denominator
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
        return per_seq.sum() / denominator
    if mode == "seq-mean-token-sum-norm":
        length = norm_length if norm_length is not None else loss_mat.shape[-1]
        return (masked.sum(dim=-1) / length).sum() / denominator
    raise InvalidValue(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each token given its prefix, aligned with ``input_ids`` (position 0 gets 0).

    ``logits[:, t]`` predicts ``input_ids[:, t + 1]``; logits are divided by the sampling temperature so the
    trainer's log-probs match the distribution the sampler drew from (as verl does).
    """
    shifted = logits[:, :-1].float() / temperature
    picked = torch.gather(F.log_softmax(shifted, dim=-1), -1, input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution, aligned like ``token_logprobs`` (position 0 gets 0)."""
    shifted = logits[:, :-1].float() / temperature
    log_p = F.log_softmax(shifted, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    return F.pad(entropy, (1, 0), value=0.0)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

    k1 = log r,  k2 = (log r)^2 / 2,  k3 = (r_ref - 1) - log r_ref with r_ref = pi_ref / pi  (unbiased, >= 0;
    GRPO's KL loss, Shao et al. 2024 Eq. 4). log r = log pi - log pi_ref. k3 is clamped to [-10, 10] in log
    space for numerical safety, as verl does.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        ref_log_ratio = torch.clamp(-log_ratio, min=-10.0, max=10.0)
        return ref_log_ratio.exp() - 1.0 - ref_log_ratio
    raise InvalidValue(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


@dataclass
class PolicyLossOutput:
    """The clipped-surrogate loss and the diagnostics logged with it."""

    loss: torch.Tensor
    clipfrac: torch.Tensor  # fraction of tokens where the clip was active
    approx_kl: torch.Tensor  # KL(old || new), k3 estimator (CleanRL's approx_kl)
    dual_clipfrac: torch.Tensor  # fraction of negative-advantage tokens bounded by the dual clip


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    normalizer: float | None = None,
    norm_length: int | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with asymmetric clip range and optional dual clip.

    PPO (Schulman et al. 2017, Eq. 7), clip-higher of DAPO (Yu et al. 2025):
        L_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_low, 1 + clip_high)),   r_t = pi / pi_old
    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), for A_t < 0 only:
        L_t = min(L_t, -c * A_t)    so a huge ratio on a bad action cannot blow the loss up.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise InvalidValue(f"dual_clip must be > 1.0 (e.g. 3.0), got {dual_clip}")
    mask_f = mask.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).to(logprobs.dtype)
    dual_active = torch.zeros_like(per_token)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_active = ((advantages < 0) & (per_token > bound)).to(logprobs.dtype)
        per_token = torch.where(advantages < 0, torch.minimum(per_token, bound), per_token)
    loss = aggregate(per_token, mask_f, aggregation, normalizer, norm_length)
    with torch.no_grad():
        approx_kl = masked_mean(ratio - 1.0 - log_ratio, mask_f)
        clipfrac = masked_mean(clip_active, mask_f)
        dual_clipfrac = masked_mean(dual_active, mask_f)
    return PolicyLossOutput(loss=loss, clipfrac=clipfrac, approx_kl=approx_kl, dual_clipfrac=dual_clipfrac)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
    aggregation: str = "token-mean",
    normalizer: float | None = None,
    norm_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 baselines; Schulman et al. 2017 implementation, as in CleanRL ppo.py).

        L_V = 1/2 * max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2)
    Returns ``(loss, clipfrac)``; ``clip_range=None`` gives the plain squared error.
    """
    mask_f = mask.to(values.dtype)
    unclipped = (values - returns).square()
    if clip_range is None:
        per_token = 0.5 * unclipped
        clipfrac = torch.zeros((), dtype=values.dtype)
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        clipped = (clipped_values - returns).square()
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).to(values.dtype), mask_f)
    return aggregate(per_token, mask_f, aggregation, normalizer, norm_length), clipfrac
