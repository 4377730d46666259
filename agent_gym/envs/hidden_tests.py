"""Hidden tests of a coding task, and the checker that runs a submitted solution against them in the sandbox.

A :class:`CodeProblem` holds a task's prompt, entry point, canonical solution and its tests split into
statements: each statement of the test code that asserts something is one test; the others are setup, run in
order. :class:`HiddenTestChecker` runs them with :class:`~agent_gym.tools.sandbox.Sandbox`, never in the env's
process, and never in the process that runs the agent's code: the solution runs in one sandbox
(:mod:`agent_gym.envs.harness`'s ``solution_server.py``), the tests in another (``test_runner.py``), and each
call of the function under test goes through a pipe as data. Only the test process reports results, on a pipe
the solution's process does not hold, and its directory (the tests) is unreadable from the solution's. The
env's outcome is pass@1 (every test passed), and ``info["check"]`` holds the per-test results and the fraction
that passed.

So a solution cannot forge its verdict: wrapping the harness's functions, writing records to a report pipe,
reading a nonce or the tests, exiting early (``sys.exit``, ``os._exit``: the remaining tests fail) or returning
an object whose ``__eq__`` always answers ``True`` (only built-in values cross: ``int``, ``float``,
``complex``, ``str``, ``bytes``, ``bool``, ``None``, and lists, tuples, sets and dicts of them) all fail. The
tests use the task's own helper functions (the code prompt's), never ones the solution redefines.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from agent_gym.envs import harness
from agent_gym.error import InvalidValue
from agent_gym.tasks import CheckResult
from agent_gym.tools.sandbox import Sandbox, SandboxLimits, SandboxRun

__all__ = ["CodeProblem", "HiddenTestChecker", "TestStatement", "extract_code", "run_hidden_tests",
           "split_check_function"]

CHECK_LIMITS = SandboxLimits(wall_s=20.0, cpu_s=10.0)
_TESTS_GRACE_S = 5.0
_SHOWN_FAILURES = 3
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class TestStatement:
    """One top-level statement of a task's test code: a test when it asserts something, else setup."""

    source: str
    is_test: bool


@dataclass(frozen=True)
class CodeProblem:
    """A coding task.

    Attributes:
        id: the dataset's task id (``HumanEval/0``).
        prompt: what the agent is asked.
        entry_point: the function the tests call.
        solution: a canonical solution, as a complete program.
        stub: the function with an empty body (what the weak ``stub`` policy submits).
        code_prompt: code run before the solution (HumanEval's prompt: its imports and helper functions);
            a solution without ``def entry_point`` is read as the body that completes it.
        test_setup: test-module code run before the tests (imports, helpers, constants).
        tests: the test statements, in order.
    """

    id: str
    prompt: str
    entry_point: str
    solution: str
    stub: str
    code_prompt: str = ""
    test_setup: str = ""
    tests: tuple[TestStatement, ...] = field(default_factory=tuple)

    @property
    def num_tests(self) -> int:
        return sum(statement.is_test for statement in self.tests)


def split_check_function(test_code: str, function: str = "check") -> tuple[str, list[TestStatement]]:
    """HumanEval's test code: (the module code outside ``def check``, the statements of ``check``'s body).

    A statement of the body is a test when it holds an ``assert`` whose condition is not a constant
    (``assert True, "..."`` checks nothing and is dropped).
    """
    module = ast.parse(test_code)
    setup, statements = [], []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for statement in node.body:
                if isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Constant):
                    continue
                statements.append(TestStatement(ast.unparse(statement), _asserts_something(statement)))
        else:
            setup.append(ast.unparse(node))
    if not any(statement.is_test for statement in statements):
        raise InvalidValue(f"the test code has no {function}() with assertions")
    return "\n".join(setup), statements


def _asserts_something(node: ast.AST) -> bool:
    return any(isinstance(inner, ast.Assert) and not isinstance(inner.test, ast.Constant) for inner in ast.walk(node))


def extract_code(answer: str) -> str:
    """The program in an answer: the first fenced block (```python ... ```) if there is one, else the text."""
    match = _FENCED.search(answer)
    return match.group(1) if match else answer


@dataclass(frozen=True)
class HiddenTestChecker:
    """``checker(answer) -> CheckResult``: runs the answer's program against the problem's hidden tests.

    ``score`` is pass@1 of this one sample: 1.0 when every test passed, else 0.0. ``details`` has
    ``tests_passed``, ``tests_total``, ``pass_fraction``, ``passed`` (per test), ``status`` and, for the first
    failures, their error messages. A module-level frozen dataclass, so envs holding it pickle.
    """

    problem: CodeProblem
    limits: SandboxLimits = CHECK_LIMITS

    def __call__(self, answer: str) -> CheckResult:
        tests_run, solution_run = run_hidden_tests(self.problem, extract_code(answer), self.limits)
        total = self.problem.num_tests
        passed = [False] * total
        failures: list[str] = []
        limited = [_LIMIT_STATUS[run.status] for run in (solution_run, tests_run) if run.status in _LIMIT_STATUS]
        status = limited[0] if limited else "failed"
        finished = False
        for record in tests_run.reports:  # the test process's own pipe: the solution never holds it
            kind = record.get("kind")
            index = record.get("index")
            if kind == "test" and type(index) is int and 0 <= index < total:
                passed[index] = record.get("passed") is True
                if not passed[index] and len(failures) < _SHOWN_FAILURES:
                    failures.append(f"test {index}: {record.get('error')}")
            elif kind in ("solution_error", "setup_error"):
                status = kind
                failures.append(str(record.get("error")))
            elif kind == "done":
                finished = True
        count = sum(passed)
        if finished and count == total:
            status = "passed"
        details: dict[str, Any] = {"status": status, "tests_passed": count, "tests_total": total,
                                   "pass_fraction": count / total if total else 0.0, "passed": passed,
                                   "failures": failures, "sandbox_status": tests_run.status,
                                   "solution_status": solution_run.status}
        return CheckResult(float(status == "passed"), details)


_LIMIT_STATUS = {"timeout": "timeout", "cpu_limit": "timeout", "memory": "memory"}


def run_hidden_tests(problem: CodeProblem, solution: str, limits: SandboxLimits) -> tuple[SandboxRun, SandboxRun]:
    """Run the tests and the solution in two sandboxes joined by two pipes; returns (tests' run, solution's run).

    The tests' sandbox holds the tests and the only report pipe that counts; the solution's holds the solution,
    the code prompt and the test setup (for the classes of arguments), never the tests. The tests' process
    waits a little longer, so that it reports a solution stopped at its limits rather than being stopped itself.
    """
    codec = harness.source("codec.py")
    solution_files = {"codec.py": codec, "solution.json": json.dumps({
        "solution": solution, "code_prompt": problem.code_prompt, "entry_point": problem.entry_point,
        "test_setup": problem.test_setup})}
    test_files = {"codec.py": codec, "tests.json": json.dumps({
        "code_prompt": problem.code_prompt, "entry_point": problem.entry_point, "test_setup": problem.test_setup,
        "tests": [(test.source, test.is_test) for test in problem.tests]})}
    tests_limits = dataclasses.replace(limits, wall_s=limits.wall_s + _TESTS_GRACE_S)
    calls_read, calls_write = os.pipe()
    answers_read, answers_write = os.pipe()
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="hidden-tests") as pool:
        solution_run = pool.submit(Sandbox(limits).run, harness.source("solution_server.py"), files=solution_files,
                                   channels={4: calls_read, 5: answers_write})
        tests_run = pool.submit(Sandbox(tests_limits).run, harness.source("test_runner.py"), files=test_files,
                                channels={4: answers_read, 5: calls_write})
        return tests_run.result(), solution_run.result()
