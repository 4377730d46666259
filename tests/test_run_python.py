"""The run_python tool: a program's outcome as an observation, batches in parallel, progress for the env."""

from __future__ import annotations

import json
import pickle

import pytest

from agent_gym import Task, ToolEnv
from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, SandboxLimits

LIMITS = SandboxLimits(wall_s=4.0, cpu_s=2.0, memory_mb=512)


def call(code: str) -> str:
    return '<tool_call>' + json.dumps({"name": "run_python", "arguments": {"code": code}}) + '</tool_call>'


def test_a_call_returns_the_status_line_and_the_output() -> None:
    result = PythonTool(Sandbox(LIMITS)).call({"code": "print(2 ** 10)"})
    assert result.ok and result.text == "[status] finished (exit code 0)\n[stdout]\n1024"
    assert result.metadata["status"] == "ok" and "progress" not in result.metadata


def test_a_failing_program_is_a_successful_call_that_shows_the_error() -> None:
    result = PythonTool(Sandbox(LIMITS)).call({"code": "int('x')"})
    assert result.ok and "raised ValueError" in result.text and "invalid literal" in result.text


def test_a_program_over_the_length_limit_is_refused_before_it_runs() -> None:
    tool = PythonTool(Sandbox(SandboxLimits(code_chars=10)))
    result = tool.call({"code": "print('far too long')"})
    assert not result.ok and "the limit is 10" in result.text


def test_a_batch_runs_on_several_workers_and_keeps_the_order() -> None:
    tool = PythonTool(Sandbox(LIMITS), workers=2)
    results = tool.call_batch([{"code": f"print({n})"} for n in range(5)])
    assert [result.text.splitlines()[-1] for result in results] == ["0", "1", "2", "3", "4"]


def test_the_tool_pickles_for_async_vector_envs() -> None:
    tool = pickle.loads(pickle.dumps(PythonTool(Sandbox(LIMITS), workers=3, count_asserts=True)))
    assert (tool.workers, tool.count_asserts, tool.sandbox.limits) == (3, True, LIMITS)


def test_progress_counts_the_passing_asserts_and_the_dense_reward_pays_only_new_ones() -> None:
    tool = PythonTool(Sandbox(LIMITS), count_asserts=True)
    task = Task(id="t", question="Write add.", answers=("x",), checker=lambda answer: 0.0)
    env = ToolEnv([task], [tool], reward="dense")
    env.reset(seed=0)
    define = "def add(a, b):\n    return a + b\n"
    _, first, *_ = env.step(call(define + "assert add(1, 2) == 3\nassert True"))
    _, again, *_ = env.step(call(define + "assert add(1, 2) == 3"))
    _, more, _, _, info = env.step(call(define + "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(0, 0) == 0"))
    assert (first, again, more) == pytest.approx((0.1, 0.0, 0.2))
    assert info["reward_components"]["process"] == pytest.approx(0.2)
