"""`RayEnvPool`: shards of envs in Ray actors, driven by the rollout collector as one `EnvBatch`.

Each actor (`EnvShard`) builds its shard's envs from their factories and holds them in a `LocalEnvBatch`, so
the envs of one shard share their tools (one retriever per actor process, or one `index serve` URL for all)
and their tool calls run as one batch. The pool sends **one call per actor per batch** (reset, step or
truncate of all the shard's envs named in it), never one call per env: measured here, SynthHop steps ran at
856/s through 4 actors called per env against 12,495/s in process, so per-env calls would cost more than the
model's generation.

Faults. A call that does not come back within ``step_timeout`` seconds, or whose actor died, loses the
envs of that call: they answer `EnvLost` (the collector drops their episodes and counts them), the actor is
killed and a fresh one is started from the same factories, and every other env of the shard answers `EnvLost`
until it is reset (its episode lived in the dead process). An env that *raises* is a broken contract, not a
fault: it raises `RolloutError`, as it does in process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_gym.distributed.ray_cluster import _import_ray
from agent_gym.env_batch import EnvLost, LocalEnvBatch, RolloutError
from agent_gym.error import AgentGymError

__all__ = ["EnvPoolError", "EnvShard", "RayEnvPool", "ray_env_pool_factory"]

EnvFactory = Callable[[], Any]


class EnvPoolError(AgentGymError, RuntimeError):
    """The env pool cannot run: bad settings, or a shard whose fresh actors keep failing."""


class EnvShard:
    """The Ray actor of one shard: its envs in a `LocalEnvBatch`, addressed by their index in the shard."""

    def __init__(self, env_fns: Sequence[EnvFactory]) -> None:
        import agent_gym  # noqa: F401  (registers the env ids in this worker process)

        self.batch = LocalEnvBatch([make() for make in env_fns])

    def ready(self) -> tuple[int, str, list[str]]:
        """This actor's pid, its node's id and its envs' class names, once they are built."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        return os.getpid(), node_id, [self.batch.env_name(index) for index in range(self.batch.num_envs)]

    def reset_batch(self, indices: list[int], kwargs: list[dict[str, Any]]) -> list[Any]:
        return self.batch.reset_batch(indices, kwargs)

    def step_batch(self, indices: list[int], actions: list[str]) -> list[Any]:
        return self.batch.step_batch(indices, actions)

    def truncate_batch(self, indices: list[int]) -> list[Any]:
        return self.batch.truncate_batch(indices)

    def close(self) -> None:
        self.batch.close()


@dataclass
class _Shard:
    env_fns: list[EnvFactory]
    first_index: int  # global index of the shard's first env
    actor: Any = None
    pid: int = -1
    node_id: str = ""
    failures_in_a_row: int = 0  # failed calls since the shard last answered a step


def _shard_sizes(num_envs: int, num_workers: int) -> list[int]:
    base, extra = divmod(num_envs, num_workers)
    return [base + (1 if worker < extra else 0) for worker in range(num_workers)]


class RayEnvPool:
    """``len(env_fns)`` envs in ``num_workers`` Ray actors, as one `EnvBatch` for `RolloutCollector`.

    Args:
        env_fns: one factory per env (cloudpickled to the actors: closures over an env id and its kwargs work).
        num_workers: actors; the envs are split into contiguous shards whose sizes differ by at most one.
        step_timeout: seconds a batch call may take before its actors count as hung (restarted, envs lost).
        num_cpus: logical CPUs each actor reserves (its envs step and call tools on it).
        startup_timeout: seconds an actor may take to build its envs.
        max_failures_in_a_row: a shard whose calls fail this many times with no step answered in between
            stops the pool with `EnvPoolError` (its envs die or hang at once, whatever the restarts).
        actor_options: more Ray actor options, e.g. ``{"scheduling_strategy": "SPREAD"}`` to put the actors on
            different nodes, or ``{"resources": {...}}`` to pin them to CPU nodes.

    Ray must be connected first (`agent_gym.distributed.connect_ray`).
    """

    def __init__(self, env_fns: Sequence[EnvFactory], num_workers: int, *, step_timeout: float = 60.0,
                 num_cpus: float = 1.0, startup_timeout: float = 300.0, max_failures_in_a_row: int = 3,
                 actor_options: Mapping[str, Any] | None = None) -> None:
        env_fns = list(env_fns)
        if not env_fns:
            raise EnvPoolError("RayEnvPool needs at least one env factory")
        if not 1 <= num_workers <= len(env_fns):
            raise EnvPoolError(f"num_workers must be between 1 and the number of envs ({len(env_fns)}), "
                               f"got {num_workers}")
        if step_timeout <= 0 or startup_timeout <= 0 or max_failures_in_a_row < 1 or num_cpus < 0:
            raise EnvPoolError("need step_timeout > 0, startup_timeout > 0, num_cpus >= 0, "
                               f"max_failures_in_a_row >= 1; got {step_timeout}, {startup_timeout}, {num_cpus}, "
                               f"{max_failures_in_a_row}")
        self._ray = _import_ray()
        if not self._ray.is_initialized():
            raise EnvPoolError("Ray is not connected: call agent_gym.distributed.connect_ray() first")
        self.step_timeout = step_timeout
        self.startup_timeout = startup_timeout
        self.max_failures_in_a_row = max_failures_in_a_row
        options = {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 1, **(actor_options or {})}
        self._actor_class = self._ray.remote(EnvShard).options(**options)
        self._shards: list[_Shard] = []
        self._where: list[tuple[int, int]] = []  # global index -> (shard, index in the shard)
        start = 0
        for shard_id, size in enumerate(_shard_sizes(len(env_fns), num_workers)):
            self._shards.append(_Shard(env_fns[start : start + size], start))
            self._where.extend((shard_id, local) for local in range(size))
            start += size
        self._names = [""] * len(env_fns)
        self._stale: set[int] = set()  # envs of a restarted shard, lost until their next reset
        self.restarts = 0  # actors restarted after a fault, over the pool's life
        self.lost_envs = 0  # env answers that were EnvLost
        self._closed = False
        try:
            self._start_actors(list(range(len(self._shards))))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------------ actors

    @property
    def num_envs(self) -> int:
        return len(self._where)

    @property
    def num_workers(self) -> int:
        return len(self._shards)

    def worker_pids(self) -> list[int]:
        """The process id of each shard's actor (on its node)."""
        return [shard.pid for shard in self._shards]

    def worker_nodes(self) -> list[str]:
        """The Ray node id of each shard's actor."""
        return [shard.node_id for shard in self._shards]

    def _start_actors(self, shard_ids: Sequence[int]) -> None:
        ray = self._ray
        for shard_id in shard_ids:
            self._shards[shard_id].actor = self._actor_class.remote(self._shards[shard_id].env_fns)
        refs = [self._shards[shard_id].actor.ready.remote() for shard_id in shard_ids]
        try:
            answers = ray.get(refs, timeout=self.startup_timeout)
        except ray.exceptions.GetTimeoutError as error:
            raise EnvPoolError(f"env workers {list(shard_ids)} did not build their envs within "
                               f"{self.startup_timeout:g} s (startup_timeout)") from error
        except ray.exceptions.RayError as error:
            raise EnvPoolError(f"an env worker failed to build its envs: {error}") from error
        for shard_id, (pid, node_id, names) in zip(shard_ids, answers, strict=True):
            shard = self._shards[shard_id]
            shard.pid, shard.node_id = pid, node_id
            for local, name in enumerate(names):
                self._names[shard.first_index + local] = name

    def _restart(self, shard_id: int) -> None:
        """Kill the shard's actor and start a fresh one; its envs are lost until reset."""
        shard = self._shards[shard_id]
        shard.failures_in_a_row += 1
        if shard.failures_in_a_row >= self.max_failures_in_a_row:
            raise EnvPoolError(f"env worker {shard_id} failed {shard.failures_in_a_row} times in a row; its envs "
                               "die or hang at once (see the worker's log above), so the pool stops")
        try:
            self._ray.kill(shard.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - an actor that is already gone is what we want
            pass
        self.restarts += 1
        self._stale.update(range(shard.first_index, shard.first_index + len(shard.env_fns)))
        self._start_actors([shard_id])

    # ------------------------------------------------------------------------------------------ EnvBatch

    def reset_batch(self, indices: Sequence[int], kwargs: Sequence[Mapping[str, Any]]) -> list[Any]:
        self._stale.difference_update(indices)  # a reset starts afresh, on a restarted actor too
        return self._call("reset_batch", indices, [dict(options) for options in kwargs])

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[Any]:
        return self._call("step_batch", indices, list(actions))

    def truncate_batch(self, indices: Sequence[int]) -> list[Any]:
        return self._call("truncate_batch", indices, None)

    def env_name(self, index: int) -> str:
        return self._names[index]

    def _call(self, method: str, indices: Sequence[int], arguments: list[Any] | None) -> list[Any]:
        """One `method` call per shard named in `indices`; `EnvLost` for stale envs and for failed shards."""
        if self._closed:
            raise EnvPoolError("the env pool is closed")
        ray = self._ray
        results: dict[int, Any] = {}
        calls: dict[int, tuple[list[int], list[int], list[Any]]] = {}  # shard -> (global, local, arguments)
        for position, index in enumerate(indices):
            if index in self._stale:
                results[index] = EnvLost("its env worker was restarted after a fault; reset it first")
                continue
            shard_id, local = self._where[index]
            globals_, locals_, args = calls.setdefault(shard_id, ([], [], []))
            globals_.append(index)
            locals_.append(local)
            if arguments is not None:
                args.append(arguments[position])
        refs = {}
        for shard_id, (_, locals_, args) in calls.items():
            remote_method = getattr(self._shards[shard_id].actor, method)
            refs[shard_id] = remote_method.remote(locals_, args) if arguments is not None else \
                remote_method.remote(locals_)
        deadline = time.monotonic() + self.step_timeout
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.step_timeout)
        for shard_id, ref in refs.items():
            globals_ = calls[shard_id][0]
            try:
                answers = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                reason = f"env worker {shard_id} did not answer {method} within {self.step_timeout:g} s"
            except ray.exceptions.RayActorError as error:
                reason = f"env worker {shard_id} died during {method} ({type(error).__name__})"
            except ray.exceptions.RayTaskError as error:  # an env raised: a broken contract, as in process
                cause = getattr(error, "cause", None) or error
                raise RolloutError(f"env worker {shard_id}, {method}: {cause}") from error
            else:
                if method == "step_batch":  # a shard is healthy again once its envs step, not merely reset
                    self._shards[shard_id].failures_in_a_row = 0
                results.update(zip(globals_, answers, strict=True))
                continue
            self.lost_envs += len(globals_)
            results.update((index, EnvLost(reason)) for index in globals_)
            self._restart(shard_id)
        return [results[index] for index in indices]

    def close(self) -> None:
        """Close the envs and end the actors (idempotent)."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        actors = [shard.actor for shard in self._shards if shard.actor is not None]
        try:
            ray.get([actor.close.remote() for actor in actors], timeout=10)
        except Exception:  # noqa: BLE001 - a dead or hung actor is killed below anyway
            pass
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def ray_env_pool_factory(num_workers: int, address: str | None = None,
                         step_timeout: float = 60.0) -> Callable[[Sequence[EnvFactory]], RayEnvPool]:
    """Connect to Ray (a local cluster when ``address`` is None) and return ``env_fns -> RayEnvPool``, the
    trainer's ``make_envs`` hook: each of its collectors (training, eval) gets a pool of ``num_workers`` actors
    (fewer when it has fewer envs).

    A local cluster gets ``max(cores, 2 * num_workers)`` logical CPUs, one per actor of both pools: env actors
    mostly wait for the model, so they may outnumber the cores.
    """
    from agent_gym.distributed.ray_cluster import connect_ray

    connect_ray(address, num_cpus=None if address else max(os.cpu_count() or 1, 2 * num_workers))

    def make_pool(env_fns: Sequence[EnvFactory]) -> RayEnvPool:
        return RayEnvPool(env_fns, min(num_workers, len(env_fns)), step_timeout=step_timeout)

    return make_pool
