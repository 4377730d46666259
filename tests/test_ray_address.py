"""`--ray-address`: a driver joins a cluster that `ray start` began, with a token (Ray then turns token
authentication on) and without one, and runs env workers there; a wrong address is a clear `RayClusterError`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="env workers need Ray: pip install 'agent-gym[distributed]'")

# The driver runs in a fresh interpreter: Ray reads RAY_AUTH_MODE when it is imported, and connect_ray must set
# it before that, as it would in `agent-gym train --ray-address`.
DRIVER = """
import functools, json, os, sys
import gymnasium as gym
from agent_gym.distributed import RayEnvPool, connect_ray

ray = connect_ray(sys.argv[1])
make = functools.partial(gym.make, "AgentR1-Calculator-v0")
with RayEnvPool([make, make], num_workers=2, num_cpus=0.1) as pool:
    results = pool.reset_batch([0, 1], [{"seed": 0}, {"seed": 1}])
    step = pool.step_batch([0], ["<answer>0</answer>"])[0]
print(json.dumps({"auth_mode": os.environ.get("RAY_AUTH_MODE"), "resets": len(results),
                  "observation": isinstance(results[0][0], str), "terminated": bool(step[2]),
                  "nodes": len(ray.nodes())}))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ray_cli() -> str:
    return shutil.which("ray") or str(Path(sys.executable).with_name("ray"))


def _clean_env(home: str) -> dict[str, str]:
    """No RAY_* settings, and a HOME of the test's own, so that a ~/.ray/auth_token left by an earlier local
    cluster cannot decide the case."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env["HOME"] = home
    return env


@pytest.fixture(scope="module", params=["token", "no token"])
def ray_head(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str], str | None]]:
    """A one-node cluster from `ray start --head` on loopback, with RAY_AUTH_MODE unset: where a token exists
    (here in RAY_AUTH_TOKEN_PATH) Ray turns token authentication on, and off otherwise."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = _clean_env(temp_dir)
    if request.param == "token":
        token_path = Path(temp_dir, "cluster_token")
        token_path.write_text("0123456789abcdef" * 4)
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    start = subprocess.run(
        [_ray_cli(), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
         "--object-store-memory=100000000", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp_dir}"],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    if start.returncode != 0:
        pytest.fail(f"ray start failed: {start.stderr[-2000:]}")
    try:
        yield f"127.0.0.1:{port}", env, "token" if request.param == "token" else None
    finally:
        subprocess.run([_ray_cli(), "stop", "--force"], env=env, capture_output=True, timeout=120, check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_driver_joins_a_ray_start_cluster_and_runs_env_workers(
    ray_head: tuple[str, dict[str, str], str | None],
) -> None:
    address, env, auth_mode = ray_head
    driver = subprocess.run([sys.executable, "-c", DRIVER, address], env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert driver.returncode == 0, driver.stderr[-3000:]
    report = json.loads(driver.stdout.strip().splitlines()[-1])
    assert report == {"auth_mode": auth_mode, "resets": 2, "observation": True, "terminated": True, "nodes": 1}


def test_a_wrong_address_is_a_clear_ray_cluster_error() -> None:
    code = ("from agent_gym.distributed import RayClusterError, connect_ray\n"
            "try:\n    connect_ray('127.0.0.1:1')\nexcept RayClusterError as error:\n    print('clear:', error)\n")
    driver = subprocess.run([sys.executable, "-c", code], env=_clean_env(tempfile.gettempdir()), capture_output=True,
                            text=True, timeout=60, check=False)
    assert driver.returncode == 0, driver.stderr[-3000:]
    assert "clear: cannot connect to the Ray cluster at 127.0.0.1:1" in driver.stdout
