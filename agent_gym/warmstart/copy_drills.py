"""Pointer drills: a scripted policy's episodes, on envs with never-seen names, cut into short training rows.

After the induction warm-up a model can copy; a search agent must also choose *what* to copy: the topic
entity out of the question, the bridge entity out of a result, the answer out of the last result. Drills
teach that choice in the exact output format of the env. Every drill comes from a *fresh* env (the env's own
``fresh_world=i`` option: SynthHop builds a world from seeds it reserves for this), so its names were never
seen before and only
copying lowers the loss on them: trained on one fixed world, a model learns name statistics instead and
copies 0 % of never-seen names (docs/RESULTS.md).

Rows are kept short, because the time to learn to copy grows with the context length: the system prompt is
dropped from most rows (it is the same in every episode), and tool results are cut to their first hits.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.search_tool import first_hits
from agent_gym.trainers.token_episode import tokenize_episode
from agent_gym.warmstart.lm_loss import WeightedRow

__all__ = ["DRILL_FORMS", "DrillSource", "drill_row"]

# The row forms, and the share of drills of each form by default.
#   first_turn: the question and the first assistant turn only (copy the topic entity);
#   one_hit / two_hits: the whole episode without the system prompt, each result cut to its first hits;
#   full: the whole episode as the env renders it, system prompt and all hits included.
# Measured: with full rows at 0.1 the model, once it copied well, began to copy format tokens out of the system
# prompt too ("<tool_call></tool_call>" after "<tool_call>": turn-1 exact 0.92 -> 0.00 in 200 steps); 0.3 of
# full rows teaches it which context to copy from.
DRILL_FORMS: dict[str, float] = {"first_turn": 0.25, "one_hit": 0.3, "two_hits": 0.15, "full": 0.3}


def drill_row(tokenizer: Any, messages: Sequence[Mapping[str, Any]], form: str,
              env_token_weight: float = 0.1) -> WeightedRow:
    """One training row of an episode's ``messages`` in ``form`` (see :data:`DRILL_FORMS`).

    Assistant tokens get loss weight 1; the rest (prompt, tool results) ``env_token_weight``, so the model
    also practises copying inside the results (their names recur), without the results dominating the loss.
    """
    if form not in DRILL_FORMS:
        raise InvalidValue(f"unknown drill form {form!r}; choose one of {sorted(DRILL_FORMS)}")
    messages = [dict(message) for message in messages]
    if form != "full":
        messages = [message for message in messages if message.get("role") != "system"]
    if form == "first_turn":
        first_assistant = next(i for i, message in enumerate(messages) if message.get("role") == "assistant")
        messages = messages[: first_assistant + 1]
    elif form in ("one_hit", "two_hits"):
        hits = 1 if form == "one_hit" else 2
        for message in messages:
            if message.get("role") == "tool":
                message["content"] = first_hits(str(message.get("content") or ""), hits)
    example = tokenize_episode(tokenizer, messages)
    return WeightedRow(example.input_ids, [1.0 if flag else env_token_weight for flag in example.loss_mask])


@dataclass
class DrillSource:
    """Drill rows from episodes of ``policy`` on ``gymnasium.make(env_id, **env_kwargs, fresh_kwarg=value)``.

    Pretraining drills the ``oracle``; SFT drills its own teacher, so the drills keep the copy skill without
    changing the behaviour SFT clones.

    ``rows(index, tokens)`` is a function of ``index`` alone (its env is made with ``fresh_kwarg`` set to
    ``fresh_start + index``, its RNG seeded by it), so a resumed run draws the very rows it would have.
    Each call uses one row form, so the rows of a batch have similar lengths and little padding.
    """

    tokenizer: Any
    env_id: str
    env_kwargs: Mapping[str, Any]
    fresh_kwarg: str = "fresh_world"  # the env option that names a never-seen variant (envs/synthhop.py)
    fresh_start: int = 0
    policy: str = "oracle"
    forms: Mapping[str, float] | None = None
    env_token_weight: float = 0.1
    seed: int = 0
    policy_options: Mapping[str, Any] | None = None  # e.g. {"p_multihop": 0.3} for weak-multihop

    def rows(self, index: int, tokens: int) -> list[WeightedRow]:
        """Rows of one form, from one fresh env, until they hold about ``tokens`` tokens."""

        from agent_gym.evaluation import run_episode
        from agent_gym.make import make_env
        from agent_gym.policies import make_policy

        forms = dict(self.forms or DRILL_FORMS)
        rng = random.Random(f"{self.seed}:{index}")
        form = rng.choices(list(forms), weights=list(forms.values()))[0]
        env = make_env(self.env_id, {**self.env_kwargs, self.fresh_kwarg: self.fresh_start + index})
        rows: list[WeightedRow] = []
        try:
            policy = make_policy(self.policy, seed=rng.randrange(2**31), **dict(self.policy_options or {}))
            task = 0
            while sum(len(row.input_ids) for row in rows) < tokens:
                play = run_episode(env, policy, seed=task, options={"task_index": task}, keep_messages=True)
                rows.append(drill_row(self.tokenizer, play.messages, form, self.env_token_weight))
                task += 1
        finally:
            env.close()
        return rows
