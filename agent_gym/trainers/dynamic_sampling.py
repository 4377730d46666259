"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, §3.2): train only on groups that carry a contrast.

A group whose episodes all got the same return has GRPO advantage 0 on every token: it adds nothing to the
policy gradient but still counts in a token-mean loss's denominator, so it dilutes the groups that do carry
signal. DAPO drops such groups and samples more tasks until the batch holds ``tasks_per_step`` informative
groups. Here the refill is bounded (``max_sampling_rounds`` rollouts of ``tasks_per_step`` tasks each, as DAPO's
``max_num_gen_batches``); a step that ends short trains on the informative groups it found, and a step that
found none trains on its last round as it is (the update then moves only by its KL term).

``informative_groups`` is the one definition of an informative group, shared with the balance by task kind
(kind_balance.py) and with the logged share ``charts/informative_groups``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agent_gym.error import InvalidValue
from agent_gym.trainers.trajectory import Trajectory, group_index

__all__ = ["SampledGroups", "fill_with_informative_groups", "informative_groups", "round_seed"]

# Returns closer than this count as equal: sums of the same float rewards in another order differ by rounding.
_EQUAL = 1e-8


def informative_groups(outcomes: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``[G]`` bool: whether group g's returns differ (max - min > 1e-8). ``groups`` numbers rows from 0."""
    count = int(groups.max()) + 1 if groups.numel() else 0
    outcomes = outcomes.detach().to(torch.float64).cpu()
    groups = groups.cpu()
    highest = torch.full((count,), -torch.inf, dtype=torch.float64).scatter_reduce(0, groups, outcomes, "amax")
    lowest = torch.full((count,), torch.inf, dtype=torch.float64).scatter_reduce(0, groups, outcomes, "amin")
    return (highest - lowest) > _EQUAL


def round_seed(step_seed: int, round_index: int) -> int:
    """The sampling seed of a step's refill round: round 0 keeps the step's seed (a run without refills samples
    as before); later rounds get independent streams that no other step's seed collides with."""
    if round_index == 0:
        return step_seed
    return int(np.random.SeedSequence([step_seed, round_index]).generate_state(1)[0])


@dataclass(frozen=True)
class SampledGroups:
    """What a step's sampling rounds produced.

    Attributes:
        trajectories: what the step trains on: up to ``groups_wanted`` informative groups (or, if none was
            found, the last round's groups).
        sampled: every trajectory played in the step, over all rounds (the policy's behaviour, for metrics).
        groups: groups sampled over all rounds.
        informative: informative groups among them.
        rounds: rollouts played.
    """

    trajectories: list[Trajectory]
    sampled: list[Trajectory]
    groups: int
    informative: int
    rounds: int

    @property
    def informative_share(self) -> float:
        """Informative groups over groups sampled: the share of groups that carry a learning signal."""
        return self.informative / self.groups if self.groups else 0.0


def _grouped(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return list(groups.values())


def fill_with_informative_groups(
    collect_round: Callable[[int], Sequence[Trajectory]], groups_wanted: int, max_rounds: int
) -> SampledGroups:
    """Call ``collect_round(r)`` for r = 0, 1, ... until ``groups_wanted`` informative groups are in hand, or
    ``max_rounds`` rounds were played (see the module docstring).

    Group ids are prefixed with the round (``"r/..."``), so a task drawn in two rounds makes two groups. The
    first ``groups_wanted`` informative groups are kept, in the order they were sampled (DAPO keeps the batch
    size fixed and leaves the surplus out).
    """
    if groups_wanted < 1 or max_rounds < 1:
        raise InvalidValue(f"groups_wanted and max_rounds must be >= 1, got {groups_wanted}, {max_rounds}")
    kept: list[list[Trajectory]] = []
    sampled: list[Trajectory] = []
    last_round: list[Trajectory] = []
    groups = informative = rounds = 0
    while rounds < max_rounds and len(kept) < groups_wanted:
        last_round = [dataclasses.replace(t, group_id=f"{rounds}/{t.group_id}") for t in collect_round(rounds)]
        rounds += 1
        sampled += last_round
        members = _grouped(last_round)
        if not members:
            continue
        outcomes = torch.tensor([t.outcome for t in last_round], dtype=torch.float64)
        flags = informative_groups(outcomes, group_index([t.group_id for t in last_round])).tolist()
        groups += len(members)
        informative += sum(flags)
        kept += [group for group, flag in zip(members, flags, strict=True) if flag][: groups_wanted - len(kept)]
    trajectories = [t for group in kept for t in group] if kept else last_round
    return SampledGroups(trajectories, sampled, groups, informative, rounds)
