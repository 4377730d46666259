"""Env workers on Ray: the collector drives a `RayEnvPool` as it drives in-process envs, and survives workers
that die or hang (on a local Ray cluster)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="env workers need Ray: pip install 'agent-gym[distributed]'")

import conftest  # noqa: E402
from conftest import FACT_TASKS, FactLookup  # noqa: E402
from support.backends import ScriptedBackend  # noqa: E402

from agent_gym.distributed import EnvPoolError, RayEnvPool, connect_ray  # noqa: E402
from agent_gym.env import ToolEnv  # noqa: E402
from agent_gym.env_batch import EnvLost  # noqa: E402
from agent_gym.tools import ToolResult  # noqa: E402
from agent_gym.trainers.backends import TransformersBackend  # noqa: E402
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig, RolloutError  # noqa: E402

# Ray's workers cannot import pytest's test modules: ship this module's and conftest's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(conftest)


@pytest.fixture(scope="module")
def local_ray():
    connect_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The suite's shared tiny model and tokenizer (conftest); a test that trains takes tiny_model_copy."""
    return tiny_model


def fact_env(**settings) -> ToolEnv:
    return ToolEnv(list(FACT_TASKS), [FactLookup()], max_turns=3, **settings)


class HangingLookup(FactLookup):
    """A lookup that never comes back (a stuck search server, a deadlocked tool)."""

    def run_batch(self, calls):
        time.sleep(600)
        return [ToolResult(text="late") for _ in calls]


def hanging_env() -> ToolEnv:
    return ToolEnv(list(FACT_TASKS), [HangingLookup()], max_turns=3)


def _lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


SPECS = ["capital-france", "capital-japan", "melville-birthplace"]
TURNS = [_lookup("France"), _lookup("Japan"), "<answer>Paris</answer>"]


def _scripted_collector(tiny, envs, turns=TURNS, before_round=None) -> RolloutCollector:
    _, tokenizer = tiny
    config = RolloutConfig(max_context_tokens=100_000, show_progress=False)
    return RolloutCollector(envs, ScriptedBackend(tokenizer, turns, before_round), tokenizer, config)


def _records(trajectories):
    return [(t.prompt_ids, t.response_ids, t.loss_mask, t.sampling_logprobs, t.turn_rewards, t.outcome, t.group_id,
             t.info, t.episode) for t in trajectories]


def test_a_model_rollout_on_the_pool_equals_the_rollout_in_process(local_ray, tiny):
    model, tokenizer = tiny
    config = RolloutConfig(max_new_tokens=12, max_context_tokens=600, show_progress=False)
    local = RolloutCollector([fact_env() for _ in range(6)], TransformersBackend(model, tokenizer), tokenizer, config)
    with RayEnvPool([fact_env] * 6, num_workers=2, num_cpus=0.5) as pool:
        remote = RolloutCollector(pool, TransformersBackend(model, tokenizer), tokenizer, config)
        on_pool = remote.collect(SPECS, group_size=2, seed=3)
    in_process = local.collect(SPECS, group_size=2, seed=3)
    assert _records(on_pool) == _records(in_process)


def test_the_pool_sends_one_call_per_actor_per_turn(local_ray, tiny):
    with RayEnvPool([fact_env] * 6, num_workers=2, num_cpus=0.5) as pool:
        calls = []
        original = pool._call
        pool._call = lambda method, indices, arguments: calls.append((method, len(indices))) or original(
            method, indices, arguments)
        _scripted_collector(tiny, pool).collect(SPECS, group_size=2)
    # 6 episodes on 6 envs: one reset batch, then one step batch per round (3 rounds: two lookups, an answer).
    assert calls == [("reset_batch", 6), ("step_batch", 6), ("step_batch", 6), ("step_batch", 6)]


def test_each_call_of_the_pool_reaches_every_actor_once(local_ray):
    with RayEnvPool([fact_env] * 5, num_workers=2, num_cpus=0.5) as pool:
        refs_per_call = []
        original = ray.wait
        ray.wait = lambda refs, **kwargs: refs_per_call.append(len(refs)) or original(refs, **kwargs)
        try:
            pool.reset_batch(range(5), [{"options": {"task_id": "capital-france"}}] * 5)
            pool.step_batch(range(5), [_lookup("France")] * 5)
        finally:
            ray.wait = original
    assert refs_per_call == [2, 2]


def test_a_dead_worker_drops_its_episodes_and_the_rollout_goes_on(local_ray, tiny):
    with RayEnvPool([fact_env] * 6, num_workers=2, num_cpus=0.5) as pool:
        victim = pool.worker_pids()[0]
        collector = _scripted_collector(tiny, pool, before_round={1: lambda: os.kill(victim, signal.SIGKILL)})
        trajectories = collector.collect(SPECS, group_size=2)
        # Envs 0-2 lived in the killed actor: their three episodes are dropped, the other three finish.
        assert (len(trajectories), collector.dropped_episodes, pool.restarts) == (3, 3, 1)
        assert pool.worker_pids()[0] != victim
        assert all(t.episode.answer == "Paris" for t in trajectories)


def test_after_a_worker_died_the_next_rollout_is_whole(local_ray, tiny):
    with RayEnvPool([fact_env] * 6, num_workers=2, num_cpus=0.5) as pool:
        victim = pool.worker_pids()[1]
        _scripted_collector(tiny, pool, before_round={2: lambda: os.kill(victim, signal.SIGKILL)}).collect(SPECS, 2)
        collector = _scripted_collector(tiny, pool)
        trajectories = collector.collect(SPECS, group_size=2)
    assert (len(trajectories), collector.dropped_episodes) == (6, 0)


def test_a_step_that_hangs_past_the_timeout_drops_its_episodes_and_restarts_the_worker(local_ray, tiny):
    env_fns = [hanging_env] * 2 + [fact_env] * 2
    with RayEnvPool(env_fns, num_workers=2, num_cpus=0.5, step_timeout=2.0) as pool:
        collector = _scripted_collector(tiny, pool)
        trajectories = collector.collect(SPECS[:2], group_size=2)
        assert (len(trajectories), collector.dropped_episodes, pool.restarts) == (2, 2, 1)


def test_an_env_that_raises_in_a_worker_is_a_rollout_error_as_in_process(local_ray, tiny):
    with RayEnvPool([fact_env] * 2, num_workers=1, num_cpus=0.5) as pool:
        with pytest.raises(RolloutError, match="step"):
            pool.step_batch([0], ["no reset first"])  # stepping an env before reset breaks its contract


def test_a_shard_whose_envs_die_at_once_stops_the_pool_with_a_clear_error(local_ray, tiny):
    with RayEnvPool([fact_env] * 2, num_workers=1, num_cpus=0.5, max_failures_in_a_row=2) as pool:
        pool.reset_batch([0, 1], [{"options": {"task_id": "capital-france"}}] * 2)
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        pool.step_batch([0, 1], ["<answer>Paris</answer>"] * 2)  # lost, restarted
        pool.reset_batch([0, 1], [{"options": {"task_id": "capital-france"}}] * 2)
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        with pytest.raises(EnvPoolError, match="failed 2 times in a row"):
            pool.step_batch([0, 1], ["<answer>Paris</answer>"] * 2)


def test_a_pool_with_more_workers_than_envs_is_refused(local_ray):
    with pytest.raises(EnvPoolError, match="num_workers must be between 1 and the number of envs"):
        RayEnvPool([fact_env] * 2, num_workers=3)


@pytest.mark.slow
def test_the_trainer_trains_on_env_workers_and_logs_dropped_episodes(local_ray, tiny_model_copy, tmp_path):
    from agent_gym.distributed import ray_env_pool_factory
    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.config import TrainConfig
    from agent_gym.trainers.metrics import read_metrics
    from agent_gym.trainers.trainer import Trainer

    model, tokenizer = tiny_model_copy
    config = TrainConfig(model="tiny", env_id="unused", group_size=2, tasks_per_step=2, total_steps=1,
                         micro_batch_size=4, max_new_tokens=8, max_context_tokens=2000, eval_every=0,
                         output_dir=str(tmp_path), tensorboard=False, show_progress=False, device="cpu",
                         env_workers=2)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, env_fns=[fact_env] * 4,
                      make_envs=ray_env_pool_factory(config.env_workers))
    try:
        trainer.train()
    finally:
        trainer.close()
    assert read_metrics(tmp_path)[-1][m.DROPPED_EPISODES] == 0.0


def test_a_trainer_with_env_workers_but_no_pool_says_how_to_get_one(tiny_model_copy, tmp_path):
    from agent_gym.trainers.config import ConfigError, TrainConfig
    from agent_gym.trainers.trainer import Trainer

    model, tokenizer = tiny_model_copy
    config = TrainConfig(model="tiny", group_size=2, tasks_per_step=2, env_workers=2, device="cpu",
                         output_dir=str(tmp_path), tensorboard=False)
    with pytest.raises(ConfigError, match="ray_env_pool_factory"):
        Trainer(config, model=model, tokenizer=tokenizer, env_fns=[fact_env] * 4)


@pytest.mark.slow
def test_agent_gym_train_with_env_workers_runs_a_step_on_the_suite_env(local_ray, tiny_model_dir_for_synthhop,
                                                                       tmp_path):
    from conftest import SMALL_SYNTHHOP

    from agent_gym.cli import main
    from agent_gym.trainers.metrics import read_metrics

    status = main(["train", "--model", str(tiny_model_dir_for_synthhop), "--env", "AgentR1-SynthHop-v0",
                   "--env-kwargs", json.dumps(SMALL_SYNTHHOP), "--env-workers", "2", "--env-step-timeout", "120",
                   "--group-size", "2", "--tasks-per-step", "2", "--total-steps", "1", "--max-new-tokens", "8",
                   "--eval-every", "0", "--device", "cpu", "--no-tensorboard", "--no-show-progress",
                   "--output-dir", str(tmp_path / "run")])
    assert status == 0
    assert read_metrics(tmp_path / "run")[-1]["perf/dropped_episodes"] == 0.0


def test_after_a_restart_the_shards_other_envs_are_lost_until_reset(local_ray):
    with RayEnvPool([fact_env] * 2, num_workers=1, num_cpus=0.5) as pool:
        pool.reset_batch([0, 1], [{"options": {"task_id": "capital-france"}}] * 2)
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        assert isinstance(pool.step_batch([0], ["<answer>Paris</answer>"])[0], EnvLost)  # the call that met the death
        assert isinstance(pool.step_batch([1], ["<answer>Paris</answer>"])[0], EnvLost)  # its episode died with it
        pool.reset_batch([1], [{"options": {"task_id": "capital-france"}}])
        _, reward, terminated, _, _ = pool.step_batch([1], ["<answer>Paris</answer>"])[0]
    assert terminated and reward == 1.0


def _search(query: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': query}})}</tool_call>"


def test_every_worker_searches_through_one_shared_search_server(local_ray, tiny):
    # The fleet layout of the README: env actors in their own processes, one `index serve` URL for all of them.
    from test_search_server import CORPUS, CountingRetriever, TantivyTestRetriever, thread_server

    from agent_gym.retrieval_index.search_tool import SearchTool
    from agent_gym.retrieval_index.service.client import RemoteRetriever
    from agent_gym.tasks import Task

    tasks = [Task("seine", "Which river flows through the capital of France?", ("Seine",))]
    turns = [_search("capital of France"), _search("river Paris"), "<answer>Seine</answer>"]
    server = CountingRetriever(TantivyTestRetriever(CORPUS))
    with thread_server(lambda: server) as url:
        def make_env() -> ToolEnv:
            # A deadline far above the 5 s default: on a loaded machine an actor's first search can take longer,
            # and this test is about where searches go, not about how long they may take (test_search_server.py).
            return ToolEnv(tasks, [SearchTool(RemoteRetriever(url, total_timeout=120), top_k=2)], max_turns=4)

        warm_up = len(server.asked)  # the server's own warm-up query
        in_process = _scripted_collector(tiny, [make_env() for _ in range(4)], turns).collect(["seine"], group_size=4)
        asked_in_process = server.asked[warm_up:]
        with RayEnvPool([make_env] * 4, num_workers=2, num_cpus=0.5) as pool:
            on_pool = _scripted_collector(tiny, pool, turns).collect(["seine"], group_size=4)
        asked_on_pool = server.asked[warm_up + len(asked_in_process):]
    assert asked_in_process == ["capital of France"] * 4 + ["river Paris"] * 4
    assert sorted(asked_on_pool) == sorted(asked_in_process)  # both actors' searches reached the one server
    assert _records(on_pool) == _records(in_process)
    assert [t.episode.em for t in on_pool] == [1.0] * 4
