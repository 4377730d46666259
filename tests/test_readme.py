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


def test_readme_openenv_serve_block_runs(tmp_path):
    """The bash block that serves an env and connects `RemoteEnv` to it, on a free port instead of 8001."""
    import os
    import signal
    import socket
    import subprocess
    import time

    import httpx

    block = next(b for b in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
                 if "agent-gym env serve" in b)
    serve, client = [line.strip() for line in block.splitlines() if line.strip()]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    serve, client = serve.removesuffix("&").replace("8001", port), client.replace("8001", port)
    server = subprocess.Popen(serve, shell=True, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and server.poll() is None, "the server did not come up"
                time.sleep(0.3)
        printed = subprocess.run(client, shell=True, capture_output=True, text=True, timeout=120, check=True).stdout
        assert printed.strip().endswith("?") and len(printed.strip()) > 10  # the question of the first task
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
