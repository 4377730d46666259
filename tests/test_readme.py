"""The README's code blocks are part of the public contract: they must run as printed."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_readme_custom_env_is_at_most_15_lines_and_runs():
    block = next(b for b in _python_blocks() if "register_tool_env" in b)
    code = re.sub(r'""".*?"""', '"""doc"""', block, flags=re.DOTALL)
    assert len([line for line in code.splitlines() if line.strip()]) <= 15
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    env = namespace["env"]
    env.reset(seed=0)
    observation, _, _, _, _ = env.step('<tool_call>{"name": "calculate", "arguments": '
                                       '{"expression": "1234 * 5678"}}</tool_call>')
    assert "7006652" in observation
    _, reward, terminated, _, _ = env.step("<answer>7006652</answer>")
    assert terminated and reward == 1.0
    env.close()
    gym.registry.pop("MyCalc-v0")


def test_readme_quick_start_runs():
    block = next(b for b in _python_blocks() if "AgentR1-SynthHop-v0" in b)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert "format" in namespace["info"]["reward_components"]


def _run_block(marker: str) -> dict:
    block = next(b for b in _python_blocks() if marker in b)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace


def test_readme_skyrl_snippet_runs():
    import pytest

    pytest.importorskip("skyrl_gym")
    output = _run_block("skyrl_gym.make")["output"]
    assert output["done"] is False and output["observations"][0]["role"] == "tool"


def test_readme_torchrl_snippet_runs():
    import pytest

    pytest.importorskip("torchrl")
    rollout = _run_block("make_torchrl_env")["rollout"]
    assert rollout["next", "terminated"].all()


def test_readme_maskable_ppo_snippet_runs():
    import pytest

    pytest.importorskip("sb3_contrib")
    assert _run_block("MaskablePPO")["model"].num_timesteps >= 128
