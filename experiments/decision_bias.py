"""What is the condition RL learned worth in EM, once the decision's shared bias is set (issue 25)?

The decision probe (`decision_probe.py`) finds RL's adapters telling 1-hop from 2-hop questions by their log-odds
of searching again (AUC 0.84-0.92) while greedy decoding, which decides at log-odds 0, searches again on most
1-hop questions too. This measures what the learned condition earns when only that shared bias moves:

1. **Calibrate** on the RL runs' own training questions (world 0's train split, ``--calibrate`` of each hop
   count): each question's log-odds after the oracle's first search, and the threshold with the best balanced
   accuracy (answer on 1-hop, search again on 2-hop), midway between two neighbouring log-odds.
2. **Play** the held-out questions (world 7's test split, the first ``--questions`` of each hop count, the final
   evals' tasks) greedily, except for one choice: after the agent's own first search, its next turn opens with
   ``<tool_call>`` when log P("<tool_call>") - log P("<answer>") exceeds the threshold and with ``<answer>``
   otherwise, and the model writes the rest of the turn greedily. The same play at threshold 0 is the policy's
   own decision, read the same way (full openings, not token by token), the baseline the shift is read against;
   greedy play being deterministic, only the episodes whose decision the threshold flips are played twice.

Nothing is trained and no held-out question chooses the threshold, so the difference between the two plays is
the part of the condition that RL learned and greedy decoding leaves unused.

    python experiments/decision_bias.py experiments/checkpoints/rl-grpo_lr5e-5_kl0.3-e3-s2 --questions 100 \\
        --json-out docs/results/decision_bias_e3.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision_probe import (  # noqa: E402
    HELD_OUT,
    OPENINGS,
    adapters_parser,
    balanced_accuracy,
    first_search_contexts,
    measure_adapters,
    opening_logprobs,
    probe,
)
from real_model import MAX_NEW_TOKENS, TRAIN_ENV  # noqa: E402

from agent_gym.agents.model_policy import ModelPolicy  # noqa: E402
from agent_gym.contract import MESSAGES  # noqa: E402
from agent_gym.trainers.backends import SamplingParams  # noqa: E402

CALIBRATION = {**TRAIN_ENV, "num_questions": 4000}  # world 0's train split, where every RL run of the grid trained


def best_threshold(log_odds_1hop: Sequence[float], log_odds_2hop: Sequence[float]) -> tuple[float, float]:
    """The threshold of best balanced accuracy and that accuracy. Candidates lie midway between neighbouring
    log-odds (and one unit beyond either end), so a question that sat on the line does not decide it; of equally
    good ones, the one nearest 0 (the least shift from the policy's own decision)."""
    values = sorted(set(log_odds_1hop) | set(log_odds_2hop))
    midpoints = [(a + b) / 2 for a, b in zip(values[:-1], values[1:], strict=True)]
    candidates = [values[0] - 1.0, *midpoints, values[-1] + 1.0]
    best = max(candidates, key=lambda t: (balanced_accuracy(log_odds_1hop, log_odds_2hop, t), -abs(t)))
    return best, balanced_accuracy(log_odds_1hop, log_odds_2hop, best)


class ThresholdDecisionPolicy(ModelPolicy):
    """Greedy, except the turn after the episode's first tool reply: it opens with ``<tool_call>`` when the
    model's log-odds of that opening against ``<answer>`` exceed ``threshold``, else with ``<answer>``, and the
    model writes the rest of that turn greedily. ``decisions`` keeps each episode's (log-odds, searched)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, threshold: float, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.threshold = threshold
        self.openings = {name: tokenizer.encode(text, add_special_tokens=False) for name, text in OPENINGS.items()}
        self.decisions: list[tuple[float, bool]] = []

    def act(self, observation: str, info: dict[str, Any]) -> str:
        messages = info.get(MESSAGES) or []
        roles = [message.get("role") for message in messages]
        if not roles or roles[-1] != "tool" or roles.count("tool") != 1:
            return super().act(observation, info)
        prompt = self.prompt_ids(info)
        logprobs = opening_logprobs(self.model, prompt, self.openings)
        log_odds = logprobs["search"] - logprobs["answer"]
        search = log_odds > self.threshold
        self.decisions.append((log_odds, search))
        opening = self.openings["search" if search else "answer"]
        params = SamplingParams(max_new_tokens=self.max_new_tokens - len(opening), temperature=0.0,
                                stop_token_ids=self.stop_token_ids, stop_strings=self.stop_strings)
        generation = self.backend.generate([prompt + opening], params)[0]
        return self.tokenizer.decode(opening + list(generation.token_ids), skip_special_tokens=True)


def play(model: Any, tokenizer: Any, threshold: float, hops: int, tasks: Iterable[int],
         env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The greedy play with the decision at ``threshold`` of ``tasks`` (indices) of the held-out env (or of
    SynthHop with ``env_kwargs``) with ``hops`` hops: each episode's EM, F1, searches, and the decision's log-odds
    and choice (None where the episode ended before a first tool reply)."""
    from agent_gym.evaluation import run_episode
    from agent_gym.make import make_env

    policy = ThresholdDecisionPolicy(model, tokenizer, threshold, max_new_tokens=MAX_NEW_TOKENS,
                                     max_context_tokens=2048)
    env = make_env("AgentR1-SynthHop-v0", {**(HELD_OUT if env_kwargs is None else env_kwargs), "hops": [hops]})
    episodes = []
    for task in tasks:  # seeded as `evaluate` seeds a run's episode ``task``
        before = len(policy.decisions)
        record = run_episode(env, policy, seed=task, options={"task_index": task})
        log_odds, searched = policy.decisions[before] if len(policy.decisions) > before else (None, None)
        episodes.append({"task": task, "em": float(record.em or 0.0), "f1": float(record.f1 or 0.0),
                         "searches": record.tool_calls,
                         "log_odds": None if log_odds is None else round(log_odds, 4), "searched_again": searched})
    env.close()
    return episodes


def summary(episodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """EM, F1, the share of episodes with more than one search, and how many reached the decision and searched."""
    return {"em": statistics.fmean(e["em"] for e in episodes), "f1": statistics.fmean(e["f1"] for e in episodes),
            "multihop": statistics.fmean(float(e["searches"] > 1) for e in episodes),
            "decided": sum(e["log_odds"] is not None for e in episodes),
            "searched_again": sum(bool(e["searched_again"]) for e in episodes), "episodes": len(episodes)}


def shifted(model: Any, tokenizer: Any, at_0: Sequence[dict[str, Any]], threshold: float, hops: int,
            env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The play at ``threshold`` from the play at 0: greedy play is deterministic, so only the episodes whose
    decision the threshold flips (log-odds between 0 and it) are played again; the others are the same."""
    flipped = [e["task"] for e in at_0
               if e["log_odds"] is not None and (e["log_odds"] > threshold) != e["searched_again"]]
    replayed = {e["task"]: e for e in play(model, tokenizer, threshold, hops, flipped, env_kwargs)}
    return [replayed.get(e["task"], e) for e in at_0]


def calibration_contexts(cache: Path, hops: int, questions: int) -> list[list[dict[str, Any]]]:
    """The training world's first-search contexts (`first_search_contexts` of world 0's train split), cached."""
    path = cache / f"train_contexts_{hops}hop_{questions}.json"
    if path.is_file():
        return json.loads(path.read_text())
    contexts = first_search_contexts(hops, questions, CALIBRATION)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(contexts))
    path.with_suffix(".tmp").replace(path)
    return contexts


def measure(model: Any, tokenizer: Any, calibration: dict[int, list], questions: int) -> dict[str, Any]:
    """One adapter's record: the threshold from the calibration contexts, then the held-out play at 0 and at it."""
    log_odds = {hops: probe(model, tokenizer, calibration[hops])["per_question"] for hops in (1, 2)}
    threshold, accuracy = best_threshold(log_odds[1], log_odds[2])
    record: dict[str, Any] = {
        "threshold": threshold, "calibration_questions": len(log_odds[1]),
        "calibration_accuracy": {"at_0": balanced_accuracy(log_odds[1], log_odds[2], 0.0), "at_threshold": accuracy}}
    for hops in (1, 2):
        started = time.perf_counter()
        at_0 = play(model, tokenizer, 0.0, hops, range(questions))
        at_threshold = shifted(model, tokenizer, at_0, threshold, hops)
        record[f"{hops}hop"] = {
            "at_0": summary(at_0), "at_threshold": summary(at_threshold),
            "flipped": sum(a is not b for a, b in zip(at_0, at_threshold, strict=True)),
            "seconds": round(time.perf_counter() - started, 1),
            "episodes_at_0": at_0, "episodes_at_threshold": at_threshold}
    for name in ("at_0", "at_threshold"):
        record[f"mix_em_{name}"] = (record["1hop"][name]["em"] + record["2hop"][name]["em"]) / 2
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = adapters_parser(__doc__, "where the calibration contexts are kept once built")
    parser.add_argument("--calibrate", type=int, default=40, help="training questions of each hop count")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    calibration = {hops: calibration_contexts(Path(args.cache), hops, args.calibrate) for hops in (1, 2)}

    def brief(row: dict[str, Any]) -> dict[str, Any]:  # the episodes only in the file
        return {key: ({k: v for k, v in value.items() if not k.startswith("episodes_")} if isinstance(value, dict)
                      else value) for key, value in row.items()}

    measure_adapters(args, lambda model, tokenizer: {"questions": args.questions,
                                                     **measure(model, tokenizer, calibration, args.questions)}, brief)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
