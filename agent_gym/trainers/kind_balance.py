"""Balance by task kind: each value of a task field (e.g. SynthHop's ``hops``) gets the same weight in the loss.

A mix of easy and hard tasks trains mostly on the easy ones: a group carries a policy gradient only when its
episodes disagree (dynamic_sampling.py), and easy tasks disagree more often. On SynthHop's 1/2-hop mix a warm
start's 8 samples disagreed on 79 % of 1-hop questions and 29 % of 2-hop ones, so 1-hop groups set the update's
direction (toward one search). Balancing rescales each informative row's advantage by a per-kind weight so that
every kind present among the informative groups holds the same total weight in the loss:

    omega_b   = row b's weight under the loss aggregation: its loss tokens (token-mean, seq-mean-token-sum[-norm])
                or 1 (seq-mean-token-mean)
    W_k       = sum of omega_b over the informative rows of kind k;  W = sum_k W_k;  K = kinds with a W_k > 0
    w_b       = (W / K) / W_{k(b)}  on informative rows,  1 elsewhere

so sum_{b in k} w_b * omega_b = W / K for every kind, and the informative rows' total weight W is unchanged.
Scaling a row's advantage by w_b > 0 scales its clipped-surrogate term by w_b exactly (losses.policy_loss is
linear in a positive advantage scale, dual clip included). A task's kind is read from the trajectory's
``info["task_fields"]`` (reset's info, contract.TASK_FIELDS).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agent_gym.contract import TASK_FIELDS
from agent_gym.episode_summary import summarize_episodes
from agent_gym.error import InvalidValue
from agent_gym.trainers.dynamic_sampling import informative_groups
from agent_gym.trainers.trajectory import Trajectory, episode_summary, group_index

__all__ = ["balance_weights", "informative_share_by_kind", "metrics_by_kind", "row_loss_weights", "task_kinds"]

#: The episode metrics logged per kind (``charts/<name>/<kind>``); tool_calls tells a habit apart (on SynthHop,
#: searches per episode: 1 answers after the first page, 2 searches again).
KIND_METRICS = ("reward", "turns", "tool_calls", "em", "f1")


def task_kinds(trajectories: Sequence[Trajectory], field: str) -> list[str]:
    """The value of task field ``field`` for each trajectory, as a string (``"1"``, ``"2"``, ``"bridge"``)."""
    kinds = []
    for trajectory in trajectories:
        fields = trajectory.episode.task_fields  # reset's info[TASK_FIELDS], on the episode's record
        if field not in fields:
            raise InvalidValue(
                f"balance_by={field!r}: the env's reset info['{TASK_FIELDS}'] has no {field!r} (it has "
                f"{sorted(fields) or 'nothing'}); name one of its fields, or leave balance_by empty"
            )
        kinds.append(str(fields[field]))
    return kinds


def row_loss_weights(loss_mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """``[B]`` each row's weight in the aggregated loss, up to a factor shared by all rows (see the module)."""
    if aggregation == "seq-mean-token-mean":
        return torch.ones(loss_mask.shape[0], device=loss_mask.device)
    return loss_mask.float().sum(dim=1)


def balance_weights(
    kinds: Sequence[str], outcomes: torch.Tensor, groups: torch.Tensor, row_weights: torch.Tensor
) -> torch.Tensor:
    """``[B]`` the advantage scale of each row, w_b of the module docstring."""
    informative_rows = informative_groups(outcomes, groups)[groups.cpu()]
    row_weights = row_weights.detach().float().cpu()
    totals: dict[str, float] = {}
    for kind, flag, weight in zip(kinds, informative_rows.tolist(), row_weights.tolist(), strict=True):
        if flag:
            totals[kind] = totals.get(kind, 0.0) + weight
    totals = {kind: total for kind, total in totals.items() if total > 0}
    scale = torch.ones(len(kinds))
    if not totals:
        return scale
    share = sum(totals.values()) / len(totals)
    for row, (kind, flag) in enumerate(zip(kinds, informative_rows.tolist(), strict=True)):
        if flag and kind in totals:
            scale[row] = share / totals[kind]
    return scale


def informative_share_by_kind(trajectories: Sequence[Trajectory], field: str) -> dict[str, float]:
    """For each value of ``field``: its informative groups over its groups (a group's kind: its first row's)."""
    if not trajectories:
        return {}
    groups = group_index([t.group_id for t in trajectories])
    flags = informative_groups(torch.tensor([t.outcome for t in trajectories]), groups).tolist()
    kinds = task_kinds(trajectories, field)
    group_kind: dict[int, str] = {}
    for group, kind in zip(groups.tolist(), kinds, strict=True):
        group_kind.setdefault(group, kind)
    counts: dict[str, list[int]] = {}
    for group, kind in group_kind.items():
        count = counts.setdefault(kind, [0, 0])
        count[0] += int(flags[group])
        count[1] += 1
    return {kind: informative / total for kind, (informative, total) in sorted(counts.items())}


def metrics_by_kind(trajectories: Sequence[Trajectory], field: str, prefix: str = "charts") -> dict[str, float]:
    """``prefix/<metric>/<kind>`` for each of `KIND_METRICS` over the episodes of each value of task field
    ``field`` (an episode split into step-level samples counts once, by its first sample)."""
    episodes: dict[str, list] = {}
    for trajectory, kind in zip(trajectories, task_kinds(trajectories, field), strict=True):
        if trajectory.info.get("sample_index", 0) == 0:
            episodes.setdefault(kind, []).append(episode_summary(trajectory))
    metrics = {}
    for kind, kind_episodes in sorted(episodes.items()):
        summary = summarize_episodes(kind_episodes)
        metrics.update({f"{prefix}/{name}/{kind}": float(summary[name]) for name in KIND_METRICS if name in summary})
    return metrics
