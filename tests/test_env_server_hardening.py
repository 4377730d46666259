"""The env server (`agent-gym env serve`) against hostile and careless clients, and a failed first reset
(issue 27, A6 and A7). Every test talks to 127.0.0.1 only, with a handful of sockets and short deadlines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import gymnasium as gym
import httpx
import pytest
from test_adapter_openenv import SMALL, _factory, served
from websockets.sync.client import connect

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.adapters.openenv import RemoteEnv, RemoteEnvError


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` seconds (reading whatever it sends first)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            return False
        except OSError:  # reset by the server
            return True
    return False


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


# ------------------------------------------------------------------------------------------ slow and idle clients


def test_a_request_head_that_does_not_arrive_in_time_is_cut():
    with served(request_timeout_s=0.5) as url:
        silent = [socket.create_connection(_address(url)) for _ in range(3)]
        trickling = [socket.create_connection(_address(url)) for _ in range(3)]
        for sock in trickling:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for _ in range(8):  # a byte every 0.1 s: each resets a keep-alive timer, never the head deadline
            for sock in trickling:
                try:
                    sock.sendall(b"X")
                except OSError:
                    pass
            time.sleep(0.1)
        assert all(_closed_by_server(sock, within_s=3.0) for sock in silent + trickling)
        assert time.monotonic() - started < 4.0
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        for sock in silent + trickling:
            sock.close()


def test_idle_connections_past_the_cap_are_closed_oldest_first():
    with served(max_idle_connections=4) as url:
        idle = []
        for _ in range(10):
            idle.append(socket.create_connection(_address(url)))
            time.sleep(0.02)  # accepted in this order
        assert httpx.get(f"{url}/health", timeout=5).json()["status"] == "healthy"
        closed = [_closed_by_server(sock, within_s=0.5) for sock in idle]
        assert all(closed[:6]) and closed.count(False) <= 4
        for sock in idle:
            sock.close()


def test_a_flood_of_idle_sockets_past_the_descriptor_limit_does_not_starve_health(tmp_path):
    # Before: 1,100 idle sockets under a 1,024-descriptor limit failed every health check (accept() had no
    # descriptor left). Here, 300 idle sockets against a server limited to 256 descriptors, on its defaults.
    port_file = tmp_path / "port"
    code = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
            "import gymnasium as gym, uvicorn, agent_gym\n"
            "from agent_gym.adapters.openenv_server import create_env_app, env_server_config\n"
            "from agent_gym.retrieval_index.service.server import bind_socket\n"
            "sock = bind_socket('127.0.0.1', 0)\n"
            f"open({str(port_file)!r}, 'w').write(str(sock.getsockname()[1]))\n"
            "app = create_env_app(lambda: gym.make('AgentR1-Calculator-v0'))\n"
            "uvicorn.Server(env_server_config(app)).run(sockets=[sock])\n")
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.getcwd()})
    idle: list[socket.socket] = []
    try:
        url = _wait_for_server(port_file, process)
        for _ in range(300):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.connect(_address(url))
            except BlockingIOError:
                pass
            idle.append(sock)
        time.sleep(1.0)
        answers = [httpx.get(f"{url}/health", timeout=5).status_code for _ in range(3)]
        assert answers == [200, 200, 200]
    finally:
        for sock in idle:
            sock.close()
        process.kill()
        process.wait(timeout=10)


def _wait_for_server(port_file, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
            httpx.get(f"{url}/health", timeout=1)
            return url
        except (ValueError, OSError, httpx.HTTPError):
            time.sleep(0.2)
    raise AssertionError("the env server did not start within 60 s")


def test_a_websocket_session_outlives_the_request_head_deadline():
    # The head deadline is for HTTP requests: a session's transport must not be closed under it.
    with served(request_timeout_s=0.3) as url:
        env = RemoteEnv(url)
        env.reset(seed=0)
        time.sleep(1.0)
        *_, info = env.step("<answer>x</answer>")
        assert info["turn"] == 1
        env.close()


# ------------------------------------------------------------------------------------------ bodies


def test_a_body_over_the_limit_gets_413_before_it_is_read():
    with served(max_body_bytes=1024) as url:
        with socket.create_connection(_address(url)) as sock:  # announces 1 GB and sends none of it
            sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n{")
            sock.settimeout(5)  # the answer cannot wait for the body
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the limit of 1024 bytes" in answer

        def chunks():
            for _ in range(64):
                yield b" " * 1024

        answer = httpx.post(f"{url}/reset", content=chunks(), timeout=10)  # chunked: no length
        assert answer.status_code == 413 and answer.json()["error"]
        assert httpx.post(f"{url}/reset", json={"seed": 0}, timeout=10).status_code == 200


def test_a_body_that_trickles_in_gets_408():
    with served(request_timeout_s=0.5) as url, socket.create_connection(_address(url)) as sock:
        sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
        for _ in range(10):
            try:
                sock.sendall(b" ")
            except OSError:
                break
            time.sleep(0.1)
        sock.settimeout(5)
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer


# ------------------------------------------------------------------------------------------ malformed requests


@pytest.mark.parametrize("body", [
    json.dumps({"seed": -1}),
    json.dumps({"seed": 1.5}),
    "[" * 30_000 + "]" * 30_000,  # too deep for json to parse, under the body limit
    json.dumps({"seed": 0, "options": {"task_id": [[[[[[[[[[[]]]]]]]]]]]}}),
    json.dumps({"seed": 0, "options": {"bogus": 1}}),
    '{"seed": ' + "9" * 5000 + "}",  # more digits than Python parses
    b"\xff\xfe",
], ids=["seed -1", "seed 1.5", "too deep", "deep option", "unknown option", "5000 digits", "not UTF-8"])
def test_bad_seeds_and_bodies_over_http_get_a_4xx_json_error(url_for_module, body):
    answer = httpx.post(f"{url_for_module}/reset", content=body, timeout=10)
    assert 400 <= answer.status_code < 500 and answer.json()["error"]


@pytest.fixture(scope="module")
def url_for_module():
    with served(max_sessions=4) as base:
        yield base


@pytest.mark.parametrize("message", [
    "[" * 30_000 + "]" * 30_000,
    json.dumps({"type": "reset", "data": {"seed": -1}}),
    json.dumps({"type": "reset", "data": {"seed": 0, "options": "x" * 10}}),
    json.dumps({"type": "reset", "data": {"options": {"task_id": [[[[[[[[[[]]]]]]]]]]}}}),
    json.dumps({"type": "reset", "data": {"options": {"bogus": 1}}}),
    json.dumps({"type": "reset", "data": None}),
    b"\x00\x01binary",
    "\"just a string\"",
], ids=["too deep", "seed -1", "options not an object", "deep option", "unknown option", "data null", "binary",
        "not an object"])
def test_a_bad_websocket_message_is_answered_and_the_session_goes_on(url_for_module, message):
    with connect(_ws(url_for_module), max_size=None) as ws:
        ws.send(message)
        answer = json.loads(ws.recv(timeout=10))
        assert answer["type"] == "error" and answer["data"]["message"]
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>x</answer>"}}))
        assert json.loads(ws.recv(timeout=10))["data"]["done"] is True


# ------------------------------------------------------------------------------------------ oversized turns


@pytest.mark.parametrize("turn", [
    "<answer>" + "é" * 200_000 + "</answer>",  # 1.2 MB escaped: over the server's 64 KiB limit
    "\x00" * 100_000 + "<answer>x</answer>",  # 600 KB escaped, of which the env reads 17 characters
], ids=["over the action limit", "NULs the env drops"])
def test_a_turn_over_the_message_limit_gets_the_answer_a_local_env_gives(turn):
    local = _factory()
    local.reset(seed=0)
    _, local_reward, local_terminated, local_truncated, local_info = local.step(turn)
    with served(max_message_bytes=64 * 1024) as url:
        remote = RemoteEnv(url)
        assert remote.max_message_bytes == 64 * 1024
        remote.reset(seed=0)
        _, reward, terminated, truncated, info = remote.step(turn)  # raised: the server closed the session
        assert (reward, terminated, truncated) == (local_reward, local_terminated, local_truncated)
        assert [error.split(";")[1:] for error in info["format_errors"]] == \
            [error.split(";")[1:] for error in local_info["format_errors"]]  # "the limit is ...", or none
        if not terminated:
            *_, info = remote.step("<answer>x</answer>")  # the session goes on
            assert info["turn"] == 2
        remote.close()


def test_a_message_the_server_cannot_take_is_a_clear_error_not_a_lost_session():
    with served(max_message_bytes=1024) as url:
        remote = RemoteEnv(url)
        with pytest.raises(RemoteEnvError, match="exceeds the env server's limit of 1024 bytes"):
            remote.reset(seed=0, options={"task_id": "x" * 2000})
        remote.reset(seed=0)
        remote.close()


# ------------------------------------------------------------------------------------------ a failed first reset


@pytest.mark.parametrize("bad_reset", [{"options": {"bogus": 1}}, {"seed": -1}, {"options": {"task_id": "nope"}}])
def test_a_failed_first_reset_leaves_gym_make_envs_steppable(bad_reset):
    env = gym.make("AgentR1-SynthHop-v0", **SMALL)
    with pytest.raises((ValueError, KeyError, gym.error.Error)):
        env.reset(**bad_reset)
    env.reset(seed=0)
    _, _, terminated, _, info = env.step("<answer>x</answer>")  # raised TypeError from Gymnasium's checker
    assert terminated and info["turn"] == 1
    env.reset(seed=1)
    assert env.step("<answer>x</answer>")[2]


def test_a_refused_reset_leaves_the_env_and_its_rng_as_they_were():
    env = gym.make("AgentR1-SynthHop-v0", **SMALL)
    env.reset(seed=0)
    task, state = env.unwrapped.task, env.unwrapped.np_random.bit_generator.state
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(seed=123, options={"bogus": 1})
    assert env.unwrapped.task is task and env.unwrapped.np_random.bit_generator.state == state


def test_a_failed_first_reset_leaves_a_remote_session_steppable(url_for_module):
    with connect(_ws(url_for_module)) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"options": {"bogus": 1}}}))
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "EXECUTION_ERROR"
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>x</answer>"}}))
        assert json.loads(ws.recv(timeout=10))["data"]["done"] is True
    env = gym.make("AgentGym-Remote-v0", base_url=url_for_module)  # RemoteEnv under gym.make's checker
    with pytest.raises(RemoteEnvError, match="unknown reset option"):
        env.reset(options={"bogus": 1})
    env.reset(seed=0)
    assert env.step("<answer>x</answer>")[2]
    env.close()
