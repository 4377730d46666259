"""``AgentR1-Math-v0``: procedural math tasks from reasoning-gym, scored by reasoning-gym's own checkers.

``tasks=`` picks the families (a list of names, or a dict of name -> the family's config settings); the env
draws ``size`` questions, one family after the other. The agent has ``run_python`` (sandboxed, with the
installed packages such as sympy) and ``calculate``. The outcome is reasoning-gym's ``score_answer`` for the
family, so its partial credit is reasoning-gym's, not ours (paid as ``em`` in [0, 1]).

Splits are held out by seed: ``train`` and ``test`` draw from different seeds of each family, and a question
that both could draw goes to one of them only (a stable hash of its text decides), so they never share one.

Scoring runs in the env's process only for families that keep reasoning-gym's base ``score_answer`` (a string
comparison). Families that override it may parse the answer with code that evaluates it (sympy's
``parse_expr`` does, in ``countdown`` and ``polynomial_multiplication``), so their answers are scored in the
sandbox, at about 2 s a score (the import of reasoning-gym). The answer reaches that scorer only as data, so no
code of the agent's runs in the process that reports the score: where the scorer parses it with sympy, the
env's process first checks it is a plain math expression of bounded size (:mod:`agent_gym.envs.answer_gate`:
``9**9**9**9`` or ``factorial(10**9)`` would cost the scorer its whole CPU limit) and scores anything else 0;
where the scorer calls ``eval``, that ``eval`` reads literals and arithmetic on numbers only, with every
result's size bounded (reasoning-gym's ``bitwise_arithmetic`` evaluates its own question that way).

The checker holds the entry it scores against, generated once where the tasks are drawn: some families'
generation depends on Python's per-process hash seed (``polynomial_multiplication`` iterates a set of
monomials), so the same dataset index regenerated in another process (the scoring sandbox, a vector env's
worker) can be another question.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import json
import math
import pickle
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.envs import answer_gate
from agent_gym.error import InvalidValue
from agent_gym.tasks import CheckResult, Hop, Task, TaskSet, in_test_split
from agent_gym.tools.calculator import calculate
from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, SandboxLimits
from agent_gym.validation import require_int

__all__ = ["make_math_env", "generate_math_tasks", "ReasoningGymChecker", "score_in_sandbox", "DEFAULT_FAMILIES",
           "MATH_INSTRUCTION"]

DEFAULT_FAMILIES = ("basic_arithmetic", "chain_sum", "gsm_symbolic", "gcd", "lcm", "fraction_simplification",
                    "prime_factorization", "simple_equations")
SPLITS = ("train", "test")
TEST_FRACTION = 0.2
_DRAWS_PER_QUESTION = 20  # a family whose question space is too small for `size` fails after this many draws
SCORING_LIMITS = SandboxLimits(wall_s=60.0, cpu_s=30.0, memory_mb=2048)
MATH_INSTRUCTION = (
    "Solve the problem. You can compute with the calculate tool or run Python (with sympy) with run_python. "
    "Give only the final answer, in the form the problem asks for, within <answer></answer> tags."
)


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError("AgentR1-Math-v0 needs reasoning-gym: pip install 'agent-gym[math]'") from error
    return reasoning_gym


@functools.lru_cache(maxsize=64)
def _dataset(family: str, config_json: str) -> Any:
    return _reasoning_gym().create_dataset(family, **json.loads(config_json))


def _scores_in_process(family: str) -> bool:
    """True when the family keeps the base ``score_answer`` (a string comparison that runs no answer text)."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS

    return DATASETS[family][0].score_answer is ProceduralDataset.score_answer


@functools.cache
def _parses_with_sympy(family: str) -> bool:
    """Whether the family's scorer runs sympy's parser (``eval`` inside) on the answer; True where its source
    cannot be read."""
    from reasoning_gym.factory import DATASETS

    try:
        source = inspect.getsource(DATASETS[family][0].score_answer)
    except (OSError, TypeError):
        return True
    return re.search(r"\b(parse_expr|sympify|simplify|S)\(", source) is not None


# The scorer's own `eval` (some families call it on the answer, bitwise_arithmetic on its question) reads
# literals and arithmetic on numbers only, each result at most _MAX_BITS bits: an answer is data there.
_SCORER = r'''
import ast, base64, json, math, operator, os, pickle, sys
import reasoning_gym

_MAX_BITS = 100_000
_NUMBERS = (int, float, complex)
_BINARY = {{ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}}
_UNARY = {{ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert, ast.Not: operator.not_}}


def _bits(value):
    return abs(value).bit_length() if isinstance(value, int) else 0


def _value(node):
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (*_NUMBERS, bool, str, bytes)):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_value(item) for item in node.elts]
        return {{ast.List: list, ast.Tuple: tuple, ast.Set: set}}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {{_value(key): _value(item) for key, item in zip(node.keys, node.values)}}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = _value(node.operand)
        if isinstance(operand, _NUMBERS):
            return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, _NUMBERS) and isinstance(right, _NUMBERS):
            if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                    and right * math.log2(abs(left)) > _MAX_BITS:
                raise ValueError("a power beyond the size limit")
            if isinstance(node.op, ast.LShift) and isinstance(right, int) and right + _bits(left) > _MAX_BITS:
                raise ValueError("a shift beyond the size limit")
            result = _BINARY[type(node.op)](left, right)
            if _bits(result) > _MAX_BITS:
                raise ValueError("a result beyond the size limit")
            return result
    raise ValueError("eval here reads literals and arithmetic on numbers only")


def _arithmetic_eval(source, *_namespaces):
    if not isinstance(source, str):
        raise TypeError("eval here reads text only")
    return _value(ast.parse(source.strip(), mode="eval").body)


with open("spec.json", encoding="utf-8") as handle:
    items = json.load(handle)
datasets = {{}}
for position, item in enumerate(items):
    try:
        key = (item["family"], json.dumps(item["config"], sort_keys=True))
        if key not in datasets:
            datasets[key] = reasoning_gym.create_dataset(item["family"], **item["config"])
        dataset = datasets[key]
        entry = pickle.loads(base64.b64decode(item["entry"]))
        sys.modules[type(dataset).__module__].eval = _arithmetic_eval
        score, error = float(dataset.score_answer(item["answer"], entry)), None
    except Exception as caught:
        score, error = 0.0, f"{{type(caught).__name__}}: {{caught}}"[:300]
    record = {{"kind": "score", "position": position, "score": score, "error": error, "nonce": {nonce!r}}}
    os.write(3, (json.dumps(record) + "\n").encode())
'''


@dataclass(frozen=True)
class ReasoningGymChecker:
    """``checker(answer) -> CheckResult``: reasoning-gym's ``score_answer`` of the family for entry ``index``.

    Holds the dataset's recipe (family, config, index) and the entry itself, pickled, as generated where the
    tasks were drawn: regenerating it elsewhere can give another question (see the module's docstring). A
    ``score_answer`` that raises on a malformed answer scores 0, and so does an answer that a scorer which
    evaluates it would run as code, or whose value is too large to compute (``details["scored_in"] ==
    "refused"``).
    """

    family: str
    config_json: str
    index: int
    in_process: bool
    entry_pickle: bytes = b""

    def _entry(self) -> Any:
        if self.entry_pickle:
            return pickle.loads(self.entry_pickle)  # pickled by generate_math_tasks, never by the agent
        return _dataset(self.family, self.config_json)[self.index]

    def __call__(self, answer: str) -> CheckResult:
        if self.in_process:
            dataset = _dataset(self.family, self.config_json)
            try:
                score, error = float(dataset.score_answer(answer, self._entry())), None
            except Exception as caught:  # noqa: BLE001 - reasoning-gym raises on answers it cannot parse
                score, error = 0.0, f"{type(caught).__name__}: {caught}"[:300]
            return _verdict(score, error, "process")
        return score_in_sandbox([(self, answer)])[0]


def score_in_sandbox(pairs: Sequence[tuple[ReasoningGymChecker, str]],
                     limits: SandboxLimits = SCORING_LIMITS) -> list[CheckResult]:
    """Score each (checker, answer) with reasoning-gym's scorer in one sandbox run (one import of reasoning-gym),
    whatever the checker's ``in_process``; an answer the gate refuses scores 0 without reaching it."""
    verdicts: list[CheckResult | None] = [None] * len(pairs)
    items, positions = [], []
    for position, (checker, answer) in enumerate(pairs):
        refusal = answer_gate.refusal(answer) if _parses_with_sympy(checker.family) else None
        if refusal:
            verdicts[position] = _verdict(0.0, refusal, "refused")
            continue
        entry = checker.entry_pickle or pickle.dumps(checker._entry())
        items.append({"family": checker.family, "config": json.loads(checker.config_json),
                      "entry": base64.b64encode(entry).decode("ascii"), "answer": answer})
        positions.append(position)
    if items:
        nonce = secrets.token_hex(16)
        run = Sandbox(limits, site_packages=True).run(_SCORER.format(nonce=nonce),
                                                       files={"spec.json": json.dumps(items)})
        records = {record["position"]: record for record in run.reports if record.get("kind") == "score"
                   and record.get("nonce") == nonce and type(record.get("position")) is int}
        for index, position in enumerate(positions):
            record = records.get(index)
            verdicts[position] = (_verdict(record.get("score"), record.get("error"), "sandbox") if record else
                                  _verdict(0.0, f"the scorer did not finish: {run.summary()}", "sandbox"))
    return [verdict for verdict in verdicts if verdict is not None]


def _verdict(score: Any, error: str | None, scored_in: str) -> CheckResult:
    value = float(score) if isinstance(score, int | float) and math.isfinite(score) else 0.0
    return CheckResult(min(max(value, 0.0), 1.0), {"score": value, "error": error, "scored_in": scored_in})


def _families(tasks: Sequence[str] | Mapping[str, Mapping[str, Any]] | str) -> dict[str, dict[str, Any]]:
    if isinstance(tasks, str):
        tasks = [tasks]
    families = {name: dict(config) for name, config in tasks.items()} if isinstance(tasks, Mapping) else {
        name: {} for name in tasks}
    if not families:
        raise InvalidValue("tasks must name at least one reasoning-gym family, e.g. tasks=['basic_arithmetic']")
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    unknown = [name for name in families if name not in DATASETS]
    if unknown:
        raise InvalidValue(f"unknown reasoning-gym famil{'y' if len(unknown) == 1 else 'ies'} "
                           f"{', '.join(map(repr, unknown))}; choose from {', '.join(sorted(DATASETS))}")
    return families


def _family_seed(family: str, seed: int, split: str) -> int:
    """Each (family, seed, split) draws from its own seed, the same on every machine."""
    return int.from_bytes(hashlib.sha256(f"{family}|{seed}|{split}".encode()).digest()[:4], "big")


def generate_math_tasks(tasks: Sequence[str] | Mapping[str, Mapping[str, Any]] | str = DEFAULT_FAMILIES, *,
                        size: int = 500, seed: int = 0, split: str = "train") -> list[Task]:
    """``size`` distinct questions, one family after the other; train and test never share a question."""
    if split not in SPLITS:
        raise InvalidValue(f"split must be one of {SPLITS}, got {split!r}")
    size = require_int("size", size)
    _reasoning_gym()
    families = _families(tasks)
    draws = size * _DRAWS_PER_QUESTION
    sources = []
    for family, settings in families.items():
        config = {**settings, "seed": _family_seed(family, seed, split), "size": draws}
        config_json = json.dumps(config, sort_keys=True)
        try:
            dataset = _dataset(family, config_json)
        except (TypeError, ValueError, AssertionError) as error:
            raise InvalidValue(f"reasoning-gym refused the settings of {family!r} ({settings}): {error}") from error
        sources.append((family, config_json, dataset, _scores_in_process(family)))
    want_test = split == "test"
    next_index = [0] * len(sources)
    seen: set[str] = set()
    result: list[Task] = []
    while len(result) < size:
        slot = len(result) % len(sources)
        family, config_json, dataset, in_process = sources[slot]
        while True:
            index = next_index[slot]
            next_index[slot] += 1
            if index >= draws:
                raise InvalidValue(f"reasoning-gym family {family!r} gave too few distinct {split} questions for "
                                   f"size={size}; ask for fewer, or widen the family's settings")
            entry = dataset[index]
            question = str(entry["question"])
            if question not in seen and in_test_split(question, TEST_FRACTION) == want_test:
                break
        seen.add(question)
        if entry.get("answer") is None:
            raise InvalidValue(f"reasoning-gym family {family!r} gives no reference answer (its scorer checks a "
                               "solution some other way), so the math env cannot score it; choose another family")
        answer = str(entry["answer"])
        result.append(Task(
            id=f"math-{split}-s{seed}-{len(result)}", question=question, answers=(answer,),
            decomposition=(Hop("Print the answer.", answer, f"print({answer!r})"),), kind=family,
            metadata={"family": family, "index": index},
            checker=ReasoningGymChecker(family, config_json, index, in_process, pickle.dumps(entry)),
        ))
    return result


@functools.lru_cache(maxsize=8)
def _task_set(families_json: str, size: int, seed: int, split: str) -> TaskSet:
    tasks = generate_math_tasks(json.loads(families_json), size=size, seed=seed, split=split)
    return TaskSet(tasks, name=f"reasoning-gym(seed={seed}, split={split})")


def make_math_env(*, tasks: Sequence[str] | Mapping[str, Mapping[str, Any]] | str = DEFAULT_FAMILIES,
                  size: int = 500, seed: int = 0, split: str = "train",
                  sandbox_limits: SandboxLimits | dict | None = None, **env_kwargs: Any) -> ToolEnv:
    """Build a reasoning-gym math env.

    Args:
        tasks: reasoning-gym family names, or a dict of name -> that family's config settings.
        size: questions in the env, drawn one family after the other.
        seed: seeds the draw; ``train`` and ``test`` are disjoint for every seed.
        split: ``train`` or ``test``.
        sandbox_limits: limits of the agent's ``run_python`` calls.
        env_kwargs: :class:`~agent_gym.env.ToolEnv` settings.
    """
    families = _families(tasks if isinstance(tasks, str | Mapping) else list(tasks))
    task_set = _task_set(json.dumps(families, sort_keys=True), require_int("size", size), seed, split)
    if isinstance(sandbox_limits, dict):
        sandbox_limits = SandboxLimits(**sandbox_limits)
    tools = [PythonTool(Sandbox(sandbox_limits, site_packages=True)), calculate]
    env_kwargs.setdefault("instruction", MATH_INSTRUCTION)
    env_kwargs.setdefault("max_turns", 6)
    return ToolEnv(task_set, tools, **env_kwargs)
