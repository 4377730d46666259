"""The OpenEnv server serves any env; RemoteEnv is a gymnasium.Env over it (check_env, rollouts, clear errors)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.adapters.openenv import RemoteEnv, RemoteEnvError
from agent_gym.adapters.openenv_server import create_env_app, env_server_config
from agent_gym.contract import check_tool_env_contract
from agent_gym.retrieval_index.service.server import bind_socket

SMALL = {"hops": 1, "num_pages": 200, "num_questions": 10}


def _factory() -> gym.Env:
    return gym.make("AgentR1-SynthHop-v0", **SMALL)


@contextmanager
def env_server(app: object) -> Iterator[str]:
    """Serve ``app`` as `agent-gym env serve` does (``env_server_config``) from a thread on a free loopback port;
    yield its URL."""
    import uvicorn

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(env_server_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 30 s"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextmanager
def served(factory=None, **settings) -> Iterator[str]:
    """Serve ``create_env_app`` over SynthHop (or ``factory``'s envs) as `env serve` does; yield its URL."""
    with env_server(create_env_app(factory or _factory, **settings)) as base:
        yield base


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(max_sessions=4) as base:
        yield base


def test_remote_env_passes_gymnasiums_env_checker_over_the_wire(url):
    env = RemoteEnv(url)
    with _no_warnings():
        check_env(env, skip_render_check=True)
    env.close()


def test_remote_env_passes_the_env_contract_checker_over_the_wire(url):
    env = RemoteEnv(url)
    check_tool_env_contract(env)
    env.close()


def _answering(env: RemoteEnv, info: dict) -> RemoteEnv:
    """``env`` whose server answers every request with an observation carrying ``info``."""
    env._request = lambda message: {"observation": {"text": "Q", "info": info, "terminated": False,
                                                    "truncated": False}, "reward": 0.0}
    return env


def test_a_server_whose_info_breaks_the_contract_is_a_clear_error(url):
    env = _answering(RemoteEnv(url), {"messages": []})
    with pytest.raises(RemoteEnvError, match="broke the env contract.*'messages'.* empty"):
        env.reset()


def test_a_server_that_gives_no_new_messages_gets_them_derived(url):
    messages = [{"role": "user", "content": "Q"}]
    env = _answering(RemoteEnv(url), {"messages": messages})
    _, info = env.reset()
    _answering(env, {"messages": [*messages, {"role": "assistant", "content": "A"}, {"role": "tool", "content": "R"}]})
    *_, step_info = env.step("A")
    assert info["new_messages"] == messages and step_info["new_messages"] == [{"role": "tool", "content": "R"}]


@contextmanager
def _no_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_a_remote_episode_plays_like_the_local_env(url):
    local, remote = _factory(), RemoteEnv(url)
    question, info = remote.reset(seed=0, options={"task_index": 2})
    assert question == local.reset(seed=0, options={"task_index": 2})[0] and info["messages"][1]["content"] == question
    task = local.unwrapped.task
    text, reward, terminated, truncated, info = remote.step(
        f'<tool_call>{{"name": "search", "arguments": {{"query": "{task.decomposition[0].query}"}}}}</tool_call>')
    assert task.answers[0] in text and not terminated and info["messages"][-1]["role"] == "tool"
    _, reward, terminated, _, info = remote.step(f"<answer>{task.answers[0]}</answer>")
    assert terminated and reward == 1.0 and info["reward_components"]["em"] == 1.0
    remote.close()
    remote.close()  # idempotent


def test_truncate_pays_what_the_server_env_pays(url):
    remote = RemoteEnv(url)
    remote.reset(options={"task_index": 0})
    reward, info = remote.truncate()
    assert reward == -1.0 and info["answer"] is None
    remote.close()


def test_our_trainers_rollout_collector_trains_against_a_remote_env(url, tiny_model):
    from agent_gym.trainers.backends import TransformersBackend
    from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig

    model, tokenizer = tiny_model
    collector = RolloutCollector([RemoteEnv(url)], TransformersBackend(model, tokenizer), tokenizer,
                                 RolloutConfig(max_new_tokens=8, max_turns=2, show_progress=False))
    trajectories = collector.collect([{"options": {"task_index": 0}}], group_size=2, seed=0)
    assert len(trajectories) == 2 and all(0 in t.loss_mask or t.num_turns == 1 for t in trajectories)
    assert all(t.episode.truncated_by in ("max_turns", "env", None) for t in trajectories)
    collector.close()


def test_our_trainer_takes_an_update_step_against_a_remote_env(url, tiny_model_copy, tmp_path):
    import torch

    from agent_gym.trainers.config import TrainConfig
    from agent_gym.trainers.metrics import read_metrics
    from agent_gym.trainers.trainer import Trainer

    model, tokenizer = tiny_model_copy
    before = [parameter.detach().clone() for parameter in model.parameters()]
    # PPO: its whitened GAE advantages are non-zero even when both episodes score the same.
    config = TrainConfig(model="tiny", env_id="unused", algo="ppo", group_size=2, tasks_per_step=1, total_steps=1,
                         micro_batch_size=4, max_new_tokens=8, max_turns=2, max_context_tokens=2000, eval_every=0,
                         output_dir=str(tmp_path), tensorboard=False, show_progress=False, device="cpu")
    trainer = Trainer(config, model=model, tokenizer=tokenizer, env_fns=[lambda: RemoteEnv(url)] * 2)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert [row["step"] for row in read_metrics(tmp_path)] == [1]
    assert any(not torch.equal(old, new) for old, new in zip(before, model.parameters(), strict=True))


def test_sft_learns_from_episodes_played_on_a_remote_env(url, tiny_model_copy):
    # SFT needs only the contract: a teacher that reads the observation plays the remote env, and the episodes'
    # info["messages"] become training rows with the loss on the teacher's own turns. (The registered scripted
    # teachers read env.unwrapped.task and say so on a RemoteEnv: test_eval_any_env.py.)
    from agent_gym.evaluation import iter_episodes
    from agent_gym.trainers.token_episode import tokenize_episode
    from agent_gym.warmstart.sft import SFTConfig, train_sft

    class AnswersAName:
        def act(self, observation: str, info: dict) -> str:
            return f"<answer>{re.findall(r'[A-Z][a-z]+', observation)[-1]}</answer>"

    env = RemoteEnv(url)
    try:
        episodes = list(iter_episodes(env, AnswersAName(), 4, keep_messages=True, progress=False))
    finally:
        env.close()
    assert all(any(m["role"] == "assistant" for m in episode.messages) for episode in episodes)
    model, tokenizer = tiny_model_copy
    examples = [tokenize_episode(tokenizer, episode.messages) for episode in episodes]
    assistant = [message["content"] for message in episodes[0].messages if message["role"] == "assistant"]
    assert tokenizer.decode([t for t, m in zip(examples[0].input_ids, examples[0].loss_mask, strict=True) if m],
                            skip_special_tokens=True).replace(" ", "") == "".join(assistant).replace(" ", "")
    losses = train_sft(model, tokenizer, examples,
                       SFTConfig(epochs=30, lr=3e-3, batch_size=4, max_length=1024), show_progress=False)
    assert losses[-1] < losses[0] / 2


def test_a_malformed_websocket_message_gets_an_error_and_the_session_goes_on(url):
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/ws") as socket:
        socket.send("{not json")
        assert json.loads(socket.recv(timeout=10))["data"]["code"] == "INVALID_JSON"
        socket.send(json.dumps({"type": "step", "data": {"txt": "x"}}))
        assert json.loads(socket.recv(timeout=10))["data"]["code"] == "VALIDATION_ERROR"
        socket.send(json.dumps({"type": "dance"}))
        assert json.loads(socket.recv(timeout=10))["data"]["code"] == "UNKNOWN_TYPE"
        socket.send(json.dumps({"type": "reset", "data": {"options": {"task_id": "no such task"}}}))
        assert "reset failed" in json.loads(socket.recv(timeout=10))["data"]["message"]
        socket.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(socket.recv(timeout=10))["type"] == "observation"


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("post", "/step", {"action": {"text": "x"}}, 409),
    ("post", "/reset", {"seed": "one"}, 422),
    ("post", "/reset", [1, 2], 422),
])
def test_malformed_http_requests_get_4xx_with_a_message(url, method, path, body, status):
    answer = getattr(httpx, method)(f"{url}{path}", json=body, timeout=10)
    assert answer.status_code == status and answer.json()["error"]


def test_http_reset_health_metadata_and_schema_answer(url):
    assert httpx.get(f"{url}/health").json()["status"] == "healthy"
    assert httpx.get(f"{url}/metadata").json()["action_max_length"] == _factory().action_space.max_length
    assert httpx.get(f"{url}/schema").json()["action"]["required"] == ["text"]
    reset = httpx.post(f"{url}/reset", json={"seed": 0, "options": {"task_index": 1}}).json()
    assert reset["done"] is False and reset["observation"]["text"].endswith("?")


def test_sessions_beyond_the_limit_are_refused_and_idle_sessions_are_closed():
    with served(max_sessions=1, idle_timeout_s=0.5) as base:
        first, second = RemoteEnv(base), RemoteEnv(base)
        first.reset(seed=0)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            second.reset(seed=0)
        time.sleep(1.0)
        with pytest.raises(RemoteEnvError, match="IDLE_TIMEOUT|closed the session"):
            first.step("<answer>x</answer>")
        first.reset(seed=0)  # a new session once the idle one is gone
        first.close()


def test_a_killed_server_gives_a_clear_error_not_a_hang(tmp_path):
    port_file = tmp_path / "port"
    code = ("import gymnasium as gym, uvicorn, agent_gym\n"
            "from agent_gym.adapters.openenv_server import create_env_app\n"
            "from agent_gym.retrieval_index.service.server import bind_socket\n"
            "sock = bind_socket('127.0.0.1', 0)\n"
            f"open({str(port_file)!r}, 'w').write(str(sock.getsockname()[1]))\n"
            f"app = create_env_app(lambda: gym.make('AgentR1-SynthHop-v0', **{SMALL!r}))\n"
            "uvicorn.Server(uvicorn.Config(app, log_level='warning')).run(sockets=[sock])\n")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                base = f"http://127.0.0.1:{int(port_file.read_text())}"
                httpx.get(f"{base}/health", timeout=1)
                break
            except (ValueError, OSError, httpx.HTTPError):
                time.sleep(0.2)
        env = RemoteEnv(base, timeout_s=10)
        env.reset(seed=0)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises(RemoteEnvError, match="closed the session|lost the env server|cannot open"):
            env.step("<answer>x</answer>")
        with pytest.raises(RemoteEnvError, match="cannot open a session"):
            env.reset(seed=0)
        assert time.monotonic() - started < 10
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_env_serve_refuses_an_unknown_env_id_with_a_usage_line(capsys):
    from agent_gym.cli import main

    assert main(["env", "serve", "NoSuchEnv-v0", "--port", "1"]) == 2
    assert "agent-gym env serve:" in capsys.readouterr().err


def test_agent_gym_eval_evaluates_a_model_on_a_served_env_by_id(url, tiny_model_dir_for_synthhop, tmp_path, capsys):
    from agent_gym.cli import main

    model = tiny_model_dir_for_synthhop
    code = main(["eval", "AgentGym-Remote-v0", "--model", str(model), "--episodes", "2", "--no-progress",
                 "--env-kwarg", f"base_url={url}", "--out", str(tmp_path / "eval.jsonl")])
    assert code == 0 and len((tmp_path / "eval.jsonl").read_text().splitlines()) == 2
    assert "| model base_url=" in capsys.readouterr().out


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_env_serve_refuses_a_port_out_of_range(port, capsys):
    from agent_gym.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["env", "serve", "AgentR1-Calculator-v0", "--port", port])
    assert exited.value.code == 2
    assert "a port is a number from 0 to 65535" in capsys.readouterr().err


def test_env_serve_on_a_busy_port_says_so_before_announcing_anything(capsys):
    import socket

    from agent_gym.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["env", "serve", "AgentR1-Calculator-v0", "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert "serving" not in out
    assert f"cannot listen on 127.0.0.1:{port}" in err and "pick another --port" in err
