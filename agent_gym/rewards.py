"""Answer metrics and reward specifications (docs/DESIGN.md §4).

The metrics follow the official evaluators. All three datasets normalise answers as SQuAD does: lower-cased,
stripped of punctuation and of the articles a/an/the, white space folded; EM is the best over gold aliases.
F1 differs by dataset, so it takes a ``rule``:

- ``hotpotqa`` (hotpot_evaluate_v1.py; the default): if either side is ``yes``, ``no`` or ``noanswer`` and
  they differ, F1 = precision = recall = 0. Over aliases, the best-F1 alias gives F1, precision and recall.
- ``2wikimultihopqa`` (2wikimultihop_evaluate_v1.1.py): the same yes/no/noanswer rule, but F1, precision and
  recall are each the best over the aliases (possibly from different aliases).
- ``musique`` (MuSiQue's metrics/answer.py, SQuAD's): no yes/no rule; an answer or gold with no tokens scores
  1 against another with none, else 0. The official script reports F1 only; precision and recall here come
  from the best-F1 alias.
- ``squad`` (SQuAD v1.1's evaluate script, which open-domain QA sets such as NQ, TriviaQA and PopQA use): no
  yes/no rule, and no tokens scores 0; the best-F1 alias gives F1, precision and recall.

Search-R1's parquet rows mix sources; :func:`answer_rule_for_source` picks each row's rule from its
``data_source``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from agent_gym.error import InvalidValue

__all__ = [
    "ANSWER_RULES",
    "answer_rule_for_source",
    "normalize_answer",
    "exact_match",
    "f1_score",
    "sub_exact_match",
    "AnswerScores",
    "score_answer",
    "RewardSpec",
    "get_reward_spec",
    "REWARD_SPECS",
]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL_F1_ANSWERS = ("yes", "no", "noanswer")
ANSWER_RULES = ("hotpotqa", "2wikimultihopqa", "musique", "squad")
DEFAULT_ANSWER_RULE = "hotpotqa"
# Search-R1's data_source names (nq, tq, popqa, Bamboogle... take SQuAD's rule)
_SOURCE_RULES = {"hotpotqa": "hotpotqa", "2wiki": "2wikimultihopqa", "2wikimultihopqa": "2wikimultihopqa",
                 "musique": "musique"}


def answer_rule_for_source(data_source: str) -> str:
    """The answer rule of a Search-R1 ``data_source``: its dataset's own, else SQuAD's (NQ, TriviaQA, PopQA)."""
    return _SOURCE_RULES.get(data_source.strip().lower(), "squad")


def _answer_rule(rule: str | None) -> str:
    if rule is None:
        return DEFAULT_ANSWER_RULE
    if rule not in ANSWER_RULES:
        raise InvalidValue(f"unknown answer rule {rule!r}; choose one of {', '.join(ANSWER_RULES)}")
    return rule


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop articles, fold white space (official HotpotQA/SQuAD order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, rule: str | None = None) -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) under a dataset's ``rule`` (see the module docstring)."""
    rule = _answer_rule(rule)
    normalized_prediction = normalize_answer(prediction)
    normalized_gold = normalize_answer(gold)
    zero = (0.0, 0.0, 0.0)
    if rule in ("hotpotqa", "2wikimultihopqa") and normalized_prediction != normalized_gold and (
        normalized_prediction in _SPECIAL_F1_ANSWERS or normalized_gold in _SPECIAL_F1_ANSWERS
    ):
        return zero
    prediction_tokens = normalized_prediction.split()
    gold_tokens = normalized_gold.split()
    if rule == "musique" and not (prediction_tokens and gold_tokens):
        agree = float(prediction_tokens == gold_tokens)
        return agree, agree, agree
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return zero
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def sub_exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised gold answer occurs in the normalised prediction (as whole tokens)."""
    normalized_gold = normalize_answer(gold)
    if not normalized_gold:
        return 0.0
    return float(f" {normalized_gold} " in f" {normalize_answer(prediction)} ")


@dataclass(frozen=True)
class AnswerScores:
    """Metrics of one answer against its best-matching gold alias."""

    em: float
    f1: float
    precision: float
    recall: float
    sub_em: float

    def as_dict(self) -> dict[str, float]:
        return {"em": self.em, "f1": self.f1, "precision": self.precision, "recall": self.recall,
                "sub_em": self.sub_em}


def score_answer(prediction: str | None, golds: Iterable[str], rule: str | None = None) -> AnswerScores:
    """Score a prediction against every gold alias, as the ``rule``'s official evaluator does (the module
    docstring says how the rules differ); EM and sub-EM are the best over aliases under every rule."""
    rule = _answer_rule(rule)
    golds = [gold for gold in golds if gold is not None]
    if prediction is None or not golds:
        return AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0)
    em = max(exact_match(prediction, gold) for gold in golds)
    per_gold = [f1_score(prediction, gold, rule) for gold in golds]
    if rule == "2wikimultihopqa":
        f1, precision, recall = (max(values) for values in zip(*per_gold, strict=True))
    else:
        f1, precision, recall = max(per_gold)
    sub_em = max(sub_exact_match(prediction, gold) for gold in golds)
    return AnswerScores(em, f1, precision, recall, sub_em)


@dataclass(frozen=True)
class RewardSpec:
    """How an episode is paid. Every term is reported whatever the spec: ``info["reward_terms"]`` the paid ones
    (they sum to the reward), ``info["reward_scores"]`` the ones only reported (format, em, f1...).

    Attributes:
        name: label reported in ``info``.
        outcome_metric: the answer metric the outcome pays (``em`` as in the paper, or ``f1``).
        format_penalty: subtracted at each malformed turn, immediately.
        process_reward: paid per tool call that makes progress (a tool's own ``ToolResult.reward`` when it sets
            one; else a search whose hits contain a gold supporting title not found before).
        process_cap: the most process reward one episode can earn, so it cannot outweigh the outcome; also the
            most that ``idle_call_cost`` can charge one episode.
        idle_call_cost: charged (as a negative process reward) for each tool call that ran and made no progress:
            no reward of its own and no gold evidence not shown before, e.g. a repeated search, or a second search
            on a question whose one supporting page the first found. Meant for envs whose tasks name
            ``supporting_titles`` or whose tools report progress: elsewhere every call makes "no progress".
        answer_rule: whose official evaluator scores answers (:data:`ANSWER_RULES`); ``None`` lets the env
            choose: the QA envs pick their dataset's, other envs a task's ``metadata["answer_rule"]`` (a
            Search-R1 row's: its data_source's), else HotpotQA's.
    """

    name: str = "paper"
    outcome_metric: Literal["em", "f1"] = "em"
    format_penalty: float = 0.0
    process_reward: float = 0.0
    process_cap: float = 0.0
    idle_call_cost: float = 0.0
    answer_rule: str | None = None

    def __post_init__(self) -> None:
        if self.answer_rule is not None:
            _answer_rule(self.answer_rule)
        for name in ("format_penalty", "process_reward", "process_cap", "idle_call_cost"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value < float("inf"):
                raise InvalidValue(f"RewardSpec.{name} must be a finite number >= 0, got {value!r}")

    def outcome(self, scores: AnswerScores, format_score: float, format_ok: bool) -> float:
        """Agent-R1 Eq. 6: the answer metric when the format is right, else ``format_score - 1`` (in [-1, 0))."""
        if format_ok:
            return scores.f1 if self.outcome_metric == "f1" else scores.em
        return format_score - 1.0

    def process(self, raw_reward: float, paid_so_far: float) -> float:
        """A tool call's process reward, clipped so the episode's total stays within ``process_cap``."""
        if self.process_reward <= 0.0 or raw_reward <= 0.0:
            return 0.0
        room = max(0.0, self.process_cap - paid_so_far)
        return min(raw_reward * self.process_reward, room)

    def idle_charge(self, charged_so_far: float) -> float:
        """The (negative) charge for a call that made no progress, clipped so the episode's charges total at most
        ``process_cap``; ``charged_so_far`` is their magnitude so far."""
        if self.idle_call_cost <= 0.0:
            return 0.0
        return -min(self.idle_call_cost, max(0.0, self.process_cap - charged_so_far))


REWARD_SPECS: dict[str, RewardSpec] = {
    # Agent-R1 Eq. 6: all reward at the end; malformed turns lower the format score that Eq. 6 falls back to.
    "paper": RewardSpec(name="paper"),
    # Adds process rewards for evidence-finding calls, capped at 0.3 so an agent that never answers right earns
    # less than one that does (outcome 1.0), and a small immediate penalty per malformed turn.
    "dense": RewardSpec(name="dense", format_penalty=0.05, process_reward=0.1, process_cap=0.3),
    # Dense, and a call that shows no new gold evidence costs what a useful one earns (0.1, at most 0.3 an
    # episode): under "dense" a second search on a 1-hop question is free, so a group whose answers all agree
    # holds no contrast against it; here it does (issue 25).
    "dense_charged": RewardSpec(name="dense_charged", format_penalty=0.05, process_reward=0.1, process_cap=0.3,
                                idle_call_cost=0.1),
}


def get_reward_spec(spec: str | RewardSpec, **overrides: float | str) -> RewardSpec:
    """Look up a named spec (``paper``, ``dense``) or pass one through; keyword overrides replace fields."""
    if isinstance(spec, str):
        try:
            spec = REWARD_SPECS[spec]
        except KeyError:
            raise InvalidValue(f"unknown reward spec {spec!r}; choose one of {sorted(REWARD_SPECS)}") from None
    return replace(spec, **overrides) if overrides else spec
