"""Copy skill: how often a model writes each assistant turn of a scripted episode exactly, teacher-forced.

A search agent's turns are mostly copies: the first query copies an entity out of the question, the next
copies a bridge entity out of a search result, the answer copies a span out of the last result. A model
that cannot copy samples almost no right episode, so RL has no outcome signal (docs/RESULTS.md). This
metric measures the skill directly: feed the scripted episode's exact tokens, take the argmax at every
assistant position, and count a turn as exact only if every one of its tokens is right (what a greedy
rollout of that turn needs).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

from agent_gym.trainers.token_episode import SFTExample, tokenize_episode

__all__ = ["turn_exactness", "copy_skill", "scripted_examples"]


def _assistant_runs(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of consecutive 1s: one run per assistant turn."""
    runs, start = [], None
    for position, flag in enumerate(loss_mask):
        if flag and start is None:
            start = position
        elif not flag and start is not None:
            runs.append((start, position))
            start = None
    if start is not None:
        runs.append((start, len(loss_mask)))
    return runs


@torch.no_grad()
def turn_exactness(model: Any, examples: Sequence[SFTExample]) -> dict[str, float]:
    """Teacher-forced greedy scores of each assistant turn, averaged over ``examples``.

    Returns ``turn{k}/exact`` (share of turns whose every token is the argmax) and ``turn{k}/token_acc``
    (share of the turn's tokens that are), for k = 1, 2, ... in turn order, plus ``min_exact``, the worst
    turn's exact share (the gate a multi-hop episode must pass on every turn).
    """
    was_training = getattr(model, "training", False)
    model.eval()
    exact: dict[int, list[float]] = {}
    tokens: dict[int, list[float]] = {}
    for example in examples:
        ids = torch.tensor([example.input_ids])
        # The prediction for token t comes from the logits at t - 1.
        right = (model(input_ids=ids).logits[0, :-1].argmax(-1) == ids[0, 1:]).tolist()
        for turn, (start, end) in enumerate(_assistant_runs(example.loss_mask), start=1):
            if start == 0:  # a turn at position 0 has no context to predict it from
                continue
            hits = right[start - 1 : end - 1]
            exact.setdefault(turn, []).append(float(all(hits)))
            tokens.setdefault(turn, []).extend(float(hit) for hit in hits)
    model.train(was_training)
    result: dict[str, float] = {}
    for turn in sorted(exact):
        result[f"turn{turn}/exact"] = statistics.mean(exact[turn])
        result[f"turn{turn}/token_acc"] = statistics.mean(tokens[turn])
    if exact:
        result["min_exact"] = min(result[f"turn{turn}/exact"] for turn in exact)
    return result


def scripted_examples(
    tokenizer: Any, env_id: str, env_kwargs: dict[str, Any], policy: str = "oracle", episodes: int = 64, seed: int = 0
) -> list[SFTExample]:
    """Token layouts of ``episodes`` episodes of a scripted policy on ``gymnasium.make(env_id, **env_kwargs)``."""

    from agent_gym.evaluation import iter_episodes
    from agent_gym.make import make_env
    from agent_gym.policies import make_policy

    env = make_env(env_id, env_kwargs)
    try:
        plays = list(iter_episodes(env, make_policy(policy, seed=seed), episodes, seed=seed, keep_messages=True,
                                   progress=False))
    finally:
        env.close()
    return [tokenize_episode(tokenizer, play.messages) for play in plays]


def copy_skill(
    model: Any, tokenizer: Any, env_id: str, env_kwargs: dict[str, Any], episodes: int = 64
) -> dict[str, float]:
    """:func:`turn_exactness` on the ``oracle``'s episodes of an env (use held-out worlds: never-seen names)."""
    return turn_exactness(model, scripted_examples(tokenizer, env_id, env_kwargs, "oracle", episodes))
