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
env's process first checks it is a plain math expression (:mod:`agent_gym.envs.answer_gate`) and scores anything
else 0; where the scorer calls ``eval`` on it, that ``eval`` reads literals only.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
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

__all__ = ["make_math_env", "generate_math_tasks", "ReasoningGymChecker", "DEFAULT_FAMILIES", "MATH_INSTRUCTION"]

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


# The scorer's own `eval` (some families call it on the answer) reads literals only: an answer is data there.
_SCORER = r'''
import ast, json, os, sys
import reasoning_gym

spec = json.loads({spec!r})
dataset = reasoning_gym.create_dataset(spec["family"], **spec["config"])
entry = dataset[spec["index"]]
sys.modules[type(dataset).__module__].eval = ast.literal_eval
try:
    score, error = float(dataset.score_answer(spec["answer"], entry)), None
except Exception as caught:
    score, error = 0.0, f"{{type(caught).__name__}}: {{caught}}"[:300]
os.write(3, (json.dumps({{"kind": "score", "score": score, "error": error, "nonce": {nonce!r}}}) + "\n").encode())
'''


@dataclass(frozen=True)
class ReasoningGymChecker:
    """``checker(answer) -> CheckResult``: reasoning-gym's ``score_answer`` of the family for entry ``index``.

    Holds only the dataset's recipe (family, config, index), so it pickles; the entry is regenerated where it is
    scored. A ``score_answer`` that raises on a malformed answer scores 0, and so does an answer that a scorer
    which evaluates it would run as code (``details["scored_in"] == "refused"``).
    """

    family: str
    config_json: str
    index: int
    in_process: bool

    def __call__(self, answer: str) -> CheckResult:
        if self.in_process:
            dataset = _dataset(self.family, self.config_json)
            try:
                score, error = float(dataset.score_answer(answer, dataset[self.index])), None
            except Exception as caught:  # noqa: BLE001 - reasoning-gym raises on answers it cannot parse
                score, error = 0.0, f"{type(caught).__name__}: {caught}"[:300]
            return _verdict(score, error, "process")
        refusal = answer_gate.refusal(answer) if _parses_with_sympy(self.family) else None
        if refusal:
            return _verdict(0.0, refusal, "refused")
        nonce = secrets.token_hex(16)
        spec = {"family": self.family, "config": json.loads(self.config_json), "index": self.index,
                "answer": answer}
        run = Sandbox(SCORING_LIMITS, site_packages=True).run(_SCORER.format(spec=json.dumps(spec), nonce=nonce))
        records = [record for record in run.reports if record.get("kind") == "score" and record.get("nonce") == nonce]
        if not records:
            return _verdict(0.0, f"the scorer did not finish: {run.summary()}", "sandbox")
        return _verdict(records[-1].get("score"), records[-1].get("error"), "sandbox")


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
        answer = str(entry["answer"])
        result.append(Task(
            id=f"math-{split}-s{seed}-{len(result)}", question=question, answers=(answer,),
            decomposition=(Hop("Print the answer.", answer, f"print({answer!r})"),), kind=family,
            metadata={"family": family, "index": index},
            checker=ReasoningGymChecker(family, config_json, index, in_process),
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
