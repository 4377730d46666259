"""How likely is the agent to search again after its first search, on 1-hop and on 2-hop questions (issue 25)?

Greedy curves show a habit only once it flips; this reads the decision itself. For each of the first
``--questions`` held-out questions of each hop count (world 7's test split), the oracle's first turn (a search
for the question's entity) and the env's reply are the context, as a rollout renders it; then

    p_search = P("<tool_call>") / (P("<tool_call>") + P("<answer>"))

over the two ways the agent's next turn can open (each the probability of its whole token prefix). The policy
RL is after searches again on 2-hop questions and answers on 1-hop ones: mean p_search near 0 on 1-hop and near 1
on 2-hop. ``greedy_search_share`` is the share of questions with p_search > 0.5 (what greedy decoding does at
that point). ``log_odds`` is the mean over questions of log P("<tool_call>") - log P("<answer>"), and
``log_odds_gap`` its 2-hop minus 1-hop value: RL that only shifts the habit moves both hop counts' log-odds alike
and leaves the gap; RL that teaches *when* to search grows it. ``auc`` reads the same from each question's
log-odds (`separation`): how well one threshold tells the hop counts apart (1.0: all of them), and
``best_shift_accuracy`` the decision's balanced accuracy at the best threshold, against ``decision_accuracy`` at 0.

    python experiments/decision_probe.py ~/agent-gym-runs/sweep/warm75 experiments/checkpoints/rl-grpo-s0
    python experiments/decision_probe.py ADAPTER ... --questions 100 --json-out docs/results/decision_probe.json

One thread, about a minute an adapter for 100 questions of each hop count on the Intel Xeon (before the context's
KV cache served both openings, which halved it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_model import TRAIN_ENV  # noqa: E402

HELD_OUT = {**TRAIN_ENV, "world_seed": 7, "split": "test", "num_questions": 400}
OPENINGS = {"search": "<tool_call>", "answer": "<answer>"}


def first_search_contexts(hops: int, questions: int, env_kwargs: dict[str, Any] | None = None
                          ) -> list[list[dict[str, Any]]]:
    """The messages up to the env's reply to the oracle's first search, for the first ``questions`` tasks of the
    held-out env (or of SynthHop with ``env_kwargs``)."""
    import agent_gym  # noqa: F401  (registers the env ids)
    from agent_gym.evaluation import run_episode
    from agent_gym.make import make_env
    from agent_gym.policies import make_policy

    env = make_env("AgentR1-SynthHop-v0", {**(HELD_OUT if env_kwargs is None else env_kwargs), "hops": [hops]})
    contexts = []
    for index in range(questions):
        record = run_episode(env, make_policy("oracle"), seed=index, options={"task_index": index},
                             keep_messages=True)
        messages = list(record.messages or [])
        first_tool = next(i for i, message in enumerate(messages) if message.get("role") == "tool")
        contexts.append(messages[: first_tool + 1])
    env.close()
    return contexts


def cached_contexts(cache: Path, hops: int, questions: int) -> list[list[dict[str, Any]]]:
    """`first_search_contexts` of the held-out env, read from ``cache`` when an earlier run built them."""
    path = cache / f"contexts_{hops}hop_{questions}.json"
    if path.is_file():
        return json.loads(path.read_text())
    contexts = first_search_contexts(hops, questions)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(contexts))
    path.with_suffix(".tmp").replace(path)
    return contexts


@torch.no_grad()
def opening_logprob(model: Any, context_ids: list[int], opening_ids: list[int]) -> float:
    """log P(opening | context), the sum over the opening's tokens."""
    ids = torch.tensor([context_ids + opening_ids])
    logits = model(input_ids=ids).logits[0, len(context_ids) - 1 : -1].float()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(opening_ids)[:, None]).sum())


@torch.no_grad()
def opening_logprobs(model: Any, context_ids: list[int], openings: dict[str, list[int]]) -> dict[str, float]:
    """`opening_logprob` of each opening, the context read once: its KV cache serves every opening (cropped back
    after each), which halves a probe's cost against one full forward per opening."""
    from transformers import DynamicCache

    from agent_gym.trainers.packed_forward import cache_keyword

    cache = DynamicCache()
    keyword = cache_keyword(model)
    out = model(input_ids=torch.tensor([context_ids]), use_cache=True, **{keyword: cache})
    first = torch.log_softmax(out.logits[0, -1].float(), -1)
    result = {}
    for name, ids in openings.items():
        total = float(first[ids[0]])
        if len(ids) > 1:  # the opening's later tokens, each predicted from the context and the tokens before it
            logits = model(input_ids=torch.tensor([ids[:-1]]), use_cache=True, **{keyword: cache}).logits[0]
            cache.crop(-(len(ids) - 1))  # back to the context alone (a negative crop removes tokens)
            total += float(torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids[1:])[:, None]).sum())
        result[name] = total
    return result


def balanced_accuracy(log_odds_1hop: Sequence[float], log_odds_2hop: Sequence[float], threshold: float) -> float:
    """Mean of the share of 1-hop questions answered (log-odds <= threshold) and 2-hop ones searched again."""
    answered = sum(value <= threshold for value in log_odds_1hop) / len(log_odds_1hop)
    searched = sum(value > threshold for value in log_odds_2hop) / len(log_odds_2hop)
    return (answered + searched) / 2


def separation(log_odds_1hop: Sequence[float], log_odds_2hop: Sequence[float]) -> dict[str, float]:
    """How well each question's log-odds of searching again tell its hop count, beyond the mean gap.

    ``auc``: the chance that a 2-hop question's log-odds exceed a 1-hop question's (ties count one half), 1.0 when
    one threshold separates them all. ``decision_accuracy``: the greedy decision's balanced accuracy (answer on
    1-hop, search on 2-hop, threshold 0). ``best_shift_accuracy``: the same at the best threshold, what a policy
    would reach if RL only moved the shared bias from here; its gap to ``decision_accuracy`` is the part of the
    condition that is learned but not yet acted on."""
    pairs = [(two > one) + 0.5 * (two == one) for one in log_odds_1hop for two in log_odds_2hop]
    thresholds = [*log_odds_1hop, *log_odds_2hop, -math.inf]
    return {"auc": statistics.fmean(pairs), "decision_accuracy": balanced_accuracy(log_odds_1hop, log_odds_2hop, 0.0),
            "best_shift_accuracy": max(balanced_accuracy(log_odds_1hop, log_odds_2hop, t) for t in thresholds)}


def probe(model: Any, tokenizer: Any, contexts: Sequence[list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean p_search over the contexts, the share of them where searching is the more likely opening, the mean
    log-odds of searching, log P(search) - log P(answer), and each question's log-odds (``per_question``).

    The log-odds separate a policy that conditions on the question from one that only shifts its habit: a shift
    moves both hop counts' mean log-odds by the same amount, so their difference (2-hop minus 1-hop) is what RL
    must grow, whatever happens to the shared rate."""
    from agent_gym.models.chat_template import render_prompt

    openings = {name: tokenizer.encode(text, add_special_tokens=False) for name, text in OPENINGS.items()}
    values, log_odds = [], []
    for messages in contexts:
        logprobs = opening_logprobs(model, render_prompt(tokenizer, messages), openings)
        log_odds.append(logprobs["search"] - logprobs["answer"])
        values.append(1.0 / (1.0 + math.exp(-log_odds[-1])))
    return {"p_search": statistics.fmean(values), "greedy_search_share": sum(v > 0.5 for v in values) / len(values),
            "log_odds": statistics.fmean(log_odds), "questions": len(values),
            "per_question": [round(value, 4) for value in log_odds]}


def label(adapter: Path) -> str:
    """An adapter's name; a training checkpoint's is its run and step (``RUN step_000050``)."""
    adapter = adapter.parent if adapter.name == "policy" else adapter
    in_run = adapter.parent.name == "checkpoints" and adapter.name.startswith("step_")  # not experiments/checkpoints/X
    return f"{adapter.parent.parent.name} {adapter.name}" if in_run else adapter.name


def adapters_parser(description: str | None, cache_help: str) -> argparse.ArgumentParser:
    """The command line of a script that measures adapters on held-out questions: the adapters, ``--questions``
    of each hop count, ``--dtype``, ``--threads``, a ``--cache`` of built contexts and ``--json-out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", help="LoRA adapter directories (each names its base model)")
    parser.add_argument("--questions", type=int, default=100, help="held-out questions of each hop count")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=str(Path.home() / "agent-gym-runs" / "decision_probe"), help=cache_help)
    parser.add_argument("--json-out", default=None, help="also write the results here (merged into its records)")
    return parser


def measure_adapters(args: argparse.Namespace, measure: Callable[[Any, Any], dict[str, Any]],
                     shown: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> dict[str, Any]:
    """``measure(model, tokenizer)`` of each of ``args.adapters``, printed (as ``shown`` makes it) and kept by its
    `label`, merged into ``args.json_out``'s records (written after each adapter) when given."""
    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.models.precision import resolve_dtype

    out = Path(args.json_out) if args.json_out else None
    results: dict[str, Any] = json.loads(out.read_text()) if out is not None and out.is_file() else {}
    for adapter in args.adapters:
        model, tokenizer = load_model_and_tokenizer(adapter, dtype=resolve_dtype(args.dtype))
        model.eval()
        row = measure(model, tokenizer)
        results[label(Path(adapter))] = {"adapter": str(adapter), **row}
        print(label(Path(adapter)), json.dumps(shown(row)), flush=True)
        if out is not None:
            out.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = adapters_parser(__doc__, "where the held-out contexts are kept once built (building them takes minutes)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts = {hops: cached_contexts(Path(args.cache), hops, args.questions) for hops in (1, 2)}

    def measure(model: Any, tokenizer: Any) -> dict[str, Any]:
        row: dict[str, Any] = {f"{hops}hop": probe(model, tokenizer, contexts[hops]) for hops in (1, 2)}
        row["log_odds_gap"] = row["2hop"]["log_odds"] - row["1hop"]["log_odds"]  # > 0: more search on 2-hop
        row.update(separation(row["1hop"]["per_question"], row["2hop"]["per_question"]))
        return row

    def brief(row: dict[str, Any]) -> dict[str, Any]:  # the per-question log-odds only in the file
        return {key: ({k: v for k, v in value.items() if k != "per_question"} if isinstance(value, dict) else value)
                for key, value in row.items()}

    measure_adapters(args, measure, brief)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
